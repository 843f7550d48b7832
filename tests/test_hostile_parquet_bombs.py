"""Parquet bombs: small files that inflate to far more than they weigh.

A file of a few KB whose rows name one large dictionary value inflates to most of a GiB when its row
groups are decoded whole; the job's Parquet reader keeps dictionaries as dictionaries, sizes each row
from its values' lengths, expands a slice of at most --max-doc-bytes at a time and refuses a row group
whose footer says it inflates past the cap a row. Every row is accounted for (a document or a counted
reject) and the input's own columns still pass through. Memory is the peak resident size (VmHWM) of a
child process that reads the file. The read stage's batches of documents count what each document
carries besides its text, so small texts with large fields (Parquet or compressed JSONL) make small
batches.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gristmill.pipeline.job.inputs import Doc, ReadOptions, Reject, read_file, resolve_inputs
from gristmill.pipeline.job.inputs.records import Piece
from gristmill.pipeline.job.read import BATCH_BYTES, _document_batches

MiB = 1 << 20
BOMB_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)  # shrinking a bomb reads it hundreds of times
CHILD = r"""
import json, re, sys
from gristmill.pipeline.job.inputs import Doc, ReadOptions, read_file, resolve_inputs
[item] = resolve_inputs([sys.argv[1]])
docs = rejects = 0
kinds = {}
for record in read_file(item, ReadOptions(max_doc_bytes=int(sys.argv[2]))):
    if isinstance(record, Doc):
        docs += 1
    else:
        rejects += record.count
        kinds[record.kind] = kinds.get(record.kind, 0) + record.count
# VmHWM, not getrusage: ru_maxrss survives exec, so it would report the parent's peak
peak_kib = int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1))
print(json.dumps({"docs": docs, "rejects": rejects, "kinds": kinds, "peak_mb": peak_kib / 1024}))
"""


def read_in_child(path: Path, max_doc_bytes: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(max_doc_bytes)], cwd=path.parent,
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def dictionary_bomb(path: Path, rows: int, value_bytes: int, column: str) -> None:
    """``rows`` rows whose ``column`` is one ``value_bytes`` value (``tags``: a list of it twice), stored
    once in a dictionary page; the file weighs a few KB. Written from a dictionary without the Arrow
    schema, so the file says plain strings, as other writers' files do, and nothing is expanded here."""
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array(["x" * value_bytes]))
    small = pa.array([f"document {i}" for i in range(rows)])
    table = pa.table({"text": bomb if column == "text" else small, "url": bomb if column == "url" else small,
                      "meta": bomb if column == "meta" else small})
    if column == "tags":
        twice = pa.DictionaryArray.from_arrays(pa.array([0] * (2 * rows), pa.int32()), bomb.dictionary)
        table = table.append_column("tags", pa.ListArray.from_arrays(pa.array(range(0, 2 * rows + 1, 2), pa.int32()),
                                                                     twice))
    pq.write_table(table, path, compression="zstd", row_group_size=rows, store_schema=False)


@pytest.mark.parametrize("column", ["text", "url", "meta", "tags"])
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck), phases=BOMB_PHASES)
@given(rows=st.integers(500, 800), value_kib=st.sampled_from([768, 1024]))
def test_a_parquet_dictionary_bomb_is_read_in_bounded_memory(tmp_path_factory: pytest.TempPathFactory, column: str,
                                                             rows: int, value_kib: int) -> None:
    path = tmp_path_factory.mktemp("bomb") / "bomb.parquet"
    dictionary_bomb(path, rows, value_kib * 1024, column)
    inflated_mb = rows * value_kib / 1024 * (2 if column == "tags" else 1)
    assert path.stat().st_size < 64 * 1024 and inflated_mb >= 375  # a small file, a large inflation
    result = read_in_child(path, max_doc_bytes=3 * MiB)
    assert result["docs"] + result["rejects"] == rows, result  # every row accounted for
    assert result["docs"] == rows, result  # each row is within the cap: a document
    assert result["peak_mb"] < 300, (result, inflated_mb)


