"""Resume: the driver of ``gristmill dedup`` is SIGKILLed in two different stages; rerunning the same
command skips the finished work and writes the same corpus, byte for byte, as an uninterrupted run.

The drivers connect to one local Ray started by the test (``--ray-address``), as a driver on a
cluster would; killing a driver's process session kills only that driver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sessions import kill_session
from test_pipeline_data import documents, write_jsonl

from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job import DedupConfig, run_dedup

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[1]


SPLIT_BYTES, PARTITIONS = 20_000, 3


def _start(inputs: Path, out: Path, address: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "gristmill.pipeline.cli", "dedup", str(inputs), "-o", str(out), "--split-bytes",
               str(SPLIT_BYTES), "--num-partitions", str(PARTITIONS), "--ray-address", address]
    return subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _kill_session(process: subprocess.Popen) -> None:
    """SIGKILL the driver and anything it started."""
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    kill_session(process.pid)


def _kill_when(process: subprocess.Popen, ready: callable, out: Path) -> None:
    deadline = time.monotonic() + 180
    while not ready() and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        time.sleep(0.01)
    assert ready(), "the job never reached the stage to kill it in"
    _kill_session(process)
    assert not (out / "_manifest.json").exists(), "the job finished before it was killed; nothing was tested"


def test_driver_killed_in_two_stages_then_rerun_gives_the_identical_corpus(tmp_path: Path, ray_local: None) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    texts = documents(48)
    for i in range(4):
        write_jsonl(inputs / f"f{i}.jsonl", texts[i::4], prefix=f"f{i}-")
    reference, out = tmp_path / "reference", tmp_path / "out"
    work = out / "_work"
    import ray

    run_dedup(DedupConfig(inputs=[str(inputs)], output=str(reference), split_bytes=SPLIT_BYTES,
                          num_partitions=PARTITIONS))
    _kill_twice_then_finish(inputs, out, ray.get_runtime_context().gcs_address)
    resumed, expected = Corpus.open(str(out)), Corpus.open(str(reference))
    assert [s.to_dict() for s in resumed.shards] == [s.to_dict() for s in expected.shards]
    assert {"read", "exact", "sign", "buckets"} <= set(resumed.stats["resumed_stages"])
    assert resumed.stats["documents"] == expected.stats["documents"]
    assert resumed.stats["cluster_sizes"] == expected.stats["cluster_sizes"]
    assert not work.exists()


def _kill_twice_then_finish(inputs: Path, out: Path, address: str) -> None:
    work = out / "_work"
    first = _start(inputs, out, address)  # killed in the read stage, after some splits finished
    _kill_when(first, lambda: len(list((work / "read" / "done").glob("*.json"))) >= 1, out)
    assert not (work / "stage-read.json").exists()
    second = _start(inputs, out, address)  # killed in the connected-components stage
    _kill_when(second, lambda: (work / "stage-buckets.json").exists(), out)
    assert not (work / "stage-clusters.json").exists()

    third = _start(inputs, out, address)
    assert third.wait(timeout=240) == 0, third.stderr.read().decode()[-2000:]
