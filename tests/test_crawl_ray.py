"""Crawl partitions as Ray actors on a 2-node ``ray.cluster_utils.Cluster``: they spread over the
nodes, a partition whose worker process on the second node is SIGKILLed mid-crawl is restarted by Ray
from its frontier, and the crawl completes with every URL of a one-partition crawl stored once."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gristmill.crawlers import crawl
from gristmill.crawlers.partitions import deal, partition_of
from gristmill.pipeline.commands.crawl import RayLauncher
from gristmill.pipeline.demo.site.server import DemoSite
from gristmill.pipeline.format import Corpus

pytestmark = pytest.mark.timeout(240)
SETTINGS = dict(allow_networks=["127.0.0.0/8"], min_delay=0.05, adaptive=False, extract=False, commit_every=5,
                commit_interval=0.3, progress_interval=60.0)


def _stored(out: Path) -> list[str]:
    corpus = Corpus.open(str(out))
    return [url for shard in corpus.manifest.shards
            for url in pq.read_table(out / shard.path, columns=["url"]).column("url").to_pylist()]


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[object, object]]:
    """A head node and one worker node; yields (cluster, worker node)."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=2)
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    try:
        yield cluster, worker
    finally:
        ray.shutdown()
        cluster.shutdown()


def _ancestors(pid: int) -> set[int]:
    """Every process above ``pid`` (a Ray worker sits below its node's raylet)."""
    found = set()
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        found.add(pid)
    return found


def _partition_pids(launcher: RayLauncher) -> dict[int, int]:
    """Each partition's process, as it reports itself to the hub actor."""
    if launcher.hub is None:
        return {}
    return {index: int(status["epoch"].split(":")[0]) for index, status in launcher.hub.statuses(range(3)).items()}


def test_partitions_run_as_actors_and_a_killed_worker_restarts_its_partition(cluster, tmp_path: Path) -> None:
    _cluster, worker = cluster
    raylet = worker.all_processes["raylet"][0].process.pid
    with DemoSite() as site:
        crawl(site.seeds, str(tmp_path / "one"), host_map=site.host_map, **SETTINGS)
        single = _stored(tmp_path / "one")
        out = tmp_path / "split"
        on_worker_node: dict[int, bool] = {}
        killed: list[int] = []
        launcher = RayLauncher()

        def kill_a_partition_on_the_worker_node() -> None:
            """Once a partition on the worker node has stored pages, SIGKILL its process."""
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not killed:
                for index, pid in _partition_pids(launcher).items():
                    on_worker_node.setdefault(index, raylet in _ancestors(pid))
                    if on_worker_node[index] and _committed(out, index):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                        return
                time.sleep(0.05)

        watcher = threading.Thread(target=kill_a_partition_on_the_worker_node, daemon=True)
        watcher.start()
        summary = crawl(site.seeds, str(out), host_map=site.host_map, partitions=3, launcher=launcher,
                        **SETTINGS)
        watcher.join()
    assert killed, "no partition on the worker node was killed"
    assert set(on_worker_node.values()) == {True, False}, "the partitions did not spread over both nodes"
    assert killed[0] not in _partition_pids(launcher).values()  # the killed partition ran again, in a new process
    stored = _stored(out)
    assert len(stored) == len(set(stored)), "a URL was stored twice"
    assert set(stored) == set(single)
    assert summary.documents == len(stored)
    assert {partition_of(url, 3, deal(site.seeds, 3)) for url in stored} == {0, 1, 2}


def _committed(out: Path, index: int) -> bool:
    """Whether partition ``index`` has recorded a shard in its frontier."""
    path = out / ".crawl" / f"p{index}" / "frontier.sqlite"
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            return bool(db.execute("SELECT COUNT(*) FROM shards").fetchone()[0])
    except sqlite3.Error:
        return False
