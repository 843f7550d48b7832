"""The service's index as columns: sorted key tables in RAM, per-document rows in a memory-mapped file.

Per document the service keeps, in RAM, only what a lookup searches: one (uint64 key, uint32 doc)
pair per LSH band (band hashes are salted with the band number, so all bands share one table) and
one for the exact hash (its top 64 bits), plus the id in Arrow. About ``12 * (bands + 1)`` bytes
plus the id: ~200 B at the default 14 bands. The signature, content hash and length of every
document live in :class:`RowStore`, a file on local disk that is memory-mapped and read only for
the few candidates a lookup finds.

A :class:`KeyTable` is sorted arrays searched with ``np.searchsorted``: the *main* table cut into
256 buckets by the key's top byte (so folding new keys into it never needs a second copy of the
whole table, only of one bucket), a few sorted *runs* of recent keys (merged like a binary counter,
so there are O(log n) of them), and *deltas*, dicts of the newest keys. Inserts go to the active
delta; :meth:`KeyTable.freeze` closes it, and the background work (:meth:`KeyTable.sort_frozen`,
:meth:`KeyTable.merge_runs`, :meth:`KeyTable.fold_into_main`) turns deltas into runs and runs into
the main table. Every piece is immutable once built, so a lookup sees either the old or the new
piece and answers the same either way.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

BUCKET_BITS = 8
BUCKETS = 1 << BUCKET_BITS
BUCKET_SHIFT = np.uint64(64 - BUCKET_BITS)
MAX_DOCS = 1 << 32  # a table names a document by a uint32: the most documents one index (shard) holds
ROW_HEAD = 3  # a row is content hash (two uint64), length, then the signature


@dataclass(frozen=True)
class Run:
    """Sorted keys with the document of each, never changed once built."""

    keys: np.ndarray  # uint64, ascending
    docs: np.ndarray  # uint32, parallel

    def __len__(self) -> int:
        return len(self.keys)

    def find(self, key: np.uint64) -> np.ndarray:
        lo = np.searchsorted(self.keys, key, "left")
        hi = np.searchsorted(self.keys, key, "right")
        return self.docs[lo:hi]

    @staticmethod
    def empty() -> Run:
        return Run(np.zeros(0, np.uint64), np.zeros(0, np.uint32))

    @staticmethod
    def sorted_from(keys: np.ndarray, docs: np.ndarray) -> Run:
        order = np.argsort(keys, kind="stable")
        return Run(keys[order], docs[order].astype(np.uint32))


def merge(a: Run, b: Run) -> Run:
    """Two runs as one, in O(len(a) + len(b)) without sorting: b's keys are placed among a's."""
    at = np.searchsorted(a.keys, b.keys, "right") + np.arange(len(b), dtype=np.int64)
    keys = np.empty(len(a) + len(b), np.uint64)
    docs = np.empty(len(keys), np.uint32)
    from_a = np.ones(len(keys), bool)
    from_a[at] = False
    keys[at], docs[at] = b.keys, b.docs
    keys[from_a], docs[from_a] = a.keys, a.docs
    return Run(keys, docs)


def bucket_bounds(keys: np.ndarray) -> np.ndarray:
    """Where each of the 256 top-byte buckets starts and ends in sorted ``keys`` (257 offsets)."""
    starts = np.arange(BUCKETS + 1, dtype=np.uint64)
    bounds = np.searchsorted(keys >> BUCKET_SHIFT, starts[:-1], "left")
    return np.append(bounds, len(keys))


@dataclass
class Delta:
    """The newest keys: a dict for lookups plus the same pairs as lists, to sort when it is frozen."""

    index: dict[int, Any] = field(default_factory=dict)  # key -> doc, or a list of docs when shared
    keys: list[int] = field(default_factory=list)
    docs: list[int] = field(default_factory=list)

    def add(self, key: int, doc: int) -> None:
        held = self.index.get(key)
        if held is None:
            self.index[key] = doc
        elif isinstance(held, list):
            held.append(doc)
        else:
            self.index[key] = [held, doc]
        self.keys.append(key)
        self.docs.append(doc)

    def remove_last(self) -> None:
        """Undo the newest :meth:`add` (a batch whose log append failed)."""
        key, doc = self.keys.pop(), self.docs.pop()
        held = self.index[key]
        if isinstance(held, list):
            held.remove(doc)
            if len(held) == 1:
                self.index[key] = held[0]
        else:
            del self.index[key]

    def find(self, key: int) -> list[int]:
        held = self.index.get(key)
        return [] if held is None else held if isinstance(held, list) else [held]

    def to_run(self) -> Run:
        return Run.sorted_from(np.array(self.keys, np.uint64), np.array(self.docs, np.uint32))


class KeyTable:
    """A multimap from uint64 keys to documents: main buckets, sorted runs, and dict deltas.

    Inserts, :meth:`freeze` and lookups run on one thread (the service's event loop); the background
    steps run on one other thread. Runs and frozen deltas are published together as one tuple, so a
    lookup never sees a delta gone before its run arrived.
    """

    def __init__(self, main: list[Run] | None = None, runs: list[Run] | None = None) -> None:
        self.main: list[Run] = main if main is not None else [Run.empty() for _ in range(BUCKETS)]
        if len(self.main) != BUCKETS:
            raise ValueError(f"a key table has {BUCKETS} main buckets, not {len(self.main)}")
        self.recent: tuple[tuple[Run, ...], tuple[Delta, ...]] = (tuple(runs or ()), ())
        self.delta = Delta()
        self._lock = threading.Lock()

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Every document stored under any of ``keys`` (with repeats)."""
        runs, frozen = self.recent
        deltas = (*frozen, self.delta)
        found: list[Any] = []
        for key in np.asarray(keys, np.uint64):
            found.append(self.main[int(key >> BUCKET_SHIFT)].find(key))
            found.extend(run.find(key) for run in runs)
            as_int = int(key)
            found.extend(np.asarray(d.find(as_int), np.uint32) for d in deltas if as_int in d.index)
        return np.concatenate(found).astype(np.int64)

    def add(self, keys: np.ndarray, doc: int) -> None:
        for key in keys.tolist():
            self.delta.add(key, doc)

    def remove_last(self, count: int) -> None:
        for _ in range(count):
            self.delta.remove_last()

    def freeze(self) -> None:
        """Close the active delta; it stays searchable until :meth:`sort_frozen` has made it a run."""
        if self.delta.keys:
            with self._lock:
                runs, frozen = self.recent
                self.recent = (runs, (*frozen, self.delta))
            self.delta = Delta()

    def _replace(self, old_runs: tuple[Run, ...], new_run: Run | None, done: Delta | None = None) -> None:
        with self._lock:
            runs, frozen = self.recent
            kept = tuple(r for r in runs if not any(r is o for o in old_runs))
            self.recent = ((*kept, new_run) if new_run is not None else kept,
                           tuple(d for d in frozen if d is not done))

    # -- background steps: each computes from immutable pieces, then publishes with one swap -------
    def sort_frozen(self, todo: tuple[Delta, ...] | None = None) -> None:
        """Turn the deltas ``todo`` (default: every one frozen so far) into sorted runs, merging runs
        while the newest is at least half the size of the one before it (a binary counter: O(log n) runs)."""
        for delta in self.recent[1] if todo is None else todo:
            if not any(delta is waiting for waiting in self.recent[1]):
                continue  # sorted by an earlier step
            self._replace((), delta.to_run(), done=delta)
            runs = self.recent[0]
            while len(runs) >= 2 and 2 * len(runs[-1]) >= len(runs[-2]):
                self._replace(runs[-2:], merge(runs[-2], runs[-1]))
                runs = self.recent[0]

    def fold_into_main(self) -> None:
        """Merge every run into the main buckets, one bucket at a time: the extra memory is one
        bucket's worth. A lookup meanwhile may find a key both in its new bucket and its run; the
        caller takes unique documents, so the answer is the same."""
        runs = self.recent[0]
        if not runs:
            return
        combined = runs[0]
        for run in runs[1:]:
            combined = merge(combined, run)
        bounds = bucket_bounds(combined.keys)
        for bucket in range(BUCKETS):
            lo, hi = bounds[bucket], bounds[bucket + 1]
            if hi > lo:
                self.main[bucket] = merge(self.main[bucket], Run(combined.keys[lo:hi], combined.docs[lo:hi]))
        self._replace(runs, None)

    def needs_fold(self, ratio: int = 8) -> bool:
        """Whether the runs hold enough keys that folding them into main is worth a pass over it."""
        in_runs = sum(map(len, self.recent[0]))
        return in_runs > 0 and ratio * in_runs >= sum(map(len, self.main))

    def pieces(self) -> list[Run]:
        """The sorted pieces a snapshot writes: the main buckets then the runs."""
        return [*self.main, *self.recent[0]]


class IdColumn:
    """Document ids in Arrow chunks, plus a Python list of the newest until :meth:`seal` makes it a chunk."""

    def __init__(self, chunks: list[pa.Array] | None = None) -> None:
        self.chunks: list[pa.Array] = []
        self.ends = np.zeros(0, np.int64)
        self.fresh: list[str] = []
        for chunk in chunks or []:
            self.append_chunk(chunk)

    def __len__(self) -> int:
        return (int(self.ends[-1]) if len(self.ends) else 0) + len(self.fresh)

    def append_chunk(self, chunk: pa.Array) -> None:
        if len(chunk):
            self.chunks.append(chunk)
            self.ends = np.append(self.ends, (self.ends[-1] if len(self.ends) else 0) + len(chunk))

    def __getitem__(self, doc: int) -> str:
        sealed = int(self.ends[-1]) if len(self.ends) else 0
        if doc >= sealed:
            return self.fresh[doc - sealed]
        chunk = int(np.searchsorted(self.ends, doc, "right"))
        start = int(self.ends[chunk - 1]) if chunk else 0
        return self.chunks[chunk][doc - start].as_py()

    def seal(self) -> None:
        if self.fresh:
            self.append_chunk(pa.array(self.fresh, pa.string()))
            self.fresh = []

    def slice(self, start: int, stop: int) -> pa.Array:
        """Ids ``start:stop`` (all sealed) as one Arrow array."""
        parts = []
        for chunk, end in zip(self.chunks, self.ends.tolist(), strict=True):
            begin = end - len(chunk)
            lo, hi = max(start, begin), min(stop, end)
            if hi > lo:
                parts.append(chunk.slice(lo - begin, hi - lo))
        return pa.concat_arrays(parts) if parts else pa.array([], pa.string())


class RowStore:
    """One fixed-width uint64 row per document (content hash, length, signature) in a file, mapped.

    Rows are written through the mapping and reach the disk when the kernel writes them back or
    :meth:`flush` forces it; the insert log, not this file, is what makes an insert durable, so a
    crash may leave this file's tail stale, and a restart rewrites the rows after its snapshot.
    A mapping is never closed while in use: growing maps the file anew, and an old mapping goes
    when the last array viewing it does.

    Every row is given disk blocks (``posix_fallocate``) before it is written: a store through a
    mapping onto a hole that the disk has no block for is SIGBUS, which kills the process, while an
    allocation that does not fit is an ``OSError`` (ENOSPC) the caller can refuse the insert with.
    """

    GROW_ROWS = 1024

    def __init__(self, path: str, width: int) -> None:
        self.path = path
        self.width = width
        self.count = 0
        self.backed = 0  # rows known to have their blocks: an older file may be sparse
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # held open for the index's life
        self.rows = np.zeros((0, width), np.uint64)
        self._map(os.fstat(self._fd).st_size // self.row_bytes)

    @property
    def row_bytes(self) -> int:
        return 8 * self.width

    def capacity(self) -> int:
        return len(self.rows)

    def _map(self, rows: int) -> None:
        if rows:
            mapping = mmap.mmap(self._fd, rows * self.row_bytes)
            self.rows = np.frombuffer(mapping, np.uint64).reshape(rows, self.width)

    def reserve(self, rows: int) -> None:
        """Blocks for ``rows`` rows, grown in steps of an eighth so appends stay amortised O(1); when a
        step does not fit (disk full, a file size limit) exactly ``rows``; OSError if even that fails.
        A file longer than its mapping (what a failed allocation may leave) is harmless: rows past
        the mapping are never read."""
        if rows <= self.backed:
            return
        step = self.capacity() if rows <= self.capacity() else self.capacity() + max(self.GROW_ROWS, self.capacity() // 8)
        for target in (max(rows, step), rows):
            try:
                os.posix_fallocate(self._fd, self.backed * self.row_bytes, (target - self.backed) * self.row_bytes)
                break
            except OSError:
                if target == rows:
                    raise
        self.backed = target
        if target > self.capacity():
            self._map(target)

    def append(self, block: np.ndarray) -> None:
        """Write rows after the last one."""
        need = self.count + len(block)
        self.reserve(need)
        self.rows[self.count : need] = block
        self.count = need

    def truncate(self, count: int) -> None:
        self.count = count

    def flush(self) -> None:
        """Make every row written so far durable (a shared mapping's pages are the file's pages)."""
        os.fsync(self._fd)

    def close(self) -> None:
        self.rows = np.zeros((0, self.width), np.uint64)
        os.close(self._fd)


def return_freed_memory() -> None:
    """Make freed large arrays go back to the system at once, so resident memory follows the index.

    glibc raises its mmap threshold after large frees, after which a loader's freed temporaries stay
    in the heap (about 450 B/doc resident after loading 1 M documents, against 250 with a fixed
    threshold); Arrow's default pool keeps freed batches too. Linux/glibc only; elsewhere a no-op.
    Process-wide, so it is called where a process serves an index and nothing else (``gristmill
    serve``, a shard's actor), never by a library constructor.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    mallopt = getattr(ctypes.CDLL(name), "mallopt", None) if name else None
    if mallopt is not None:
        mallopt(-3, 1 << 17)  # M_MMAP_THRESHOLD: arrays of 128 KiB and more are mapped, and unmapped when freed
    pa.set_memory_pool(pa.system_memory_pool())


def hash_words(content_hashes: list[str]) -> np.ndarray:
    """32-hex content hashes as an (n, 2) uint64 array: the high then the low 64 bits."""
    raw = np.frombuffer(bytes.fromhex("".join(content_hashes)), dtype=">u8").reshape(-1, 2)
    return raw.astype(np.uint64)


def hash_hex(words: np.ndarray) -> list[str]:
    """The inverse of :func:`hash_words`."""
    raw = np.ascontiguousarray(words, dtype=">u8").tobytes().hex()
    return [raw[i : i + 32] for i in range(0, len(raw), 32)]
