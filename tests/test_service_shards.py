"""``gristmill serve --shards 4`` on a 2-node ``ray.cluster_utils.Cluster``: the front as a real CLI
subprocess joining the cluster, the shards as Ray actors on both nodes, driven over HTTP."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_service import Server, start_server, text, variant

from gristmill.pipeline.format.signature_index import params_for
from gristmill.pipeline.service.client import AsyncDedupClient, DedupClient, ServiceError
from gristmill.pipeline.service.core import DedupService, Doc
from gristmill.pipeline.service.shards import NAMESPACE, shard_name


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def sharded(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    state = tmp_path_factory.mktemp("sharded") / "state"
    server = start_server(state, "--shards", "4", "--ray-address", cluster.address)
    try:
        yield server, state
    finally:
        server.stop()


def stream() -> list[tuple[str, str]]:
    """New texts, exact repeats (another id) and near variants, in a fixed order."""
    docs = []
    for i in range(120):
        if i % 5 == 3:
            docs.append((f"s-{i}", text(5000 + i - 3)))
        elif i % 5 == 4:
            docs.append((f"s-{i}", variant(text(5000 + i - 4), i % 7)))
        else:
            docs.append((f"s-{i}", text(5000 + i)))
    return docs


def comparable(result: Any) -> tuple:
    return result.new, result.exact_duplicate_of, tuple(sorted(n.id for n in result.near_duplicates))


def test_shards_sit_on_both_nodes_and_verdicts_equal_one_index(sharded: tuple[Server, Path], tmp_path: Path) -> None:
    import ray

    server, state = sharded
    nodes = {ray.get(ray.get_actor(shard_name(str(state), k)).node.remote()) for k in range(4)}
    assert len(nodes) == 2
    docs = stream()
    client = DedupClient(server.url, batch_size=7)  # batches mix documents of every shard
    got = client.add(docs)
    reference = DedupService(str(tmp_path / "one"), params_for(0.8, 128, 5))
    try:
        expected = []
        for start in range(0, len(docs), 7):
            batch = [Doc(t, i) for i, t in docs[start : start + 7]]
            expected += asyncio.run(reference.handle(batch, add=True))
    finally:
        reference.close()
    assert [comparable(r) for r in got] == [
        (e["new"], e["exact_duplicate_of"], tuple(sorted(n["id"] for n in e["near_duplicates"]))) for e in expected]
    assert sum(r.new for r in got) == 72 and client.stats()["documents"] >= 72


def test_concurrent_near_variants_across_shards_yield_exactly_one_new(sharded: tuple[Server, Path]) -> None:
    server, _ = sharded
    base = text(9000)
    docs = [(f"race-{k}", variant(base, k)) for k in range(40)]  # near variants: content hashes on every shard

    async def race() -> list[Any]:
        async with AsyncDedupClient(server.url) as client:
            return [r for batch in await asyncio.gather(*(client.add([d]) for d in docs)) for r in batch]

    results = asyncio.run(race())
    assert sum(r.new for r in results) == 1
    winner = next(r.id for r in results if r.new)
    assert all(winner in {n.id for n in r.near_duplicates} for r in results if not r.new)


def test_a_killed_shard_is_restarted_and_no_acknowledged_add_is_lost(sharded: tuple[Server, Path]) -> None:
    import ray

    server, state = sharded
    victim = ray.get_actor(shard_name(str(state), 1))
    acked: dict[str, str] = {}
    refused = []
    lock = threading.Lock()
    stop = threading.Event()

    def writer(worker: int) -> None:
        client = DedupClient(server.url, timeout=30)
        n = 0
        while not stop.is_set():
            doc_id, body = f"k{worker}-{n}", text(200_000 + worker * 10_000 + n)
            n += 1
            try:
                [result] = client.add([(doc_id, body)])
            except ServiceError as exc:
                assert exc.status == 503, exc  # a shard restarting: not acknowledged, the writer goes on
                refused.append(doc_id)
                continue
            assert result.added
            with lock:
                acked[doc_id] = body

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    try:
        while len(acked) < 20:
            threading.Event().wait(0.05)
        killed = ray.get(victim.pid.remote())
        os.kill(killed, signal.SIGKILL)  # mid-stream: requests in flight
        after = len(acked)
        while len(acked) < after + 40:  # adds go on once the shard is back
            threading.Event().wait(0.05)
            assert server.proc.poll() is None
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert ray.get(victim.pid.remote()) != killed  # Ray restarted it, from its snapshot and logs
    ids = list(acked)
    results = DedupClient(server.url).check([acked[i] for i in ids])
    assert [r.exact_duplicate_of for r in results] == ids


def test_export_writes_every_shard_as_one_corpus_index(sharded: tuple[Server, Path], tmp_path: Path) -> None:
    from gristmill.pipeline.cli import main
    from gristmill.pipeline.format.signature_index import load_index

    server, state = sharded
    documents = DedupClient(server.url).stats()["documents"]
    server.stop()  # the shards hold their folders' locks while they run
    assert main(["serve", "--state", str(state), "--shards", "4", "--export", str(tmp_path / "out")]) == 0
    _, table = load_index(str(tmp_path / "out"))
    assert len(table.ids) == documents and {f"s-{i}" for i in range(120) if i % 5 < 3} <= set(table.ids)
