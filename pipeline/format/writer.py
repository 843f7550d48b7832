"""The shard writer: rows in, Parquet shards cut at a target size with row groups near a target size.

Nothing a writer produces is visible to readers until a manifest lists it (:mod:`gristmill.pipeline.format.manifest`).
Pages stay near 1 MiB and unique-valued columns skip dictionaries, so a loader's first batch decodes
little (docs/FORMAT.md).
"""

from __future__ import annotations

import contextlib
import posixpath
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from gristmill.pipeline.format.blocks import RowGroupInfo, RowGroups
from gristmill.pipeline.format.manifest import (
    CHECKSUM_ALGORITHM,
    CorpusError,
    Manifest,
    ShardInfo,
    write_manifest,
)
from gristmill.pipeline.format.schemas import CORPUS_SCHEMA, REQUIRED_COLUMNS
from gristmill.pipeline.format.storage import is_local, naming, open_fs

DEFAULT_SHARD_BYTES = 256 * 1024 * 1024
DEFAULT_ROW_GROUP_BYTES = 4 * 1024 * 1024
# Parquet checks a page against its size limit (1 MiB) only every this many rows; at pyarrow's default
# of 1,024 a page of web documents grows to ~10 MB, so a loader's first batch decompresses all of it.
PAGE_CHECK_ROWS = 64
DEFAULT_COMPRESSION = "zstd"
# Columns whose values are (nearly) unique per row: a dictionary page buys nothing and costs decode
# time (measured 20% faster block decode for text without it, same file size; docs/FORMAT.md).
UNIQUE_VALUED_COLUMNS = frozenset({"id", "text", "content_hash", "url", "final_url", "cluster_id"})


