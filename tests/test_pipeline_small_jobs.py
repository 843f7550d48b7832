"""A small job runs without Ray: its tasks are called in the driver's process, one after another, and
write the same bytes as Ray's tasks do (docs/PIPELINE.md, small jobs).

The in-process run happens in a fresh interpreter where ``import ray`` fails, so it provably neither
starts nor imports Ray; the Ray run is this process's, on a real local Ray (the ``ray_local`` fixture).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_pipeline_data import documents, write_jsonl

from gristmill.pipeline.job import DedupConfig, run_dedup
from gristmill.pipeline.job.driver import IN_PROCESS_BYTES

pytestmark = pytest.mark.timeout(300)
WITHOUT_RAY = """
import importlib.abc, json, sys
class NoRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "ray":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoRay())
from gristmill.pipeline.job import DedupConfig, run_dedup
inputs, output, removed = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
stats = run_dedup(DedupConfig(inputs=inputs, output=output, removed=removed, num_partitions=3))
print(json.dumps(stats["documents"]))
"""


def _inputs(folder: Path) -> list[str]:
    """Near and exact copies, across a JSONL file and a Parquet file with a column of its own."""
    folder.mkdir()
    texts = documents(24)
    write_jsonl(folder / "a.jsonl", texts[: len(texts) // 2], prefix="a")
    rest = texts[len(texts) // 2:]
    pq.write_table(pa.table({"text": rest, "quality": [i % 5 for i in range(len(rest))]}), folder / "b.parquet")
    return [str(folder / "a.jsonl"), str(folder / "b.parquet")]


def _files(corpus: Path) -> dict[str, bytes]:
    """A corpus's files by name, the manifest without what differs between any two runs (times, the
    output's own name, the random name of its block table)."""
    files = {str(p.relative_to(corpus)): p.read_bytes() for p in corpus.rglob("*") if p.is_file()
             and p.name != "_manifest.json" and not p.parent.name == "_blocks"}
    manifest = json.loads((corpus / "_manifest.json").read_text())
    manifest.pop("created"), manifest.pop("blocks")
    for key in ("wall_seconds", "stage_seconds"):
        manifest["stats"].pop(key)
    files["_manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    blocks = [pq.read_table(p) for p in (corpus / "_blocks").glob("*.parquet")]
    files["_blocks"] = b"".join(str(t.to_pylist()).encode() for t in blocks)
    return files


def test_a_small_job_writes_without_ray_the_bytes_ray_writes(tmp_path: Path, ray_local: None) -> None:
    inputs = _inputs(tmp_path / "in")
    assert sum(Path(i).stat().st_size for i in inputs) <= IN_PROCESS_BYTES
    output, removed = tmp_path / "out", tmp_path / "removed"  # in the job's fingerprint: the same for both runs
    done = subprocess.run([sys.executable, "-c", WITHOUT_RAY, json.dumps(inputs), str(output), str(removed)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    here = {"out": _files(output), "removed": _files(removed)}
    shutil.rmtree(output), shutil.rmtree(removed)
    stats = run_dedup(DedupConfig(inputs=inputs, output=str(output), removed=str(removed), num_partitions=3))
    documents = stats["documents"]  # Ray is up in this process: the job used it
    assert json.loads(done.stdout) == documents and 0 < documents["kept"] < documents["input"]
    assert documents["exact_duplicate"] and documents["near_duplicate"]
    assert here == {"out": _files(output), "removed": _files(removed)}
