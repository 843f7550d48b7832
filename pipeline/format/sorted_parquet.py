"""Parquet files sorted by one column and read back in part: only the row groups that can hold the
values a reader wants, found from the row groups' min/max statistics in the footer.

Why: a later reader (an incremental dedup run reading an earlier corpus's signature index, a
statistics reducer reading its slice of every split's table) needs a few values or one value range
of a large file. Sorted rows and small row groups turn that into a footer read plus one ranged read
per useful row group, with no separate index to keep in step with the file. Ranges are cut with
:func:`range_partition`, which is monotone: a file sorted by a value is sorted by its partition for
any number of partitions, so the writer need not know how a later reader partitions its work.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.pipeline.format.storage import open_fs


def range_partition(values: np.ndarray, parts: int) -> np.ndarray:
    """The partition (0..parts-1) of each uint64 value by range of its top 32 bits; ``parts < 2**32``."""
    high = np.asarray(values, dtype=np.uint64) >> np.uint64(32)
    return ((high * np.uint64(parts)) >> np.uint64(32)).astype(np.int64)


def write_sorted(handle: BinaryIO, table: pa.Table, group_rows: int) -> None:
    """Write ``table`` (already sorted by its lookup column) in row groups of ``group_rows`` rows, with
    the statistics that :func:`groups_holding` and :func:`groups_in_partition` read."""
    pq.write_table(table, handle, row_group_size=max(1, group_rows), compression="zstd", write_statistics=True,
                   write_page_checksum=True)


def _bounds(metadata: pq.FileMetaData, column: str) -> Iterator[tuple[int, Any, Any]]:
    """(row group, min, max) of ``column``; (group, None, None) when a group has no statistics."""
    index = metadata.schema.to_arrow_schema().get_field_index(column)
    for group in range(metadata.num_row_groups):
        stats = metadata.row_group(group).column(index).statistics
        if stats is None or not stats.has_min_max:
            yield group, None, None
        else:
            yield group, stats.min, stats.max


def groups_holding(metadata: pq.FileMetaData, column: str, wanted: np.ndarray) -> list[int]:
    """Row groups whose [min, max] of ``column`` brackets at least one of the sorted ``wanted`` values."""
    def brackets(low: Any, high: Any) -> bool:
        at = int(np.searchsorted(wanted, np.asarray(low, dtype=wanted.dtype), side="left"))
        return at < len(wanted) and bool(wanted[at] <= np.asarray(high, dtype=wanted.dtype))

    return _groups_where(metadata, column, brackets)


def groups_in_partition(metadata: pq.FileMetaData, column: str, part: int, parts: int) -> list[int]:
    """Row groups of a file sorted by the uint64 ``column`` that hold values of range partition ``part``."""
    def overlaps(low: Any, high: Any) -> bool:
        first, last = range_partition(np.array([low, high], dtype=np.uint64), parts)
        return bool(first <= part <= last)

    return _groups_where(metadata, column, overlaps)


def _groups_where(metadata: pq.FileMetaData, column: str, keep: Callable[[Any, Any], bool]) -> list[int]:
    """Non-empty row groups whose (min, max) of ``column`` pass ``keep``; a group without statistics
    is always kept (it cannot be ruled out)."""
    return [group for group, low, high in _bounds(metadata, column)
            if metadata.row_group(group).num_rows and (low is None or keep(low, high))]


def group_starts(metadata: pq.FileMetaData) -> np.ndarray:
    """The first row of every row group (and, last, the file's row count)."""
    rows = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
    return np.concatenate([[0], np.cumsum(rows, dtype=np.int64)]).astype(np.int64)


class CountingFile:
    """A read-only file that counts the bytes read through it: what a partial read really cost."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.bytes_read += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)

    def tell(self) -> int:
        return self._handle.tell()

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    @property
    def closed(self) -> bool:
        return bool(self._handle.closed)

    def close(self) -> None:
        self._handle.close()


@contextlib.contextmanager
def open_counted(url: str, storage_options: Mapping[str, Any] | None = None) -> Iterator[tuple[pq.ParquetFile, CountingFile]]:
    """A Parquet file opened for ranged reads (no read-ahead cache, so a row group costs its own bytes),
    and the counter of what reading it cost."""
    fs, path = open_fs(url, storage_options)
    with fs.open(path, "rb", cache_type="none") as raw:
        counted = CountingFile(raw)
        yield pq.ParquetFile(counted, page_checksum_verification=True), counted
