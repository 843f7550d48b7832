"""Files a replaced manifest listed are retired, then reclaimed (pipeline/format/gc.py): the grace
period, `gristmill gc` and its output, and hostile `_retired.json` ledgers, generated with hypothesis."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gristmill.pipeline.cli import main
from gristmill.pipeline.format import CORPUS_SCHEMA, Corpus, ShardWriter, retire_unlisted
from gristmill.pipeline.format.gc import GRACE_SECONDS, RETIRED_NAME

OLD = "part-00000-oldrun-00000.parquet"


def _corpus(folder: Path) -> Corpus:
    """A committed corpus of one row, plus a shard of an earlier commit it no longer lists."""
    writer = ShardWriter(str(folder), CORPUS_SCHEMA)
    writer.write(pa.Table.from_pylist([{"id": "a", "text": "kept"}], schema=CORPUS_SCHEMA))
    writer.commit()
    (folder / OLD).write_bytes(b"x" * 1000)
    return Corpus.open(str(folder))


def test_an_unlisted_shard_stays_through_the_grace_period_then_gc_reclaims_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = _corpus(tmp_path)
    (tmp_path / "part-00001-x.parquet.tmp-1234").write_bytes(b"half")  # a crashed writer's: never listed
    result = retire_unlisted(str(tmp_path), corpus.manifest)
    assert set(result.retired) == {OLD} and set(result.removed) == {"part-00001-x.parquet.tmp-1234"}
    assert (tmp_path / OLD).exists()
    assert retire_unlisted(str(tmp_path), corpus.manifest).removed == {}  # a second commit soon after keeps it
    assert main(["gc", str(tmp_path)]) == 0  # within the grace period: nothing removed
    assert (tmp_path / OLD).exists() and "kept 1 files" in capsys.readouterr().out
    assert main(["gc", str(tmp_path), "--now"]) == 0
    out = capsys.readouterr().out
    assert f"removed  {OLD}" in out and "(1,000 bytes) in 1 files" in out
    assert not (tmp_path / OLD).exists() and not (tmp_path / RETIRED_NAME).exists()
    assert all(r.ok for r in Corpus.open(str(tmp_path)).verify())


def test_a_file_retired_longer_than_the_grace_period_goes_at_the_next_commit(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path)
    (tmp_path / RETIRED_NAME).write_text(json.dumps({"retired": {OLD: time.time() - GRACE_SECONDS - 1}}))
    assert retire_unlisted(str(tmp_path), corpus.manifest).removed == {OLD: 1000}


def test_gc_is_refused_while_a_job_holds_the_lease(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gristmill.pipeline.format import Lease

    _corpus(tmp_path)
    lease = Lease(str(tmp_path), "writing-job")
    lease.acquire()
    try:
        assert main(["gc", str(tmp_path), "--now"]) == 2
        assert "being written by another job writing-job" in capsys.readouterr().err
        assert (tmp_path / OLD).exists()
    finally:
        lease.release()


_TIMES = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**80), 2**80), st.text(max_size=4),
                   st.none(), st.booleans(), st.lists(st.integers(), max_size=2))
_LEDGERS = st.one_of(
    st.binary(max_size=100),
    st.builds(lambda entries: json.dumps({"retired": entries}).encode(),
              st.dictionaries(st.sampled_from([OLD, "_manifest.json", "notes.txt", "../x", "part-9.parquet"]), _TIMES)),
    st.builds(lambda value: json.dumps(value).encode(), st.one_of(st.lists(st.integers()), st.integers(), st.none())),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ledger=_LEDGERS)
@example(ledger=json.dumps({"retired": {OLD: float("-inf")}}).encode())  # would read as retired forever ago
@example(ledger=json.dumps({"retired": {"": None, OLD: 4e9}}).encode())  # junk beside a future time: rewritten
@example(ledger=json.dumps({"retired": {OLD: -1e308}}).encode())  # finite, long ago: removed (CI found the oracle off)
def test_a_hostile_ledger_never_crashes_and_never_removes_a_file_early(tmp_path: Path, ledger: bytes) -> None:
    folder = tmp_path / f"c{time.time_ns()}"
    corpus = _corpus(folder)
    (folder / "notes.txt").write_text("mine")
    (folder / RETIRED_NAME).write_bytes(ledger)
    try:
        since = json.loads(ledger)["retired"][OLD]
        old_enough = type(since) in (int, float) and math.isfinite(since) and since <= time.time() - GRACE_SECONDS
    except (ValueError, KeyError, TypeError):
        old_enough = False
    result = retire_unlisted(str(folder), corpus.manifest)
    assert (OLD in result.removed) == old_enough and (folder / OLD).exists() != old_enough
    assert (folder / "notes.txt").read_text() == "mine" and all(r.ok for r in Corpus.open(str(folder)).verify())
    if not old_enough:
        assert json.loads((folder / RETIRED_NAME).read_text())["retired"].keys() == {OLD}