def _batch_sizes(urls: list[str]) -> list[int]:
    """The documents per batch the read stage holds for ``urls`` (a 10 MiB cap); no record rejected."""
    config = SimpleNamespace(text_column="text", id_column="id", max_doc_bytes=10 * MiB, storage_options=None)
    job = SimpleNamespace(config=config, preference=SimpleNamespace(input_column=None))
    split = SimpleNamespace(pieces=[Piece(item) for item in resolve_inputs(urls)])
    rejects: list = []
    batches = [len(batch) for batch in _document_batches(job, split, rejects)]
    assert not rejects
    return batches


def test_the_job_holds_a_bounded_batch_of_a_bomb(tmp_path: Path) -> None:
    """The read stage gathers documents into batches: a batch of small texts that each carry a 1 MiB
    URL and column holds a few of them, not the file's gigabyte."""
    path = tmp_path / "bomb.parquet"
    dictionary_bomb(path, 300, MiB, "url")
    dictionary_bomb(tmp_path / "meta.parquet", 300, MiB, "meta")
    batches = _batch_sizes([str(path), str(tmp_path / "meta.parquet")])
    assert sum(batches) == 600
    assert max(batches) <= BATCH_BYTES // MiB + 1, batches


def test_the_job_holds_a_bounded_batch_of_a_compressed_jsonl_bomb(tmp_path: Path) -> None:
    """The same for JSONL: a 300 KB gzip file of short texts that each carry a 1 MiB field."""
    path = tmp_path / "bomb.jsonl.gz"
    line = json.dumps({"text": "short text {}", "meta": "m" * MiB})
    path.write_bytes(gzip.compress("".join(line.replace("{}", str(i)) + "\n" for i in range(300)).encode()))
    assert path.stat().st_size < MiB
    batches = _batch_sizes([str(path)])
    assert sum(batches) == 300
    assert max(batches) <= BATCH_BYTES // MiB + 1, batches


def test_a_text_over_the_cap_is_rejected_from_its_length(tmp_path: Path) -> None:
    path = tmp_path / "bomb.parquet"
    dictionary_bomb(path, 50, 3 * MiB, "text")
    [item] = resolve_inputs([str(path)])
    records = list(read_file(item, ReadOptions(max_doc_bytes=MiB)))
    assert [(r.kind, r.position, r.reason) for r in records] == [
        ("over_size_cap", f"row {i}", f"over the size cap ({3 * MiB} > {MiB} bytes)") for i in range(50)]


def test_a_row_whose_side_columns_pass_the_cap_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "bomb.parquet"
    dictionary_bomb(path, 20, 3 * MiB, "meta")
    [item] = resolve_inputs([str(path)])
    records = list(read_file(item, ReadOptions(max_doc_bytes=256 << 10)))  # 2 MiB a row at most
    assert len(records) == 20 and all(isinstance(r, Reject) and r.kind == "over_size_cap" for r in records)
    assert re.fullmatch(r"its columns hold \d+ bytes, over the cap of 2097152 bytes a row \(8 x --max-doc-bytes\)",
                        records[0].reason)


def test_a_row_group_that_inflates_past_the_cap_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "plain.parquet"
    texts = ["y" * (3 * MiB) + str(i) for i in range(4)]
    pq.write_table(pa.table({"text": texts}), path, compression="zstd", use_dictionary=False)
    [item] = resolve_inputs([str(path)])
    [reject] = list(read_file(item, ReadOptions(max_doc_bytes=128 << 10)))  # a row may inflate to 1 MiB
    assert isinstance(reject, Reject) and (reject.kind, reject.count, reject.position) == (
        "over_size_cap", 4, "row group 0 (rows 0-3)")
    assert reject.reason.endswith("(8 x --max-doc-bytes); not read")


