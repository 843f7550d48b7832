"""Partitioned files: one task's rows for many destinations in one file, sorted by destination, with an
index from which a reader finds its destination's bytes and fetches only those (ranged reads).

Why: the shuffles wrote one file per (map task, partition), 28,014 work files for 100k documents at
200 splits, and routing from splits to splits made up to S x S. With one file per writing task a
shuffle writes S + P files whatever the data; a reader fetches its part of each with two small reads
(the tail, its index entry) and one read per run of its bytes.

Layout (integers are little-endian int64)::

    segment ... segment | index | index offset, runs, destinations | MAGIC

A segment is one Arrow IPC stream (zstd buffers) holding one destination's rows of one run. A writer
whose buffered rows pass its byte budget writes them out as a run and goes on, so a task holds at most
a budget of rows however many it sends; a destination has at most one segment per run. The index
holds, destination-major, the [start, end) byte range of each destination's segment in each run
(start == end: none), so destination d's ranges are the 16 x runs bytes at index offset + 16 x runs x d.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

MAGIC = b"GMPART01"
_TAIL = struct.Struct("<qqq8s")
_IPC = pa.ipc.IpcWriteOptions(compression="zstd")


class PartitionedWriter:
    """Writes rows with their destination numbers into one partitioned file (see the module); a run
    each time the buffered rows reach ``budget_bytes`` (None: one run at the end).

    ``destinations`` fixes the number of destinations (a hash shuffle's partitions); None takes the
    largest destination written plus one (routing to splits), and a reader asking for a destination
    beyond it gets no rows.
    """

    def __init__(self, handle: BinaryIO, destinations: int | None, budget_bytes: int | None) -> None:
        self._handle = handle
        self._destinations = destinations
        self._budget = budget_bytes
        self._tables: list[pa.Table] = []
        self._targets: list[np.ndarray] = []
        self._buffered = 0
        self._position = 0
        self._runs: list[np.ndarray] = []  # per run: (destinations seen, 2) byte ranges

    def write(self, table: pa.Table, destination: np.ndarray) -> None:
        """Add rows; ``destination[i]`` is the destination of row i."""
        destination = np.asarray(destination, dtype=np.int64)
        if destination.shape != (table.num_rows,):
            raise ValueError(f"{table.num_rows} rows but {destination.shape} destinations")
        if not table.num_rows:
            return
        low, high = int(destination.min()), int(destination.max())
        if low < 0 or (self._destinations is not None and high >= self._destinations):
            raise ValueError(f"destinations {low}..{high} outside 0..{(self._destinations or high + 1) - 1}")
        self._tables.append(table)
        self._targets.append(destination)
        self._buffered += table.nbytes
        if self._budget is not None and self._buffered >= self._budget:
            self._flush()

    def _flush(self) -> None:
        """The buffered rows as one run: a segment per destination that has rows."""
        if not self._tables:
            return
        table = pa.concat_tables(self._tables)
        targets = np.concatenate(self._targets)
        self._tables, self._targets, self._buffered = [], [], 0
        order = np.argsort(targets, kind="stable")
        counts = np.bincount(targets, minlength=int(targets.max()) + 1)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        ordered = table.take(pa.array(order))
        ranges = np.zeros((counts.size, 2), np.int64)
        for target in np.flatnonzero(counts):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, table.schema, options=_IPC) as stream:
                stream.write_table(ordered.slice(int(bounds[target]), int(counts[target])))
            data = sink.getvalue()
            self._handle.write(data)
            ranges[target] = self._position, self._position + data.size
            self._position += data.size
        self._runs.append(ranges)

    def close(self) -> None:
        """The last run, the index and the tail."""
        self._flush()
        count = self._destinations
        if count is None:
            count = max((len(r) for r in self._runs), default=0)
        index = np.zeros((count, len(self._runs), 2), np.int64)
        for run, ranges in enumerate(self._runs):
            index[: len(ranges), run] = ranges
        self._handle.write(index.astype("<i8").tobytes())
        self._handle.write(_TAIL.pack(self._position, len(self._runs), count, MAGIC))


def missing_sender(path: str, size: int | None) -> FileNotFoundError:
    """The error for a sender's file that its completion record names but the store does not have: a
    receiver that went on without it would dedup against fewer rows and say nothing."""
    recorded = "" if size is None else f" ({size} bytes by its sender's completion record)"
    return FileNotFoundError(f"{path}: a shuffle's work file is missing{recorded}; the work folder was changed "
                             "under the job (remove it to start afresh)")


def read_destination(fs: Any, path: str, destination: int, size: int | None = None) -> Iterator[pa.Table]:
    """The segments of ``destination`` in the partitioned file ``path``, one table per run that has rows;
    ``size``: the file's size as its sender recorded it (a file of another size is refused)."""
    try:
        tail = fs.cat_file(path, start=-_TAIL.size)
    except FileNotFoundError as error:
        raise missing_sender(path, size) from error
    if len(tail) != _TAIL.size or tail[-len(MAGIC):] != MAGIC:
        raise ValueError(f"{path} is not a partitioned work file (damaged, or written by another version)")
    index_at, runs, count, _ = _TAIL.unpack(tail)
    if size is not None and index_at + 16 * runs * count + _TAIL.size != size:
        raise ValueError(f"{path}: its index describes {index_at + 16 * runs * count + _TAIL.size} bytes where "
                         f"its sender's completion record says {size} (a short or damaged file)")
    if destination >= count or runs == 0:
        return
    entry = index_at + 16 * runs * destination
    ranges = np.frombuffer(fs.cat_file(path, start=entry, end=entry + 16 * runs), "<i8").reshape(runs, 2)
    for start, end in ranges.tolist():
        if end > start:
            yield decode_segment(fs.cat_file(path, start=start, end=end))


def segments_by_destination(data: bytes, path: str) -> tuple[int, dict[int, list[bytes]]]:
    """A whole partitioned file's destinations and each one's segments (IPC streams, in run order),
    checking that the bytes are the whole file its tail describes (a short read is an error)."""
    tail = data[-_TAIL.size:]
    if len(data) < _TAIL.size or tail[-len(MAGIC):] != MAGIC:
        raise ValueError(f"{path} is not a partitioned work file (damaged, or written by another version)")
    index_at, runs, count, _ = _TAIL.unpack(tail)
    if index_at + 16 * runs * count + _TAIL.size != len(data):
        raise ValueError(f"{path}: {len(data)} bytes, but its index describes "
                         f"{index_at + 16 * runs * count + _TAIL.size} (a short or damaged file)")
    ranges = np.frombuffer(data, "<i8", count=2 * runs * count, offset=index_at).reshape(count, runs, 2)
    found: dict[int, list[bytes]] = {}
    for destination in np.flatnonzero((ranges[:, :, 1] > ranges[:, :, 0]).any(axis=1)).tolist():
        found[destination] = [data[start:end] for start, end in ranges[destination].tolist() if end > start]
    return count, found


def decode_segment(segment: bytes) -> pa.Table:
    """One segment's rows."""
    return pa.ipc.open_stream(segment).read_all()
