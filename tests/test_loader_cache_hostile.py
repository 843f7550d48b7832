"""The node cache when the disk fills up or its bookkeeping is hostile: never an error, never past its bound.

A real small file system (a tmpfs mounted in the test) that the cache fills; ``.usage`` records and
stray temporary names generated with hypothesis.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from small_disk import fill, small_disk

from gristmill.loaders import DiskCache, StreamingLoader
from tests.test_loader import make_corpus

pytestmark = pytest.mark.timeout(300)
BLOCK = 1000
STORED = BLOCK + 16  # a block and its digest
BOUND = 5 * STORED + 64  # five blocks and the usage file


def _bytes_of(directory: str, prefix: str = "", suffix: str = "") -> int:
    return sum(e.stat().st_size for e in os.scandir(directory)
               if e.is_file() and e.name.startswith(prefix) and e.name.endswith(suffix))


@pytest.mark.parametrize("leave", [0, 64 * 1024], ids=["full", "nearly-full"])
def test_a_full_disk_leaves_blocks_uncached_and_the_epoch_whole(tmp_path: Path, leave: int) -> None:
    texts = make_corpus(str(tmp_path / "corpus"), 2000, seed=3)
    with small_disk(tmp_path / "cache", "2m") as disk:
        DiskCache(str(disk), 1 << 30).put("first", b"f" * BLOCK)  # its bookkeeping made while there was room
        fill(disk, "filler", leave)
        loader = StreamingLoader(str(tmp_path / "corpus"), batch_size=16, columns=["text"],
                                 cache_dir=str(disk), cache_bytes=1 << 30)
        for _ in range(2):
            assert sorted(t for batch in loader for t in batch["text"]) == sorted(texts)
        cached = [name for name in os.listdir(disk) if name.endswith(".blk")]
        assert (loader.counters.as_dict()["cache_hits"] > 0) == (len(cached) > 1)
        assert leave == 0 or len(cached) > 1  # with some room, some blocks were cached
        assert not [name for name in os.listdir(disk) if name.startswith((".tmp-", ".dl-"))]
        assert DiskCache(str(disk), 1 << 30).used_bytes == _bytes_of(str(disk), suffix=".blk")


USAGE_RECORDS = st.one_of(
    st.integers(-(10**20), 10**20).map(lambda n: str(n).encode()),  # negative, beyond the bound
    st.binary(max_size=40),
    st.sampled_from([b"", b" 12", b"1e9", b"0x10", "٣".encode(), b"9" * 400]),
)
STRAY_TEMPORARIES = st.lists(
    st.builds(lambda pid, size, old: f".tmp-{pid}-{size}-stray" if old else f".tmp-{size}-stray",
              st.sampled_from([os.getpid(), 1]), st.integers(0, 10**18), st.booleans()),
    max_size=3, unique=True)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(usage=USAGE_RECORDS, strays=STRAY_TEMPORARIES, blocks_before=st.integers(0, 7), reopened=st.booleans())
def test_hostile_bookkeeping_is_recounted_and_the_bound_holds(usage: bytes, strays: list[str],
                                                              blocks_before: int, reopened: bool) -> None:
    # a record in range but wrong is trusted by a running cache until its next recount; one that
    # opens the directory recounts first
    assume(reopened or not (usage.isdigit() and int(usage) <= BOUND - 64))
    with tempfile.TemporaryDirectory() as directory:
        cache = DiskCache(directory, BOUND)
        for index in range(blocks_before):
            assert cache.put(f"old{index}", b"o" * BLOCK)
        Path(directory, ".usage").write_bytes(usage)
        for name in strays:  # a name nobody is writing: it reserves nothing
            Path(directory, name).write_bytes(b"")
        if reopened:  # a process opening the cache as a crash or someone else left it
            cache = DiskCache(directory, BOUND)
        for index in range(8):  # room for five: each fits once older blocks are evicted
            assert cache.put(f"new{index}", bytes([index]) * BLOCK)
            assert _bytes_of(directory, suffix=".blk") <= BOUND - 64
        assert cache.get("new7") == bytes([7]) * BLOCK
        assert cache.used_bytes == _bytes_of(directory, suffix=".blk")


@settings(max_examples=20, deadline=None)
@given(squatted=st.lists(st.sampled_from([".usage", ".lock", ".dl-k", ".tmp-99-x", "k.blk"]), min_size=1,
                         max_size=5, unique=True))
def test_squatted_bookkeeping_names_mean_not_cached(squatted: list[str]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        cache = DiskCache(directory, BOUND)
        for name in squatted:  # directories where the cache keeps its files
            os.mkdir(os.path.join(directory, name))
        assert cache.fetch("k", BLOCK, lambda: b"k" * BLOCK) == (b"k" * BLOCK, False)
        cache.pin("k")
        assert cache.get("k") in (None, b"k" * BLOCK)
        cache.unpin("k")
        assert cache.put("other", b"o" * BLOCK) == (".usage" not in squatted and ".lock" not in squatted)


@pytest.mark.timeout(60)
def test_fifos_squatting_on_the_cache_names_are_never_waited_on(tmp_path: Path) -> None:
    directory = str(tmp_path / "cache")
    cache = DiskCache(directory, BOUND)
    assert cache.put("first", b"f" * BLOCK)  # recounted once: from now on this cache reads .usage
    os.remove(os.path.join(directory, ".usage"))
    os.mkfifo(os.path.join(directory, ".usage"))
    os.mkfifo(os.path.join(directory, "k.blk"))
    assert cache.fetch("k", BLOCK, lambda: b"k" * BLOCK) == (b"k" * BLOCK, False)
    assert DiskCache(directory, BOUND).put("other", b"o" * BLOCK)
    assert cache.used_bytes == _bytes_of(directory, suffix=".blk")


def test_without_locks_or_access_times_a_block_is_read_from_storage(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    import gristmill.loaders.cache  # noqa: F401
    from gristmill import loaders

    cache = DiskCache(str(tmp_path / "cache"), BOUND)
    assert cache.put("k", b"k" * BLOCK)

    def refuse(*_: object) -> None:
        raise OSError(errno.EROFS, "read-only file system")

    monkeypatch.setattr(os, "utime", refuse)  # a read-only cache directory: a good block is still a hit
    assert cache.fetch("k", BLOCK, lambda: b"wrong") == (b"k" * BLOCK, True)

    def no_locks(*_: object) -> None:
        raise OSError(errno.ENOLCK, "no locks available")

    monkeypatch.setattr(loaders.cache.fcntl, "flock", no_locks)  # a file system without flock
    assert cache.fetch("k", BLOCK, lambda: b"k" * BLOCK) == (b"k" * BLOCK, False)
    assert cache.fetch("new", BLOCK, lambda: b"n" * BLOCK) == (b"n" * BLOCK, False)
    assert not cache.put("new", b"n" * BLOCK)
