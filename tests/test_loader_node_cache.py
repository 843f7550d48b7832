"""The node-local block cache: several real processes on one machine share one directory.

One download per node, a bound that holds, nothing wedged or leaked by a process killed with SIGKILL,
and a directory of foreign, garbage or truncated files never served as data.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gristmill.loaders import DiskCache, StreamingLoader
from gristmill.pipeline.format import Corpus
from tests.test_loader import make_corpus

pytestmark = pytest.mark.timeout(180)
SPAWN = multiprocessing.get_context("spawn")  # the test process runs threads (moto): children start clean


def _cache_files(directory: str, suffix: str = "") -> int:
    """Bytes of the files in a cache directory (those ending in ``suffix``): the bound covers them all."""
    return sum(e.stat().st_size for e in os.scandir(directory) if e.name.endswith(suffix))


# -- 2 ranks x 2 workers reading a corpus on S3 ---------------------------------------------------------
def _read_stream(url: str, options: dict, cache_dir: str, rank: int, worker: int, queue: multiprocessing.Queue) -> None:
    fetched: list[tuple[str, bool]] = []  # (cache key, whether it came from the node cache), observed
    real_fetch = DiskCache.fetch

    def observed(self: DiskCache, key: str, size: int, download: object) -> tuple[bytes, bool]:
        data, hit = real_fetch(self, key, size, download)
        fetched.append((key, hit))
        return data, hit

    DiskCache.fetch = observed
    loader = StreamingLoader(url, batch_size=16, columns=["text"], rank=rank, world_size=2, worker_id=worker,
                             num_workers=2, storage_options=options, cache_dir=cache_dir, cache_bytes=1 << 30)
    texts = [[t for batch in loader for t in batch["text"]] for _ in range(2)]
    queue.put((texts, fetched, loader.counters.as_dict()["bytes_read"]))


def test_two_ranks_two_workers_read_each_block_from_storage_once(s3_server: dict, s3_bucket: str,
                                                                 tmp_path: Path) -> None:
    url, options = f"{s3_bucket}/corpus", s3_server["storage_options"]
    texts = make_corpus(url, 900, seed=5, storage_options=options)
    corpus = Corpus.open(url, options)
    queue, cache_dir = SPAWN.Queue(), str(tmp_path / "cache")
    processes = [SPAWN.Process(target=_read_stream, args=(url, options, cache_dir, rank, worker, queue))
                 for rank in range(2) for worker in range(2)]
    for process in processes:
        process.start()
    results = [queue.get(timeout=150) for _ in processes]
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    for epoch in range(2):
        seen = [t for texts_of, _, _ in results for t in texts_of[epoch]]
        assert set(seen) == set(texts) and len(seen) < len(texts) + 2 * 16  # padding: under a batch per rank
    fetched = [entry for _, entries, _ in results for entry in entries]
    downloads = sorted(key for key, hit in fetched if not hit)
    # every block and footer the node needed came from S3 once, over both epochs and all four processes
    assert len(downloads) == len(set(downloads)) == len(corpus.manifest.blocks) + len(corpus.shards)
    assert {key for key, _ in fetched} == set(downloads)
    blocks = int(corpus.manifest.blocks.length.sum())
    footers = sum(s.footer_length for s in corpus.shards)
    read = sum(bytes_read for _, _, bytes_read in results)
    assert blocks + footers <= read <= corpus.manifest.num_bytes + blocks  # + neighbours a coalesced read took
    stored = [name for name in os.listdir(cache_dir) if name.endswith(".blk")]
    assert len(stored) == len(downloads) and _cache_files(cache_dir, ".blk") == blocks + footers + 16 * len(stored)


# -- one download when several processes miss the same block at once -------------------------------
def _fetch_slowly(directory: str, log: str, barrier: multiprocessing.Barrier, queue: multiprocessing.Queue) -> None:
    cache = DiskCache(directory, 1 << 20)

    def download() -> bytes:
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        return b"block" * 1000

    barrier.wait()
    queue.put(cache.fetch("k", 5000, download))


def test_processes_missing_the_same_block_at_once_download_it_once(tmp_path: Path) -> None:
    barrier, queue = SPAWN.Barrier(4), SPAWN.Queue()
    log = str(tmp_path / "downloads.log")
    processes = [SPAWN.Process(target=_fetch_slowly, args=(str(tmp_path / "cache"), log, barrier, queue))
                 for _ in range(4)]
    for process in processes:
        process.start()
    results = [queue.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(30)
    assert len(Path(log).read_text().split()) == 1
    assert [data for data, _ in results] == [b"block" * 1000] * 4
    assert sorted(hit for _, hit in results) == [False, True, True, True]
    assert not [name for name in os.listdir(tmp_path / "cache") if name.startswith(".dl-")]


# -- processes killed while holding a download, a pin, or a half-written block ---------------------
def _hold_then_hang(directory: str, role: str, ready: str) -> None:
    cache = DiskCache(directory, 3 * 1016 + 64)
    if role == "download":  # killed inside download(): holds the block's download lock
        cache.fetch("k", 1000, lambda: (Path(ready).touch(), time.sleep(600), b"")[-1])
    elif role == "pin":  # killed while using a cached block
        cache.pin("p")
        cache.fetch("p", 1000, lambda: b"p" * 1000)
        Path(ready).touch()
    else:  # killed between reserving space and publishing the block
        import gristmill.loaders.cache  # noqa: F401
        from gristmill import loaders

        loaders.cache.os.replace = lambda *_: (Path(ready).touch(), time.sleep(600))
        cache.put("w", b"w" * 1000)
    time.sleep(600)


def _killed_holding(directory: str, role: str, tmp_path: Path) -> None:
    ready = tmp_path / f"{role}.ready"
    process = SPAWN.Process(target=_hold_then_hang, args=(directory, role, str(ready)))
    process.start()
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists()
    if role == "pin":  # while it lives, its block survives any pressure to evict
        cache = DiskCache(directory, 3 * 1016 + 64)
        for index in range(4):
            cache.put(f"x{index}", b"x" * 1000)
        assert cache.get("p") == b"p" * 1000
        assert _cache_files(directory) <= cache.max_bytes
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)


def test_a_process_killed_holding_a_block_wedges_nothing_and_the_bound_holds(tmp_path: Path) -> None:
    directory = str(tmp_path / "cache")
    bound = 3 * 1016 + 64  # three blocks of 1000 bytes and their digests, and the usage file
    for role in ("download", "pin", "write"):
        _killed_holding(directory, role, tmp_path)
    cache = DiskCache(directory, bound)
    # the download lock died with its holder: this process downloads the block itself
    assert cache.fetch("k", 1000, lambda: b"k" * 1000) == (b"k" * 1000, False)
    for index in range(6):  # pressure: the dead process's pin and half-written block no longer count
        assert cache.put(f"y{index}", b"y" * 1000)
    assert cache.get("p") is None and cache.get(f"y{5}") == b"y" * 1000
    assert _cache_files(directory) <= bound and cache.used_bytes <= bound
    assert not [name for name in os.listdir(directory) if name.startswith((".tmp-", ".dl-")) and "usage" not in name]


# -- the bound under writers in several processes -----------------------------------------------------
def _fill(directory: str, prefix: str, queue: multiprocessing.Queue) -> None:
    cache = DiskCache(directory, 10 * 1016 + 64)
    stored = sum(cache.put(f"{prefix}{index}", os.urandom(1000)) for index in range(40))
    queue.put(stored)


def test_concurrent_writers_keep_the_cache_within_its_bound(tmp_path: Path) -> None:
    directory, queue = str(tmp_path / "cache"), SPAWN.Queue()
    processes = [SPAWN.Process(target=_fill, args=(directory, prefix, queue)) for prefix in "ab"]
    for process in processes:
        process.start()
    assert [queue.get(timeout=60) for _ in processes] == [40, 40]
    for process in processes:
        process.join(30)
    assert _cache_files(directory) <= 10 * 1016 + 64
    assert DiskCache(directory, 10 * 1016 + 64).used_bytes == _cache_files(directory, ".blk")


# -- hostile directory contents -------------------------------------------------------------------------
SQUATTERS = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=3000)),
    st.tuples(st.just("truncated"), st.integers(0, 1015)),
    st.tuples(st.just("other-key"), st.just(0)),
    st.tuples(st.just("flipped"), st.integers(0, 1015)),
    st.tuples(st.just("directory"), st.just(0)),
    st.tuples(st.just("symlink"), st.just(0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(squatter=SQUATTERS, extra=st.lists(st.tuples(st.text("abcdef.-_", min_size=1, max_size=12),
                                                    st.binary(max_size=200)), max_size=4))
def test_foreign_garbage_or_truncated_files_are_never_served(squatter: tuple[str, object],
                                                             extra: list[tuple[str, bytes]]) -> None:
    truth = bytes(range(250)) * 4
    with tempfile.TemporaryDirectory() as directory:
        cache = DiskCache(directory, 1 << 20)
        assert cache.put("other", b"o" * 1000) and cache.put("k", truth)
        good = Path(directory, "k.blk").read_bytes()
        target = Path(directory, "k.blk")
        target.unlink()
        kind, value = squatter
        if kind == "bytes":
            target.write_bytes(value)
        elif kind == "truncated":
            target.write_bytes(good[:value])
        elif kind == "other-key":
            target.write_bytes(Path(directory, "other.blk").read_bytes())
        elif kind == "flipped":
            target.write_bytes(good[:value] + bytes([good[value] ^ 1]) + good[value + 1:])
        elif kind == "directory":
            target.mkdir()
        else:
            outside = Path(directory, "..", f"outside-{os.getpid()}").resolve()
            outside.write_bytes(good)
            target.symlink_to(outside)
        for name, content in extra:
            if name not in (".", "..") and not os.path.exists(os.path.join(directory, name)):
                Path(directory, name).write_bytes(content)
        data, hit = cache.fetch("k", len(truth), lambda: truth)
        assert data == truth and not hit
        if kind != "directory":  # the damaged file was replaced: the next read is a hit of the right bytes
            assert cache.fetch("k", len(truth), lambda: b"wrong") == (truth, True)
        if kind == "symlink":
            outside.unlink()
