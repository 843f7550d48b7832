"""Decompression bombs: small inputs that inflate to far more than they weigh.

Parquet: a file of a few hundred KB whose rows name one large dictionary value inflates to most of a
GiB when decoded whole; the job's Parquet reader expands a slice of rows at a time, sizes what a
dictionary holds before expanding it, and refuses a row group whose footer says it inflates past the
cap a row. Every row is accounted for (a document or a counted reject). Memory is measured as the
peak resident size of a child process that reads the file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.job.inputs import Doc, ReadOptions, Reject, read_file, resolve_inputs

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20
CHILD = """
import json, resource, sys
from pipeline.job.inputs import Doc, ReadOptions, read_file, resolve_inputs
[item] = resolve_inputs([sys.argv[1]])
docs = rejects = 0
kinds = {}
for record in read_file(item, ReadOptions(max_doc_bytes=int(sys.argv[2]))):
    if isinstance(record, Doc):
        docs += 1
    else:
        rejects += record.count
        kinds[record.kind] = kinds.get(record.kind, 0) + record.count
print(json.dumps({"docs": docs, "rejects": rejects, "kinds": kinds,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def read_in_child(path: Path, max_doc_bytes: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(max_doc_bytes)], cwd=REPO,
                          capture_output=True, text=True, timeout=600, check=True)
    return json.loads(done.stdout)


def dictionary_bomb(path: Path, rows: int, value_bytes: int, column: str) -> None:
    """``rows`` rows whose ``column`` is one ``value_bytes`` value, stored once in a dictionary page."""
    value = pa.array(["x" * value_bytes])
    bomb = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), value)
    small = pa.array([f"document {i}" for i in range(rows)])
    table = pa.table({"text": bomb if column == "text" else small, "url": bomb if column == "url" else small})
    pq.write_table(table, path, compression="zstd", row_group_size=rows)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(rows=st.integers(600, 1000), value_kib=st.sampled_from([768, 1024]), column=st.sampled_from(["text", "url"]))
def test_a_parquet_dictionary_bomb_is_read_in_bounded_memory(tmp_path_factory: pytest.TempPathFactory, rows: int,
                                                             value_kib: int, column: str) -> None:
    path = tmp_path_factory.mktemp("bomb") / "bomb.parquet"
    dictionary_bomb(path, rows, value_kib * 1024, column)
    inflated_mb = rows * value_kib / 1024
    assert path.stat().st_size < MiB and inflated_mb >= 450  # a small file, a large inflation
    result = read_in_child(path, max_doc_bytes=2 * MiB)
    assert result["docs"] + result["rejects"] == rows  # every row accounted for
    assert result["peak_mb"] < 350, (result, inflated_mb)


def test_a_text_over_the_cap_is_rejected_from_its_length(tmp_path: Path) -> None:
    path = tmp_path / "bomb.parquet"
    dictionary_bomb(path, 50, 3 * MiB, "text")
    [item] = resolve_inputs([str(path)])
    records = list(read_file(item, ReadOptions(max_doc_bytes=MiB)))
    assert [(r.kind, r.position, r.reason) for r in records] == [
        ("over_size_cap", f"row {i}", f"over the size cap ({3 * MiB} > {MiB} bytes)") for i in range(50)]


def test_a_row_group_that_inflates_past_the_cap_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "plain.parquet"
    texts = ["y" * (3 * MiB) + str(i) for i in range(4)]
    pq.write_table(pa.table({"text": texts}), path, compression="zstd", use_dictionary=False)
    [item] = resolve_inputs([str(path)])
    records = list(read_file(item, ReadOptions(max_doc_bytes=128 << 10)))  # a row may inflate to 1 MiB
    [reject] = records
    assert isinstance(reject, Reject) and (reject.kind, reject.count, reject.position) == (
        "over_size_cap", 4, "row group 0 (rows 0-3)")
    assert "not read" in reject.reason


def test_ordinary_rows_read_as_before(tmp_path: Path) -> None:
    path = tmp_path / "ok.parquet"
    texts = [f"document {i} " * (i % 50 + 1) for i in range(3000)]
    pq.write_table(pa.table({"text": texts, "url": [f"https://x.example/{i % 7}" for i in range(3000)]}), path,
                   row_group_size=1000)
    [item] = resolve_inputs([str(path)])
    records = list(read_file(item, ReadOptions(max_doc_bytes=4096)))
    assert [r.text for r in records if isinstance(r, Doc)] == texts
    assert [r.url for r in records] == [f"https://x.example/{i % 7}" for i in range(3000)]
