"""Same corpus, byte for byte, with 1 CPU, 2 CPUs and a 2-node ``ray.cluster_utils.Cluster``; and, on 3
nodes, a worker node killed in the middle of a shuffle (``Cluster.remove_node``) without changing the
result or losing a document."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_pipeline_data import documents, write_jsonl, write_parquet

from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job import DedupConfig, run_dedup

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cluster-input")
    texts = documents(40)
    for i in range(6):
        write_jsonl(root / f"part{i}.jsonl", texts[i::8], prefix=f"j{i}-")
    write_parquet(root / "rest.parquet", [t for i, t in enumerate(texts) if i % 8 >= 6], prefix="pq")
    return root


def _run(inputs: Path, out: Path) -> list[dict[str, Any]]:
    """The job with many small splits (so several tasks run at once); returns the manifest's shards."""
    documents = run_dedup(DedupConfig(inputs=[str(inputs)], output=str(out), split_bytes=16_000,
                                      num_partitions=4))["documents"]
    assert documents["input"] == documents["kept"] + documents["exact_duplicate"] + documents["near_duplicate"] \
        + documents["rejected"]
    return [s.to_dict() for s in Corpus.open(str(out)).shards]


@pytest.fixture(scope="module")
def baseline(inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        return _run(inputs, tmp_path_factory.mktemp("two-cpus") / "corpus")
    finally:
        ray.shutdown()


def test_one_cpu_gives_the_same_shards(inputs: Path, baseline: list[dict[str, Any]], tmp_path: Path) -> None:
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        assert _run(inputs, tmp_path / "corpus") == baseline
    finally:
        ray.shutdown()


@pytest.fixture()
def cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_two_node_cluster_gives_the_same_shards_even_when_a_worker_node_dies_in_a_shuffle(
        inputs: Path, baseline: list[dict[str, Any]], cluster: Any, tmp_path: Path) -> None:
    assert _run(inputs, tmp_path / "two-nodes") == baseline

    victim = cluster.add_node(num_cpus=1)  # three nodes now
    cluster.wait_for_nodes()
    out = tmp_path / "node-killed"
    work = out / "_work"
    result: dict[str, Any] = {}
    job = threading.Thread(target=lambda: result.update(shards=_run(inputs, out)))
    job.start()
    deadline = time.monotonic() + 120
    # the exact shuffle: its first sending tasks have written their files, its reducers have not run
    while not list((work / "exact" / "map").glob("*.json")) and time.monotonic() < deadline:
        time.sleep(0.01)
    in_shuffle = job.is_alive() and not (work / "stage-exact.json").exists()
    cluster.remove_node(victim, allow_graceful=False)
    assert in_shuffle, "the exact shuffle was over before a node could be killed; the test proves nothing"
    job.join(timeout=240)
    assert not job.is_alive()
    assert result["shards"] == baseline