def test_an_empty_row_group_is_no_reject(tmp_path: Path) -> None:
    path = tmp_path / "empty-group.parquet"
    table = pa.table({"text": ["one", "two"]})
    with pq.ParquetWriter(path, table.schema) as writer:
        writer.write_table(table.slice(0, 0))  # a row group of no rows, before the real one
        writer.write_table(table)
    [item] = resolve_inputs([str(path)])
    assert [(type(r).__name__, r.position) for r in read_file(item, ReadOptions())] == [("Doc", "row 0"),
                                                                                        ("Doc", "row 1")]


# -- generated files: every row accounted for, texts and the input's own columns as written ----------
_texts = st.one_of(st.none(), st.text(max_size=40), st.integers(0, 3000).map(lambda n: "z" * n))
_side = {
    "score": st.one_of(st.none(), st.integers(-(2**40), 2**40)),
    "note": st.one_of(st.none(), st.text(max_size=30), st.integers(0, 3000).map(lambda n: "n" * n)),
    "tags": st.one_of(st.none(), st.lists(st.one_of(st.none(), st.sampled_from(["a", "b" * 900, ""])), max_size=4)),
    "info": st.one_of(st.none(), st.fixed_dictionaries({"k": st.one_of(st.none(), st.text(max_size=8)),
                                                        "n": st.integers(0, 9)})),
}
_types = {"score": pa.int64(), "note": pa.string(), "tags": pa.list_(pa.string()),
          "info": pa.struct([("k", pa.string()), ("n", pa.int64())])}


@st.composite
def hostile_tables(draw: st.DrawFn) -> tuple[pa.Table, int, bool]:
    rows = draw(st.integers(1, 40))
    names = draw(st.lists(st.sampled_from(sorted(_side)), unique=True))
    columns = {"text": pa.array([draw(_texts) for _ in range(rows)], pa.string())}
    for name in names:
        columns[name] = pa.array([draw(_side[name]) for _ in range(rows)], _types[name])
    if draw(st.booleans()):  # a column stored as an Arrow dictionary
        columns["kind"] = pa.array([draw(st.sampled_from(["p", "q" * 2000])) for _ in range(rows)]).dictionary_encode()
    return pa.table(columns), draw(st.integers(1, 12)), draw(st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=hostile_tables(), cap=st.sampled_from([64, 700, 2500, 1 << 20]))
def test_generated_files_keep_every_row_and_column(tmp_path_factory: pytest.TempPathFactory,
                                                   drawn: tuple[pa.Table, int, bool], cap: int) -> None:
    table, group_rows, dictionary = drawn
    path = tmp_path_factory.mktemp("gen") / "gen.parquet"
    pq.write_table(table, path, row_group_size=group_rows, use_dictionary=dictionary)
    [item] = resolve_inputs([str(path)])
    records = list(read_file(item, ReadOptions(max_doc_bytes=cap)))
    seen: dict[int, Doc | Reject] = {}
    for record in records:
        match = re.fullmatch(r"row (\d+)", record.position)
        assert match, record  # a row group is refused only past 8 x the cap a row, not here
        assert int(match.group(1)) not in seen
        seen[int(match.group(1))] = record
    assert sorted(seen) == list(range(table.num_rows))  # every row once
    original = table.to_pylist()
    for row, record in seen.items():
        text = original[row]["text"]
        if isinstance(record, Doc):
            assert record.text == text
            carried = {k: v for k, v in original[row].items() if k != "text"}
            got = record.extra.table.slice(record.extra.row, 1).to_pylist()[0] if record.extra else {}
            assert got == carried
            assert record.extra is None or record.extra.table.schema.equals(table.schema.remove(0))
        else:
            assert record.kind in ("empty", "over_size_cap"), record
            if record.kind == "over_size_cap":
                assert len(text.encode()) > cap or "its columns hold" in record.reason
            else:
                assert not (text or "").strip()
