"""The dedup job's work folder: atomic Parquet files, hash-partitioned shuffle files, completion records.

Everything a stage produces lands here before the next stage reads it, so a rerun after a crash
skips what is finished (a task's record exists) and redoes only the rest. Files are written under a
temporary name and renamed (one PUT on object stores), so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.format import open_fs
from pipeline.job.datasets import Shuffled


class WorkDir:
    """A folder (any fsspec URL) holding one job's intermediate results; picklable for Ray tasks."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = open_fs(url, self.storage_options)

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"])  # type: ignore[misc]

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    # -- atomic files ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _atomic(self, relative: str) -> Iterator[Any]:
        """A handle on a temporary name, renamed to ``relative`` once the block finishes without error."""
        target = self.path(relative)
        self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
        temporary = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
        with self.fs.open(temporary, "wb") as handle:
            yield handle
        self.fs.mv(temporary, target)

    def write_table(self, relative: str, table: pa.Table) -> None:
        """Write one Parquet file atomically (temp name, then rename)."""
        with self._atomic(relative) as handle:
            pq.write_table(table, handle, compression="zstd")

    @contextlib.contextmanager
    def table_writer(self, relative: str, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
        """A Parquet file written one row group per ``write_table`` call, published atomically at the end,
        so a task holds one batch of a split at a time, not the split."""
        with self._atomic(relative) as handle, pq.ParquetWriter(handle, schema, compression="zstd") as writer:
            yield writer

    def read_row_groups(self, relative: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """The row groups of one Parquet file, one table at a time."""
        with self.fs.open(self.path(relative), "rb") as handle:
            parquet = pq.ParquetFile(handle)
            for group in range(parquet.num_row_groups):
                yield parquet.read_row_group(group, columns=columns)

    def write_json(self, relative: str, data: Any) -> None:
        payload = json.dumps(data, sort_keys=True).encode("utf-8")
        with self._atomic(relative) as handle:
            handle.write(payload)

    def read_json(self, relative: str) -> Any | None:
        """The record, or None when it was never completed."""
        try:
            return json.loads(self.fs.cat_file(self.path(relative)))
        except FileNotFoundError:
            return None

    def exists(self, relative: str) -> bool:
        return self.fs.exists(self.path(relative))

    def read_table(self, relative: str, columns: list[str] | None = None) -> pa.Table:
        with self.fs.open(self.path(relative), "rb") as handle:
            return pq.read_table(handle, columns=columns)

    def read_folder(self, relative: str, schema: pa.Schema) -> pa.Table:
        """Every finished ``*.parquet`` in a folder, in name order; an empty table when there is none."""
        folder = self.path(relative)
        files = sorted(self.fs.glob(posixpath.join(folder, "*.parquet")))
        tables = []
        for name in files:
            with self.fs.open(name, "rb") as handle:
                tables.append(pq.read_table(handle, schema=schema))
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def remove(self, relative: str) -> None:
        target = self.path(relative)
        if self.fs.exists(target):
            self.fs.rm(target, recursive=True)

    # -- shuffles --------------------------------------------------------------------------------
    def write_partitioned(self, dataset: Shuffled, name: str, table: pa.Table, partition: np.ndarray,
                          num_partitions: int) -> None:
        """The map side of a shuffle: rows go to ``dataset.file(part, name)`` by their partition number.

        Every partition gets a file (possibly empty), so a reducer knows its input is complete when
        the map task's completion record exists.
        """
        order = np.argsort(partition, kind="stable")
        counts = np.bincount(partition, minlength=num_partitions)
        bounds = np.concatenate([[0], np.cumsum(counts)])
        ordered = table.take(pa.array(order)) if table.num_rows else table
        for part in range(num_partitions):
            chunk = ordered.slice(int(bounds[part]), int(counts[part]))
            self.write_table(dataset.file(part, name), chunk)


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """Hash partition of uint64/int64 keys: a multiplicative mix so that nearby keys spread out."""
    mixed = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(33)) % np.uint64(num_partitions)).astype(np.int64)
