"""The loader against an object store with real latency: moto's S3 server behind the shaping proxy of
benchmarks/shaped_store.py (first-byte latency, bandwidth caps, a GET rate cap answered with 503 SlowDown,
and a hook that damages bodies), read through s3fs as a training job would.

Shaping is checked by the proxy's counters and by lower bounds on time (a sleep cannot finish early);
nothing here asserts that anything is fast.
"""

from __future__ import annotations

import base64
import os
import random
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import s3fs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gristmill.loaders import LoaderError, StreamingLoader
from gristmill.loaders.blocks import PART_BYTES, is_throttling
from gristmill.pipeline.format import Corpus, ShardWriter
from gristmill.pipeline.format import manifest as manifest_module
from tests.test_loader import make_corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from shaped_store import Shape, ShapedStore  # noqa: E402

pytestmark = pytest.mark.timeout(180)


@pytest.fixture()
def shaped(store: ShapedStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[ShapedStore]:
    """The proxy, unshaped and untampered at the start and end of each test.

    s3fs retries a failed request 5 times itself (503 SlowDown included) before its caller hears of
    it; here it tries once, so that the loader sees, retries and counts every fault the store makes.
    """
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    store.settings, store.tamper = Shape(), None
    store.reset_stats()
    yield store
    store.settings, store.tamper = Shape(), None


def options(store: ShapedStore, **more: Any) -> dict[str, Any]:
    """s3fs options for the proxy with botocore's own retries off (and s3fs's, see ``shaped``)."""
    return {"client_kwargs": {"endpoint_url": store.endpoint},
            "config_kwargs": {"retries": {"total_max_attempts": 1}}, **more}


def upload(store: ShapedStore, local: str) -> str:
    """A copy of a local corpus in a fresh bucket, written through the proxy; returns its URL."""
    fs = s3fs.S3FileSystem(**options(store))
    bucket = f"remote-{uuid.uuid4().hex[:10]}"
    fs.mkdir(bucket)
    fs.put(local, f"{bucket}/corpus", recursive=True)
    return f"s3://{bucket}/corpus"


@pytest.fixture(scope="module")
def many_blocks(tmp_path_factory: pytest.TempPathFactory) -> str:
    """104 small row groups in 6 shards: enough reads for concurrency and coalescing to show."""
    path = str(tmp_path_factory.mktemp("many"))
    make_corpus(path, 1500, seed=11, shard_bytes=60_000, row_group_bytes=3_000)
    return path


@pytest.fixture(scope="module")
def few_blocks(tmp_path_factory: pytest.TempPathFactory) -> str:
    """17 row groups in 3 shards."""
    path = str(tmp_path_factory.mktemp("few"))
    make_corpus(path, 700, seed=3)
    return path


def batches(loader: StreamingLoader, limit: int | None = None) -> list[list[str]]:
    out = []
    for batch in loader:
        out.append(batch["id"])
        if limit is not None and len(out) == limit:
            break
    return out


# -- the shaped store ------------------------------------------------------------------------------
def test_the_proxy_adds_latency_caps_bandwidth_and_answers_503_beyond_the_rate(shaped: ShapedStore) -> None:
    fs = s3fs.S3FileSystem(**options(shaped), skip_instance_cache=True)
    fs.mkdir("shape-check")
    body = os.urandom(1_000_000)
    fs.pipe_file("shape-check/data/object", body)
    assert fs.cat_file("shape-check/data/object", start=10, end=20) == body[10:20]  # (fills the proxy's copy)

    shaped.shape(latency=0.3)
    began = time.perf_counter()
    assert fs.cat_file("shape-check/data/object", start=0, end=100) == body[:100]
    assert time.perf_counter() - began >= 0.3

    shaped.shape(latency=0.0, conn_mbps=2.0)  # 1 MB at 2 MB/s per connection: at least half a second
    began = time.perf_counter()
    assert fs.cat_file("shape-check/data/object") == body
    assert time.perf_counter() - began >= 0.5

    shaped.shape(conn_mbps=None, gets_per_s=2.0, burst=2.0)
    shaped.reset_stats()
    errors = []
    for _ in range(8):
        try:
            fs.cat_file("shape-check/data/object", start=0, end=10)
        except OSError as exc:
            errors.append(exc)
    stats = shaped.stats()
    assert stats["gets"] == 8 and stats["throttled"] == len(errors) >= 5  # a burst of 2, then 2 a second
    assert all(is_throttling(exc) for exc in errors)


def test_two_connections_share_a_total_cap(shaped: ShapedStore) -> None:
    from concurrent.futures import ThreadPoolExecutor

    fs = s3fs.S3FileSystem(**options(shaped), skip_instance_cache=True)
    fs.mkdir("total-check")
    fs.pipe_file("total-check/object", os.urandom(500_000))
    fs.cat_file("total-check/object")
    shaped.shape(total_mbps=2.0)  # two 0.5 MB reads at once through 2 MB/s in all: at least half a second
    shaped.reset_stats()
    began = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        sizes = list(pool.map(lambda _: len(fs.cat_file("total-check/object")), range(2)))
    assert time.perf_counter() - began >= 0.5
    assert sizes == [500_000] * 2 and shaped.stats()["max_active"] == 2


# -- the loader through it -------------------------------------------------------------------------
def test_rows_and_order_through_the_shaped_store_equal_local_disk_with_shuffle_and_resume(
        shaped: ShapedStore, many_blocks: str) -> None:
    url = upload(shaped, many_blocks)
    shaped.shape(latency=0.02, conn_mbps=20.0)
    args = {"batch_size": 16, "columns": ["id"], "seed": 5, "world_size": 1, "rank": 0}
    local = batches(StreamingLoader(many_blocks, **args))
    remote = StreamingLoader(url, storage_options=options(shaped), **args)
    assert batches(remote) == local
    counters = remote.counters.as_dict()
    assert counters["read_mb_per_s"] > 0 and counters["max_in_flight"] >= 1

    partial = StreamingLoader(url, storage_options=options(shaped), **args)
    head = batches(partial, 7)
    resumed = StreamingLoader(url, storage_options=options(shaped), **args)
    resumed.load_state_dict(partial.state_dict())
    assert head + batches(resumed) == local

    # in order (no shuffle), adjacent small row groups share one read: fewer reads than blocks, same rows
    plain = {**args, "shuffle": False}
    coalesced = StreamingLoader(url, storage_options=options(shaped), **plain)
    single = StreamingLoader(url, storage_options=options(shaped), coalesce_bytes=0, **plain)
    assert batches(coalesced) == batches(single) == batches(StreamingLoader(many_blocks, **plain))
    shards = len(Corpus.open(many_blocks).shards)
    assert coalesced.counters.reads < coalesced.counters.blocks_fetched + shards  # footers: one read per shard
    assert single.counters.reads == single.counters.blocks_fetched + shards


def test_dataloader_workers_read_the_store_with_their_own_connections(shaped: ShapedStore,
                                                                     few_blocks: str) -> None:
    """The first batch is read before the workers fork; s3fs refuses to run in a child forked after it
    started, so each worker must open its own filesystem object."""
    from gristmill.loaders.torch_dataset import StreamingDataLoader, StreamingDataset

    url = upload(shaped, few_blocks)
    shaped.shape(latency=0.02)
    args = {"batch_size": 16, "columns": ["id"], "seed": 4, "world_size": 1, "rank": 0}
    local = [b["id"] for b in StreamingDataLoader(StreamingDataset(few_blocks, **args), num_workers=2)]
    remote = [b["id"] for b in StreamingDataLoader(StreamingDataset(url, storage_options=options(shaped), **args),
                                                   num_workers=2)]
    assert remote == local and sum(map(len, remote)) == 700


def test_the_first_batch_read_before_workers_fork_reads_the_footer_beside_the_block(shaped: ShapedStore,
                                                                                   few_blocks: str) -> None:
    """With workers, the first batch is read in the calling thread (``io_threads=0``); its shard's footer
    and its block are still two GETs in flight together, one round trip rather than two."""
    import threading

    url = upload(shaped, few_blocks)
    shaped.shape(latency=0.05)
    loader = StreamingLoader(url, batch_size=16, columns=["id"], world_size=1, rank=0, io_threads=0,
                             storage_options=options(shaped))
    before = set(threading.enumerate())
    shaped.reset_stats()
    stream = iter(loader)
    assert len(next(stream)["id"]) == 16
    stats = shaped.stats()
    assert stats["gets"] == 2 and stats["max_active"] == 2
    assert set(threading.enumerate()) <= before  # the footer's thread is gone: a fork now is safe
    stream.close()


def test_many_reads_are_in_flight_at_once_against_a_far_store(shaped: ShapedStore, many_blocks: str) -> None:
    """At 100 ms the loader keeps more than 10 reads in flight (an object store's gate starts at 16, and
    the fake-clock test below checks how it grows), and ``max_reads`` caps them."""
    url = upload(shaped, many_blocks)
    shaped.shape(latency=0.1)
    loader = StreamingLoader(url, batch_size=16, columns=["id"], world_size=1, rank=0, coalesce_bytes=0,
                             storage_options=options(shaped))
    shaped.reset_stats()
    assert sum(len(b) for b in batches(loader)) == 1500
    assert loader.counters.as_dict()["max_in_flight"] > 10
    # the store saw them at once, too: s3fs's client would keep 10 connections unless given room for more
    assert shaped.stats()["max_active"] > 10

    capped = StreamingLoader(url, batch_size=16, columns=["id"], world_size=1, rank=0, coalesce_bytes=0,
                             storage_options=options(shaped), max_reads=4)
    shaped.reset_stats()
    assert sum(len(b) for b in batches(capped)) == 1500
    assert capped.counters.max_in_flight <= 4 and shaped.stats()["max_active"] <= 4


def test_room_for_reads_keeps_what_the_caller_set() -> None:
    from gristmill.loaders.concurrency import room_for_reads

    assert room_for_reads("s3://b/c", {"anon": True}, 48) == {"anon": True,
                                                              "config_kwargs": {"max_pool_connections": 48}}
    mine = {"config_kwargs": {"max_pool_connections": 7, "retries": {"max_attempts": 2}}}
    assert room_for_reads("s3a://b/c", mine, 48) == mine
    assert room_for_reads("gs://b/c", {}, 48) == {} and room_for_reads("/data/c", {}, 48) == {}
    assert room_for_reads("s3://b/c", {"config_kwargs": "odd"}, 48) == {"config_kwargs": "odd"}  # s3fs says why


def test_a_read_on_an_idle_link_is_split_into_parts_read_at_once(shaped: ShapedStore, tmp_path: Path) -> None:
    """A block read while nothing else is in flight (the first batch's) arrives as several ranged GETs in
    flight together, joined into exactly the block's bytes; with one read allowed it stays one GET."""
    rng = random.Random(3)
    texts = [base64.b64encode(rng.randbytes(768)).decode() for _ in range(3000)]  # 3 MB, incompressible
    writer = ShardWriter(str(tmp_path / "wide"), shard_bytes=64 << 20, row_group_bytes=8 << 20)
    writer.write([{"id": str(i), "text": text} for i, text in enumerate(texts)])
    writer.commit()
    url = upload(shaped, str(tmp_path / "wide"))
    shaped.shape(latency=0.05)
    for max_reads, requests in ((64, 3), (1, 1)):
        loader = StreamingLoader(url, batch_size=64, columns=["text"], world_size=1, rank=0,
                                 storage_options=options(shaped), max_reads=max_reads)
        source, block = loader.source, 0
        start, end = source.layout.byte_range(block)
        assert end - start >= 2 * PART_BYTES
        shaped.reset_stats()
        data = source.fetch(block)
        stats = shaped.stats()
        assert stats["gets"] == min(requests, (end - start) // PART_BYTES)
        assert stats["max_active"] == stats["gets"]  # in flight together
        shard = Corpus.open(str(tmp_path / "wide")).shards[0]
        with open(tmp_path / "wide" / shard.path, "rb") as handle:
            handle.seek(start)
            assert data == handle.read(end - start)
        assert sorted(t for batch in loader for t in batch["text"]) == sorted(texts)


def test_a_slowdown_storm_is_retried_with_backoff_and_counted(shaped: ShapedStore, few_blocks: str) -> None:
    url = upload(shaped, few_blocks)
    args = {"batch_size": 16, "columns": ["id"], "seed": 2, "world_size": 1, "rank": 0}
    loader = StreamingLoader(url, storage_options=options(shaped), retries=30, **args)
    shaped.shape(gets_per_s=8.0, burst=2.0)
    shaped.reset_stats()
    assert batches(loader) == batches(StreamingLoader(few_blocks, **args))
    counters, stats = loader.counters.as_dict(), shaped.stats()
    assert stats["throttled"] > 0
    assert counters["throttled"] == stats["throttled"]  # every 503 the store sent was seen and retried
    assert counters["retries"] == counters["throttled"]


def test_a_permanent_error_names_the_shard(shaped: ShapedStore, few_blocks: str) -> None:
    url = upload(shaped, few_blocks)
    corpus = Corpus.open(url, options(shaped))
    shard = corpus.shards[0]
    throttled = StreamingLoader(url, batch_size=16, columns=["id"], shuffle=False, world_size=1, rank=0,
                                retries=2, storage_options=options(shaped))
    shaped.shape(gets_per_s=0.001, burst=1.0)  # one GET, then 503 for good
    with pytest.raises(LoaderError, match=rf"{url}/{shard.path}: reading .* failed after 3 attempts"):
        batches(throttled)
    shaped.shape(gets_per_s=None)
    corpus.fs.rm(corpus.shard_path(shard))
    with pytest.raises(LoaderError, match=rf"{url}/{shard.path}: shard listed in the manifest is missing"):
        batches(StreamingLoader(url, batch_size=16, columns=["id"], shuffle=False, world_size=1, rank=0,
                                storage_options=options(shaped)))


# -- a store that sends the wrong bytes -------------------------------------------------------------
DAMAGE = st.sampled_from(["short", "cut", "long", "garbage"])


def damage(kind: str, seed: int, body: bytes) -> tuple[bytes, int]:
    """A body as a broken store sends it: (bytes on the wire, Content-Length declared)."""
    rng = random.Random(seed)
    keep = rng.randrange(0, max(1, len(body)))
    if kind == "short":  # fewer bytes, honestly declared
        return body[:keep], keep
    if kind == "cut":  # the declared length, but the connection ends early
        return body[:keep], len(body)
    if kind == "long":  # more than the range asked for
        extra = rng.randbytes(rng.randrange(1, 100))
        return body + extra, len(body) + len(extra)
    return rng.randbytes(len(body)), len(body)  # the right length of something else


def test_a_store_sending_wrong_bytes_is_an_error_naming_the_shard(shaped: ShapedStore, few_blocks: str) -> None:
    url = upload(shaped, few_blocks)
    corpus = Corpus.open(url, options(shaped))
    shards = "|".join(f"{url}/{s.path}" for s in corpus.shards)

    @settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(DAMAGE, st.integers(0, 2**32), st.integers(0, 10))
    def refused(kind: str, seed: int, spare: int) -> None:
        loader = StreamingLoader(url, batch_size=16, columns=["id", "text"], seed=seed, world_size=1, rank=0,
                                 retries=1, storage_options=options(shaped))
        answered = [0]

        def tamper(path: str, body: bytes) -> tuple[bytes, int]:
            answered[0] += 1  # the first ``spare`` bodies arrive intact, the rest damaged
            return (body, len(body)) if answered[0] <= spare else damage(kind, seed + answered[0], body)

        shaped.tamper = tamper
        try:
            with pytest.raises(LoaderError, match=shards):
                batches(loader)
        finally:
            shaped.tamper = None

    refused()


@pytest.mark.parametrize("argument", ["max_reads", "coalesce_bytes"])
def test_bad_read_arguments_are_named(few_blocks: str, argument: str) -> None:
    @settings(max_examples=15, deadline=None)
    @given(st.one_of(st.integers(max_value=0 if argument == "max_reads" else -1), st.booleans(), st.floats(),
                     st.text(max_size=3), st.none()))
    def refused(value: Any) -> None:
        with pytest.raises((TypeError, ValueError), match=argument):
            StreamingLoader(few_blocks, world_size=1, rank=0, **{argument: value})

    refused()


# -- feeding the accelerator (CPU-only here: the API, and what happens without CUDA) -------------------
def token_batches(loader: Any) -> list[Any]:
    return [(batch["tokens"], batch["segment_ids"]) for batch in loader]


@pytest.mark.parametrize("workers", [0, 2])
def test_pinned_batches_and_a_cpu_device_give_the_same_tokens(few_blocks: str, workers: int) -> None:
    import torch

    from gristmill.loaders.torch_dataset import StreamingDataLoader, StreamingDataset

    args = {"batch_size": 8, "seq_len": 256, "world_size": 1, "rank": 0, "seed": 1}
    expected = token_batches(StreamingDataLoader(StreamingDataset(few_blocks, **args), num_workers=workers))
    for extra in ({"pin_memory": True}, {"device": torch.device("cpu"), "pin_memory": True}):
        got = token_batches(StreamingDataLoader(StreamingDataset(few_blocks, **args), num_workers=workers, **extra))
        assert len(got) == len(expected)
        for (tokens, segments), (want_tokens, want_segments) in zip(got, expected):
            assert torch.equal(tokens, want_tokens) and torch.equal(segments, want_segments)
            assert tokens.device.type == "cpu"
            # pinned exactly when there is an accelerator to pin for (torch's DataLoader does the same)
            assert tokens.is_pinned() == bool(extra.get("pin_memory") and torch.cuda.is_available())


def test_a_device_this_machine_lacks_is_a_clear_error(few_blocks: str) -> None:
    import torch

    from gristmill.loaders.torch_dataset import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(few_blocks, batch_size=4, seq_len=64, world_size=1, rank=0)
    if torch.cuda.is_available():  # where CUDA is present, batches arrive on the GPU
        batch = next(iter(StreamingDataLoader(dataset, device="cuda")))
        assert batch["tokens"].device.type == "cuda"
    else:
        with pytest.raises(ValueError, match=r"device='cuda:0' needs CUDA, which this machine or torch build lacks"):
            StreamingDataLoader(dataset, device="cuda:0")
    with pytest.raises(ValueError, match="'cpu' or 'cuda' devices only"):
        StreamingDataLoader(dataset, device="meta")
    with pytest.raises(ValueError, match="not a device torch knows"):
        StreamingDataLoader(dataset, device="warp-drive")
    with pytest.raises(TypeError, match="device must be a torch.device or a string"):
        StreamingDataLoader(dataset, device=3.5)


class _LinkModel:
    """A link whose throughput grows with the reads in flight up to ``capacity`` MB/s, on a fake clock:
    a round of ``limit`` reads of 1 MB takes ``limit / min(limit, capacity)`` seconds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, capacity: int) -> None:
        import gristmill.loaders.concurrency as concurrency

        self.now, self.capacity = 0.0, capacity
        monkeypatch.setattr(concurrency.time, "perf_counter", lambda: self.now)

    def round(self, gate: Any) -> None:
        limit = gate.limit
        gate._round_waited = True  # every read of the round queued for a slot: the gate was the limit
        self.now += limit / min(limit, self.capacity)
        for _ in range(limit):
            gate.finished(1 << 20)


def test_the_read_gate_doubles_while_it_pays_then_grows_by_half(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gristmill.loaders.blocks import Counters
    from gristmill.loaders.concurrency import ReadGate

    link = _LinkModel(monkeypatch, capacity=17)
    gate = ReadGate(Counters(), start=4, maximum=64)
    limits = [gate.limit]
    for _ in range(6):
        link.round(gate)
        limits.append(gate.limit)
    assert limits[:4] == [4, 8, 16, 32]  # slow start: doubling while each round beats the best by 10 %
    assert limits[4:] == [32] * 3  # past the link's capacity nothing pays, so nothing grows
    link.capacity = 64  # the link got faster: a round pays again
    link.round(gate)
    assert gate.limit == 48  # grown by half, no longer doubling, once slow start has ended
    link.round(gate)
    assert gate.limit == 64  # the maximum
    gate.throttled()
    assert gate.limit == 32  # halved at once


def test_opening_a_corpus_costs_one_request_or_two(shaped: ShapedStore, few_blocks: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest, with a small block table inside it: one GET. A table too big to carry inline is a
    second GET. No size-asking HEAD before either (0.1 s each at 100 ms, on the way to the first batch)."""
    url = upload(shaped, few_blocks)
    shaped.reset_stats()
    StreamingLoader(url, batch_size=16, columns=["id"], world_size=1, rank=0, storage_options=options(shaped))
    stats = shaped.stats()
    assert (stats["requests"], stats["gets"]) == (1, 1)
    monkeypatch.setattr(manifest_module, "INLINE_BLOCKS_BYTES", -1)
    make_corpus(str(tmp_path / "big-table"), 300, seed=5)
    url = upload(shaped, str(tmp_path / "big-table"))
    shaped.reset_stats()
    StreamingLoader(url, batch_size=16, columns=["id"], world_size=1, rank=0, storage_options=options(shaped))
    stats = shaped.stats()
    assert (stats["requests"], stats["gets"]) == (2, 2)
