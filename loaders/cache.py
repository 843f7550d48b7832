"""The node-local block cache: one directory shared by every rank and DataLoader worker on a machine.

Remote corpora are read block by block; without sharing, 8 ranks x 2 workers on a node each fetch
their own copy of a footer or block. Here the processes coordinate through the directory alone, with
``flock`` locks, which the kernel releases when a process dies (SIGKILL included), so nothing a dead
process held can wedge the others:

* ``<key>.blk``: a block's bytes followed by their xxh3-128 digest, written to a temporary name and
  renamed into place. A reader holds a shared lock on the file while reading it (and while the block
  is pinned); a file whose size or digest is wrong (torn, foreign, garbage) is a miss, never data.
* ``.dl-<key>``: held exclusively by the one process downloading a missing block; the others wait on
  it and then read the block from the cache. One download per node.
* ``.lock`` and ``.usage``: the directory-wide lock and the bytes in use (reserved before a block is
  written, so the bound holds even for a writer killed half way). When a block would not fit, the
  least recently used ``.blk`` files are removed, down to 90% of the bound, skipping every file some
  process holds a shared lock on; if only those remain the new block is simply not cached.
* ``.tmp-<bytes>-<id>``: a block being written, locked by its writer for as long as it writes; its
  reservation counts only while that lock is held, so a name nobody holds (a stray file, a dead
  writer's) reserves nothing and is removed by the next recount.

The cache is an optimisation, never a source of errors: a full disk, a directory that refuses a
file, or bookkeeping that is unreadable or out of range makes a block "not cached" (the caller reads
it from storage), and ``.usage`` is re-derived from the files whenever it cannot be trusted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import uuid
from collections.abc import Callable

import xxhash

DIGEST_BYTES = 16
LOW_WATER = 0.9  # an eviction pass frees down to this share of the bound, so passes are rare
TEMPORARY = ".tmp-"  # the prefix of files being written
BOOKKEEPING_BYTES = 64  # the usage file (and its replacement while written) counts against the bound too


class DiskCache:
    """A size-bounded block cache in a local directory, safe to share between processes (see the module)."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._capacity = max_bytes - BOOKKEEPING_BYTES  # for blocks and writes in progress
        os.makedirs(directory, exist_ok=True)
        self._lock = threading.Lock()
        self._pins: dict[str, int] = {}
        self._held: dict[str, int] = {}  # pinned key -> descriptor holding a shared lock on its file
        self._recounted = False  # this process recounts once before trusting ``.usage``

    # -- paths and locks ---------------------------------------------------------------------------
    def _path(self, key: str) -> str:
        return os.path.join(self.directory, f"{key}.blk")

    def _open_locked(self, key: str) -> int | None:
        """A descriptor on the block's file holding a shared lock, or None when there is no such file."""
        try:
            fd = os.open(self._path(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # absent, or a symbolic link someone put there
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            if os.fstat(fd).st_nlink:
                return fd
        except OSError:  # a file system without locks
            pass
        os.close(fd)  # evicted between open and lock: its space is about to be freed
        return None

    def _exclusive(self, path: str) -> int:
        """An exclusive lock on ``path`` (created if needed), retried until the file locked is the one there."""
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)

    # -- reading ------------------------------------------------------------------------------------
    def _read(self, key: str, size: int | None) -> bytes | None:
        """The block's bytes if its file is whole (size and digest), else None; keeps the lock if pinned."""
        fd = self._open_locked(key)
        if fd is None:
            return None
        keep = False
        try:
            with open(fd, "rb", closefd=False) as handle:
                payload = handle.read()
            data, digest = payload[:-DIGEST_BYTES], payload[-DIGEST_BYTES:]
            if len(payload) < DIGEST_BYTES or (size is not None and len(data) != size) \
                    or _digest(key, data) != digest:
                return None
            with contextlib.suppress(OSError):  # a read-only directory: the block is still good
                os.utime(fd)  # recency for eviction
            with self._lock:
                keep = key in self._pins and key not in self._held
                if keep:
                    self._held[key] = fd
            return data
        except OSError:  # not a regular file (a directory put there)
            return None
        finally:
            if not keep:
                os.close(fd)

    def _hold(self, key: str) -> None:
        """Take the shared lock a pin keeps on the block's file, once the file exists."""
        with self._lock:
            if key not in self._pins or key in self._held:
                return
        fd = self._open_locked(key)
        if fd is None:
            return
        with self._lock:
            if key in self._pins and key not in self._held:
                self._held[key], fd = fd, None
        if fd is not None:
            os.close(fd)

    def get(self, key: str) -> bytes | None:
        """The cached block, or None when absent or damaged."""
        return self._read(key, None)

    def fetch(self, key: str, size: int, download: Callable[[], bytes]) -> tuple[bytes, bool]:
        """The block under ``key`` (``size`` bytes) and whether it came from the cache (this process's
        or another's download). When several processes miss the same block at once, one downloads."""
        data = self._read(key, size)
        if data is not None:
            return data, True
        if size + DIGEST_BYTES > self._capacity:
            return download(), False
        lock_path = os.path.join(self.directory, f".dl-{key}")
        try:
            fd = self._exclusive(lock_path)
        except OSError:  # the directory refuses even a lock file: not cached
            return download(), False
        try:
            data = self._read(key, size)
            if data is not None:
                return data, True
            data = download()
            self.put(key, data)
            self._hold(key)
            return data, False
        finally:
            _remove(lock_path)
            os.close(fd)

    # -- pins -----------------------------------------------------------------------------------------
    def pin(self, key: str) -> None:
        """Keep ``key`` from eviction by any process until :meth:`unpin` (from when it is cached)."""
        with self._lock:
            self._pins[key] = self._pins.get(key, 0) + 1
        self._hold(key)

    def unpin(self, key: str) -> None:
        with self._lock:
            left = self._pins.get(key, 0) - 1
            if left > 0:
                self._pins[key] = left
                return
            self._pins.pop(key, None)
            fd = self._held.pop(key, None)
        if fd is not None:
            os.close(fd)

    # -- writing and eviction -----------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> bool:
        """Store a block; False when it cannot fit without evicting a block some process is using (or the
        directory refuses the file)."""
        size = len(data) + DIGEST_BYTES
        if size > self._capacity:
            return False
        temporary = os.path.join(self.directory, f"{TEMPORARY}{size}-{uuid.uuid4().hex}")
        try:
            fd = self._reserve(size, temporary)
        except OSError:  # a full disk, or a directory that refuses the bookkeeping
            return False
        if fd is None:
            return False
        try:
            with open(fd, "wb", closefd=False) as handle:
                handle.write(data)
                handle.write(_digest(key, data))
            os.replace(temporary, self._path(key))
            return True
        except OSError:  # a full disk, a directory squatting on the block's name, unusable bookkeeping
            self._release(size)
            return False
        finally:
            _remove(temporary)  # gone already once renamed into place
            os.close(fd)

    @property
    def used_bytes(self) -> int:
        """Bytes the cache counts as used on this node (blocks plus writes in progress)."""
        fd = self._exclusive(os.path.join(self.directory, ".lock"))
        try:
            return self._usage()
        finally:
            os.close(fd)

    def _usage(self) -> int:
        """The bytes in use as ``.usage`` records them, or recounted from the files when that record is
        missing, unreadable or out of range (negative, above the bound, not a number), and once by
        each cache object before it trusts the record at all (a value in range may still be stale)."""
        if not self._recounted:
            return self._scan(evict_to=None)
        try:
            fd = os.open(os.path.join(self.directory, ".usage"), os.O_RDONLY | os.O_NONBLOCK)  # a FIFO: no wait
            try:
                text = os.read(fd, 32)
            finally:
                os.close(fd)
            if text.isdigit() and int(text) <= self._capacity:
                return int(text)
        except OSError:
            pass
        return self._scan(evict_to=None)

    def _set_usage(self, used: int) -> None:
        temporary = os.path.join(self.directory, f"{TEMPORARY}usage-{os.getpid()}")
        try:
            with open(temporary, "w") as handle:
                handle.write(str(used))
            os.replace(temporary, os.path.join(self.directory, ".usage"))
        except OSError:
            _remove(temporary)
            raise

    def _reserve(self, size: int, temporary: str) -> int | None:
        """Room for ``size`` bytes, taken under the directory lock together with ``temporary``, created
        and locked (so a recount sees both or neither); its descriptor, or None when it does not fit."""
        lock = self._exclusive(os.path.join(self.directory, ".lock"))
        try:
            used = self._usage()
            if used + size > self._capacity:
                used = self._scan(evict_to=int(self._capacity * LOW_WATER) - size)
            if used + size > self._capacity:
                return None
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # held while writing: the reservation counts while it is
                self._set_usage(used + size)
            except OSError:
                os.close(fd)
                _remove(temporary)
                raise
            return fd
        finally:
            os.close(lock)

    def _release(self, size: int) -> None:
        """Give back a reservation; if even that fails, ``.usage`` overstates, which the next recount mends."""
        try:
            fd = self._exclusive(os.path.join(self.directory, ".lock"))
        except OSError:
            return
        try:
            self._set_usage(max(0, self._usage() - size))
        except OSError:
            pass
        finally:
            os.close(fd)

    def _scan(self, evict_to: int | None) -> int:
        """Recount the directory (called under the directory lock), clearing what dead processes left;
        with ``evict_to``, remove the least recently used unlocked blocks until at most that is used."""
        blocks, used = [], 0
        for entry in os.scandir(self.directory):
            name = entry.name
            if not entry.is_file(follow_symlinks=False):
                continue  # not a file this cache writes: neither counted nor touched
            if name.startswith(TEMPORARY):
                if not _remove_unlocked(entry.path):  # a writer at work: what it reserved, at most the bound
                    used += min(_reserved(name), self._capacity)
            elif name.startswith(".dl-"):
                _remove_unlocked(entry.path)
            elif name.endswith(".blk"):
                stat = entry.stat(follow_symlinks=False)
                blocks.append((stat.st_mtime_ns, entry.path, stat.st_size))
                used += stat.st_size
        if evict_to is not None:
            for _, path, size in sorted(blocks):
                if used <= evict_to:
                    break
                if _remove_unlocked(path):
                    used -= size
        with contextlib.suppress(OSError):  # a full disk: the count stands, the record waits for room
            self._set_usage(used)
            self._recounted = True
        return used


def _digest(key: str, data: bytes) -> bytes:
    """xxh3-128 of the key and the bytes: a whole file copied under another block's name is a miss too."""
    hasher = xxhash.xxh3_128(key.encode("utf-8") + b"\0")
    hasher.update(data)
    return hasher.digest()


def _reserved(name: str) -> int:
    """The bytes a block being written reserved, from its name ``.tmp-<bytes>-<id>``; 0 for another form."""
    parts = name[len(TEMPORARY) :].split("-")
    return int(parts[0]) if len(parts) == 2 and parts[0].isdigit() else 0


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _remove_unlocked(path: str) -> bool:
    """Remove ``path`` unless some process holds a lock on it; True when removed."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        os.remove(path)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)