class _HashingSink:
    """A write-only file wrapper that checksums and counts bytes as they pass, so a shard is never re-read."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._digest = xxhash.xxh3_128()
        self.position = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        self._digest.update(view)
        self._handle.write(view)
        self.position += len(view)
        return len(view)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        self._handle.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._handle.close()

    @property
    def checksum(self) -> str:
        return f"{CHECKSUM_ALGORITHM}:{self._digest.hexdigest()}"


def row_group_ranges(metadata: pq.FileMetaData) -> list[RowGroupInfo]:
    """Each row group's rows and byte range (from its first page to its last column chunk's end)."""
    ranges = []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        start, end = None, 0
        for column_index in range(group.num_columns):
            column = group.column(column_index)
            first = column.data_page_offset
            if column.has_dictionary_page and column.dictionary_page_offset:
                first = min(first, column.dictionary_page_offset)
            start = first if start is None else min(start, first)
            end = max(end, first + column.total_compressed_size)
        ranges.append(RowGroupInfo(rows=group.num_rows, offset=int(start or 0), length=int(end - (start or 0))))
    return ranges


def _as_table(data: pa.Table | pa.RecordBatch | Iterable[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        missing = [name for name in schema.names if name not in data.column_names]
        if missing:
            raise CorpusError(f"table lacks columns {missing} of the corpus schema")
        return data.select(schema.names).cast(schema)
    return pa.Table.from_pylist(list(data), schema=schema)


class ShardWriter:
    """Writes rows into Parquet shards cut at a target byte size, with row groups near a target byte size.

    Row-group size is steered by the compression ratio seen so far, so on-disk blocks land near the
    target. ``close()`` returns the shards written; ``commit()`` also writes the manifest. Nothing is
    visible to readers until a manifest lists it.
    """

    def __init__(
        self,
        url: str,
        schema: pa.Schema = CORPUS_SCHEMA,
        *,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        compression: str = DEFAULT_COMPRESSION,
        name_prefix: str = "part",
        run_id: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        for column in REQUIRED_COLUMNS:
            if column not in schema.names:
                raise CorpusError(f"schema must have a {column!r} column (it has: {', '.join(schema.names)})")
        if row_group_bytes <= 0 or shard_bytes < row_group_bytes:
            raise ValueError("need 0 < row_group_bytes <= shard_bytes")
        self.url = url
        self.schema = schema
        self.shard_bytes = shard_bytes
        self.row_group_bytes = row_group_bytes
        self.compression = compression
        self.name_prefix = name_prefix
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = open_fs(url, storage_options)
        self.fs.makedirs(self.root, exist_ok=True)
        self.shards: list[ShardInfo] = []
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0
        self._compression_ratio = 0.5  # on-disk bytes per in-memory byte; learned as row groups are written
        self._sink: _HashingSink | None = None
        self._writer: pq.ParquetWriter | None = None
        self._shard_name = ""
        self._shard_rows = 0

    # -- writing -------------------------------------------------------------------------------
    def write(self, data: pa.Table | pa.RecordBatch | Iterable[Mapping[str, Any]]) -> None:
        """Buffer rows; full row groups go to disk as soon as the buffer holds one."""
        table = _as_table(data, self.schema)
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_bytes += table.nbytes
        while self._pending_bytes * self._compression_ratio >= self.row_group_bytes:
            self._flush_row_group(final=False)

    def _flush_row_group(self, final: bool) -> None:
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]  # no copy
        bytes_per_row = max(table.nbytes / table.num_rows, 1.0)
        rows = max(1, int(self.row_group_bytes / (bytes_per_row * self._compression_ratio)))
        if final:
            rows = min(rows, table.num_rows)
        if rows >= table.num_rows and not final:
            rows = table.num_rows
        group, rest = table.slice(0, rows), table.slice(rows)
        self._write_row_group(group)
        self._pending = [rest] if rest.num_rows else []
        self._pending_bytes = rest.nbytes if rest.num_rows else 0

    def _naming_shard(self) -> contextlib.AbstractContextManager[None]:
        """Store errors while writing the open shard name it (``gristmill.pipeline.format.storage.naming``)."""
        return naming(f"{self.url.rstrip('/')}/{self._shard_name}", "write", is_local(self.fs))

    def _write_row_group(self, group: pa.Table) -> None:
        if self._writer is None:
            self._open_shard()
        assert self._writer is not None and self._sink is not None
        before = self._sink.position
        with self._naming_shard():
            self._writer.write_table(group, row_group_size=group.num_rows)
        written = self._sink.position - before
        if written > 0 and group.nbytes > 0:
            observed = written / group.nbytes
            self._compression_ratio = observed if not self.shards and self._shard_rows == 0 else (
                0.5 * self._compression_ratio + 0.5 * observed
            )
        self._shard_rows += group.num_rows
        if self._sink.position + self.row_group_bytes > self.shard_bytes:
            self._close_shard()

    def _open_shard(self) -> None:
        self._shard_name = f"{self.name_prefix}-{self.run_id}-{len(self.shards):05d}.parquet"
        with self._naming_shard():
            handle = self.fs.open(posixpath.join(self.root, self._shard_name), "wb")
        self._sink = _HashingSink(handle)
        dictionary_columns = [name for name in self.schema.names if name not in UNIQUE_VALUED_COLUMNS]
        self._writer = pq.ParquetWriter(self._sink, self.schema, compression=self.compression,
                                        use_dictionary=dictionary_columns, write_batch_size=PAGE_CHECK_ROWS,
                                        write_page_checksum=True)  # a CRC per page: readers verify each
        self._shard_rows = 0

    def _close_shard(self) -> None:
        assert self._writer is not None and self._sink is not None
        with self._naming_shard():
            self._writer.close()
            metadata = self._writer.writer.metadata
            self._sink.close()
        groups = row_group_ranges(metadata)
        data_end = max((g.offset + g.length for g in groups), default=4)
        self.shards.append(
            ShardInfo(
                path=self._shard_name,
                rows=self._shard_rows,
                bytes=self._sink.position,
                checksum=self._sink.checksum,
                row_groups=RowGroups.of(groups),
                footer_offset=data_end,
                footer_length=self._sink.position - data_end,
            )
        )
        self._writer = None
        self._sink = None

    def close(self) -> list[ShardInfo]:
        """Flush what is buffered and close the open shard; return every shard written."""
        while self._pending:
            self._flush_row_group(final=True)
        if self._writer is not None:
            self._close_shard()
        return list(self.shards)

    def commit(self, stats: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None) -> Manifest:
        """Close and publish: write the manifest listing every shard, atomically."""
        shards = self.close()
        return write_manifest(self.url, shards, self.schema, stats=stats, extra=extra,
                              storage_options=self.storage_options)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()


def write_corpus(
    data: pa.Table | pa.RecordBatch | pa.RecordBatchReader | Iterable[pa.Table | pa.RecordBatch],
    url: str,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
    storage_options: Mapping[str, Any] | None = None,
) -> Manifest:
    """Write any Arrow table (or batches: a reader, a generator) with a string ``text`` column as a
    corpus at ``url`` and commit it; every other column is kept as it is. The schema is the first
    batch's; later batches are cast to it (CorpusError naming the column when one cannot be).

    The corpus streams through ``gristmill.loaders.StreamingLoader`` with no dedup run; shards get the format's
    row-group and page sizes, so a loader's blocks are the right size whatever wrote the table.
    """
    batches: Iterable[pa.Table | pa.RecordBatch] = [data] if isinstance(data, pa.Table | pa.RecordBatch) else data
    writer: ShardWriter | None = None
    for batch in batches:
        if writer is None:
            check_text_column(batch.schema, url)
            writer = ShardWriter(url, batch.schema, shard_bytes=shard_bytes, row_group_bytes=row_group_bytes,
                                 storage_options=storage_options)
        try:
            writer.write(batch)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError, KeyError) as exc:
            raise CorpusError(f"{url}: a batch does not fit the first batch's schema ({exc})") from None
    if writer is None:
        raise CorpusError(f"{url}: nothing to write (no batch)")
    return writer.commit()


def check_text_column(schema: pa.Schema, where: str) -> None:
    """A corpus needs a string ``text`` column: the loader streams it and tokenizes it."""
    if "text" not in schema.names:
        raise CorpusError(f"{where}: the table has no 'text' column (it has: {', '.join(schema.names)}); "
                          "rename the column that holds the documents to 'text'")
    kind = schema.field("text").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind)):
        raise CorpusError(f"{where}: the 'text' column is {kind}, not a string")
