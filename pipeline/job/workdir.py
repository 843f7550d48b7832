"""The dedup job's work folder: atomic Parquet files, partitioned shuffle files, completion records.

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
from pipeline.format.storage import is_local, naming
from pipeline.job.datasets import Shuffled
from pipeline.job.partfile import PartitionedWriter, read_destination


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

    def _naming(self, relative: str, verb: str) -> contextlib.AbstractContextManager[None]:
        """A store error on ``relative`` names it and the operation (``pipeline.format.storage.naming``)."""
        return naming(f"{self.url.rstrip('/')}/{relative}", verb, is_local(self.fs))

    # -- atomic files ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _atomic(self, relative: str) -> Iterator[Any]:
        """A handle on a temporary name, renamed to ``relative`` once the block finishes without error."""
        target = self.path(relative)
        self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
        temporary = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
        with self._naming(relative, "write"):
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
            with self._naming(relative, "read"):
                return json.loads(self.fs.cat_file(self.path(relative)))
        except FileNotFoundError:
            return None

    def exists(self, relative: str) -> bool:
        return self.fs.exists(self.path(relative))

    def read_table(self, relative: str, columns: list[str] | None = None) -> pa.Table:
        with self._naming(relative, "read"), self.fs.open(self.path(relative), "rb") as handle:
            return pq.read_table(handle, columns=columns)

    def remove(self, relative: str) -> None:
        target = self.path(relative)
        if self.fs.exists(target):
            self.fs.rm(target, recursive=True)

    # -- shuffles: partitioned files (pipeline.job.partfile) ------------------------------------------
    @contextlib.contextmanager
    def partitioned_writer(self, dataset: Shuffled, name: str, destinations: int | None = None,
                           budget_bytes: int | None = None) -> Iterator[PartitionedWriter]:
        """The sending side of a shuffle, a batch at a time: ``dataset.file(name)``, published atomically
        when the block ends; past ``budget_bytes`` of buffered rows it writes a run (None: never)."""
        with self._atomic(dataset.file(name)) as handle:
            writer = PartitionedWriter(handle, destinations, budget_bytes)
            yield writer
            writer.close()

    def write_partitioned(self, dataset: Shuffled, name: str, table: pa.Table, destination: np.ndarray,
                          destinations: int | None = None) -> None:
        """The sending side of a shuffle in one go: row i of ``table`` goes to ``destination[i]``.

        The file is written even without rows, so a receiver knows the sender's part is complete when
        the sender's completion record exists.
        """
        with self.partitioned_writer(dataset, name, destinations) as writer:
            writer.write(table, destination)

    def partition_tables(self, dataset: Shuffled, destination: int) -> Iterator[pa.Table]:
        """The receiving side, a segment at a time: ``destination``'s rows of every finished file of the
        dataset, in file-name order (for a shuffle out of splits: key order)."""
        for path in sorted(self.fs.glob(self.path(dataset.file("*")))):
            yield from read_destination(self.fs, path, destination)

    def read_partition(self, dataset: Shuffled, destination: int, schema: pa.Schema) -> pa.Table:
        """All of ``destination``'s rows of a shuffle; an empty table of ``schema`` when there are none."""
        tables = list(self.partition_tables(dataset, destination))
        return pa.concat_tables(tables) if tables else schema.empty_table()


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """Hash partition of uint64/int64 keys: a multiplicative mix so that nearby keys spread out."""
    mixed = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(33)) % np.uint64(num_partitions)).astype(np.int64)
