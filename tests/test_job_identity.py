"""A job is identified by its inputs' content, not their path and size (issue 27): an input rewritten
in place with the same length is a different job, on a local disk (mtime, inode), on moto's S3 (ETag)
and as a corpus shard (its checksum); a rerun with --overwrite writes the new text."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job import DedupConfig, DedupError, run_dedup
from gristmill.pipeline.job.config import index_params
from gristmill.pipeline.job.inputs import plan_splits, resolve_inputs
from gristmill.pipeline.job.plan import job_fingerprint

pytestmark = pytest.mark.timeout(300)


def _fingerprint(url: str, options: dict | None = None) -> str:
    config = DedupConfig(inputs=[url], output="unused", storage_options=options or {})
    splits = plan_splits(resolve_inputs([url], options), config.split_bytes)
    return job_fingerprint(config, index_params(config), splits, [])


def _line(text: str) -> bytes:
    return (json.dumps({"id": "d", "text": text}) + "\n").encode()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pair=st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=60).flatmap(
    lambda old: st.tuples(st.just(old), st.text(st.characters(codec="ascii", categories=["L", "N"]),
                                                min_size=len(old), max_size=len(old)))))
def test_a_same_length_rewrite_changes_the_fingerprint_on_a_local_disk(tmp_path: Path, pair: tuple[str, str]) -> None:
    old, new = pair
    path = tmp_path / "in.jsonl"
    path.write_bytes(_line(old))
    before = _fingerprint(str(path))
    assert _fingerprint(str(path)) == before  # unchanged input: the same job (resume keeps working)
    stat = path.stat()
    with open(path, "r+b") as handle:  # rewritten in place, the same length
        handle.write(_line(new))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # 1 ns later: a coarse clock's rewrite
    assert path.stat().st_size == stat.st_size
    assert _fingerprint(str(path)) != before


def test_a_same_length_rewrite_on_s3_changes_the_fingerprint(s3_bucket: str, s3_server: dict) -> None:
    import s3fs

    options = s3_server["storage_options"]
    fs = s3fs.S3FileSystem(**options)
    url = f"{s3_bucket}/raw/in.jsonl"
    fs.pipe_file(url, _line("alpha"))
    before = _fingerprint(url, options)
    assert _fingerprint(url, options) == before
    fs.pipe_file(url, _line("gamma"))
    fs.invalidate_cache()
    assert _fingerprint(url, options) != before


def test_a_rewritten_input_is_refused_as_another_job_and_overwrite_writes_the_new_text(
        ray_local: None, tmp_path: Path) -> None:
    path, out = tmp_path / "in.jsonl", tmp_path / "out"
    texts = [f"document number {i} about rivers and hills and the weather in spring" for i in range(20)]
    path.write_bytes(b"".join(_line(t) for t in texts))
    run_dedup(DedupConfig(inputs=[str(path)], output=str(out), num_partitions=2))
    rewritten = [t.replace("rivers", "forest") for t in texts]  # same length
    size = path.stat().st_size
    path.write_bytes(b"".join(_line(t) for t in rewritten))
    assert path.stat().st_size == size
    with pytest.raises(DedupError, match="different job"):  # not the old corpus returned as if current
        run_dedup(DedupConfig(inputs=[str(path)], output=str(out), num_partitions=2))
    run_dedup(DedupConfig(inputs=[str(path)], output=str(out), num_partitions=2, overwrite=True))
    assert sorted(Corpus.open(str(out)).to_table(["text"])["text"].to_pylist()) == sorted(rewritten)


def test_a_corpus_shard_input_is_identified_by_its_checksum(ray_local: None, tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(_line(f"text {i} of the first corpus, with words") for i in range(5)))
    run_dedup(DedupConfig(inputs=[str(path)], output=str(tmp_path / "c"), num_partitions=2))
    files = resolve_inputs([str(tmp_path / "c")])
    shards = {s.path: s.checksum for s in Corpus.open(str(tmp_path / "c")).shards}
    assert [f.version for f in files] == [shards[os.path.basename(f.url)] for f in files]
