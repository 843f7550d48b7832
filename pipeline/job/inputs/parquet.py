"""Parquet: row groups read in bounded batches (a small file may inflate to gigabytes), a damaged row
group costs its rows and a bad row itself."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from gristmill.pipeline.format.schemas import (
    LEGACY_SOURCE_COLUMN,
    SOURCE_COLUMN,
    passes_through,
    source_column,
)
from gristmill.pipeline.job.inputs.faults import raise_storage_fault
from gristmill.pipeline.job.inputs.records import (
    Doc,
    Extra,
    InputFile,
    Piece,
    ReadOptions,
    Reject,
    check,
    describe,
    failed,
    file_reject,
    names_found,
    record_doc,
)
from gristmill.pipeline.job.inputs.streams import RAW_RECORD_EXPANSION, open_piece, record_limit

# -- Parquet -----------------------------------------------------------------------------------
_PARQUET_EXTRA = ("url", "final_url", SOURCE_COLUMN, LEGACY_SOURCE_COLUMN, "domain", "language", "fetch_time")


def _text_column_problem(schema: Any, column: str) -> str | None:
    """Why a Parquet file has no usable text column (each of its rows is then rejected), or None."""
    import pyarrow as pa

    if column not in schema.names:
        return f"no {column!r} column ({names_found(schema.names)})"
    if schema.names.count(column) > 1:
        return f"the {column!r} column appears {schema.names.count(column)} times"
    arrow_type = schema.field(column).type
    value_type = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if not any(check(value_type) for check in (
            pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view, pa.types.is_binary,
            pa.types.is_large_binary, pa.types.is_binary_view, pa.types.is_fixed_size_binary)):
        return f"the {column!r} column is {arrow_type}, not text"
    return None


def read_parquet(piece: Piece, options: ReadOptions,
                  storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    import pyarrow.parquet as pq

    item = piece.file
    first = piece.start == 0  # what concerns the whole file is its first piece's to report
    with open_piece(piece, storage_options) as handle:
        try:
            parquet = pq.ParquetFile(handle, page_checksum_verification=True)  # CRCs where written
            metadata, schema = parquet.metadata, parquet.schema_arrow
        except Exception as exc:  # noqa: BLE001 - a footer that cannot be read, whatever pyarrow raises
            raise_storage_fault(exc)  # a throttle or a missing file is no damage
            if first:
                yield file_reject(item, "file", "corrupt", f"corrupt Parquet file ({describe(exc)})", item.size)
            return
        group_rows = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
        if sum(group_rows) != metadata.num_rows or min(group_rows, default=0) < 0:
            if first:
                yield file_reject(item, "file", "corrupt", f"corrupt Parquet footer (its row groups hold "
                                   f"{sum(group_rows)} rows, the file {metadata.num_rows})", item.size)
            return
        if item.rows is not None and metadata.num_rows != item.rows:
            if first:
                yield file_reject(item, "file", "corrupt", f"the shard holds {metadata.num_rows} rows", item.size)
            return
        problem = _text_column_problem(schema, options.text_column)
        if problem is not None:
            if first:
                yield Reject(item.source, "file", "unparseable", problem, item.size, count=metadata.num_rows)
            return
        extra = [options.prefer_column] if options.prefer_column else []
        # a column named twice cannot be selected by name: it is neither read nor carried
        wanted = [c for c in dict.fromkeys([options.text_column, options.id_column, *_PARQUET_EXTRA, *extra])
                  if schema.names.count(c) == 1]
        carried = [c for c in schema.names
                   if schema.names.count(c) == 1 and passes_through(c, options.text_column, options.id_column)]
        # a dedup corpus shard's own source column is where its documents came from (format 1 and 2 call
        # it "source"); in a folder `gristmill index` made a corpus, "source" is the user's
        legacy = item.rows is not None and "cluster_id" in schema.names
        source = source_column(schema) if legacy else SOURCE_COLUMN
        parquet = _dictionaries_kept(handle, parquet, [*wanted, *carried])
        reading = _Reading(item, parquet, schema, wanted, carried, options, source)
        row = 0
        for group, rows in enumerate(group_rows):
            if _row_group_in(metadata, group, piece):
                yield from reading.row_group(group, row, rows)
            row += rows


def _dictionaries_kept(handle: Any, parquet: Any, columns: list[str]) -> Any:
    """``parquet`` reopened to decode every string or binary leaf of ``columns`` that some row group
    stores with a dictionary page as a DictionaryArray: a thousand rows naming one 1 MiB value then
    cost 1 MiB, and what each row holds is known from the values' lengths before anything is expanded
    (``_row_bytes``). Without a dictionary page a column's footer size is what it inflates to."""
    import pyarrow.parquet as pq

    metadata, owners = parquet.metadata, _leaf_owners(parquet.schema_arrow, parquet.metadata)
    kept = sorted({metadata.row_group(g).column(i).path_in_schema for g in range(metadata.num_row_groups)
                   for i in range(metadata.num_columns)
                   if owners[i] in columns and metadata.row_group(g).column(i).has_dictionary_page
                   and metadata.row_group(g).column(i).physical_type in ("BYTE_ARRAY", "FIXED_LEN_BYTE_ARRAY")})
    if not kept:
        return parquet
    return pq.ParquetFile(handle, metadata=metadata, page_checksum_verification=True, read_dictionary=kept)


def _leaf_owners(schema: Any, metadata: Any) -> list[str]:
    """The top-level column each leaf column chunk of the file belongs to, in file order (a name may
    hold dots, so paths are split only when the schema's leaves do not match the footer's)."""
    import pyarrow as pa

    def leaves(kind: Any) -> int:
        if pa.types.is_dictionary(kind):
            return 1
        children = [kind.field(i).type for i in range(kind.num_fields)] if kind.num_fields else []
        if not children and hasattr(kind, "value_type"):
            children = [kind.value_type]
        return sum(map(leaves, children)) if children else 1

    owners = [spec.name for spec in schema for _ in range(leaves(spec.type))]
    if len(owners) != metadata.num_columns:
        owners = [metadata.schema.column(i).path.split(".")[0] for i in range(metadata.num_columns)]
    return owners


class _Reading:
    """One Parquet file's row groups read in bounded memory. A row group is decoded in batches that
    each inflate to about one record's cap (8 x --max-doc-bytes), sized from the footer's uncompressed
    sizes; a batch is expanded to Python a slice of at most --max-doc-bytes (or one row) at a time; a
    row over the cap is rejected from its lengths alone; a row group whose footer says it inflates past
    the cap a row is one ``over_size_cap`` reject, not read."""

    def __init__(self, item: InputFile, parquet: Any, schema: Any, wanted: list[str], carried: list[str],
                 options: ReadOptions, source: str) -> None:
        self.item, self.parquet, self.options, self.source = item, parquet, options, source
        self.wanted, self.carried = wanted, carried
        self.read = list(dict.fromkeys([*wanted, *carried]))
        self.types = {name: schema.field(name).type for name in self.read}  # as written, not as decoded
        self.limit = record_limit(options)
        self.owners = _leaf_owners(schema, parquet.metadata)

    def row_group(self, group: int, first_row: int, rows: int) -> Iterator[Doc | Reject]:
        """The records of row group ``group`` (rows ``first_row`` on); a damaged one costs the rows
        not yet read."""
        item, metadata = self.item, self.parquet.metadata
        if not rows:  # an empty row group (Spark writes them) holds nothing to read or refuse
            return
        declared = _uncompressed_bytes(metadata, group, self.owners, self.read)
        if declared > rows * self.limit:
            yield Reject(item.source, f"row group {group} (rows {first_row}-{first_row + rows - 1})",
                         "over_size_cap", f"row group inflates to {declared} bytes, over the cap of {self.limit} "
                         f"bytes a row ({RAW_RECORD_EXPANSION} x --max-doc-bytes); not read", declared, count=rows)
            return
        row, last = first_row, first_row + rows - 1
        try:
            # no threads: threaded reads through a Python file object abort the process now and then
            # (apache/arrow#34314); the job's parallelism is across splits anyway
            for batch in self.parquet.iter_batches(batch_size=max(1, self.limit * rows // max(declared, 1)),
                                                   row_groups=[group], columns=self.read, use_threads=False):
                if row + batch.num_rows > first_row + rows:
                    raise ValueError(f"more rows decoded than the footer's {rows}")
                yield from self._batch(row, batch)
                row += batch.num_rows
            if row != first_row + rows:
                raise ValueError(f"{row - first_row} rows decoded where the footer says {rows}")
        except Exception as exc:  # noqa: BLE001 - a damaged row group costs its unread rows, not the file
            raise_storage_fault(exc)  # a throttle or a missing file is no damage
            yield Reject(item.source, f"row group {group} (rows {min(row, last)}-{last})", "corrupt",
                         f"corrupt Parquet row group ({describe(exc)})",
                         metadata.row_group(group).total_byte_size, count=max(first_row + rows - row, 1))

    def _batch(self, first_row: int, batch: Any) -> Iterator[Doc | Reject]:
        """One decoded batch's records, a slice of rows at a time: rows are added to a slice while it
        holds at most --max-doc-bytes, so a slice is that or one row of at most 8 x that."""
        cap, text_column = self.options.max_doc_bytes, self.options.text_column
        text_bytes = _row_bytes(batch.column(text_column))
        row_bytes = sum((_row_bytes(batch.column(c)) for c in self.read if c != text_column), text_bytes)
        start = 0
        while start < batch.num_rows:
            stop, size = start + 1, int(row_bytes[start])
            while stop < batch.num_rows and size + row_bytes[stop] <= cap:
                size += int(row_bytes[stop])
                stop += 1
            if text_bytes[start] > cap:  # rejected from its length, never expanded
                yield Reject(self.item.source, f"row {first_row + start}", "over_size_cap",
                             f"over the size cap ({text_bytes[start]} > {cap} bytes)", int(text_bytes[start]))
            elif size > self.limit:
                yield Reject(self.item.source, f"row {first_row + start}", "over_size_cap",
                             f"its columns hold {size} bytes, over the cap of {self.limit} bytes a row "
                             f"({RAW_RECORD_EXPANSION} x --max-doc-bytes)", size)
            else:
                # taken, not sliced: a sliced list still holds all its batch's values, which a cast expands
                yield from self._slice(first_row + start, batch.take(np.arange(start, stop)))
            start = stop

    def _slice(self, first_row: int, rows: Any) -> Iterator[Doc | Reject]:
        import pyarrow as pa

        text_column = self.options.text_column
        texts = self._expanded(rows, text_column).cast(pa.binary()).to_pylist()
        columns = {c: _python_values(self._expanded(rows, c)) for c in self.wanted if c != text_column}
        passing = (pa.Table.from_arrays([self._expanded(rows, c) for c in self.carried], names=self.carried)
                   if self.carried else None)
        for offset, raw in enumerate(texts):
            try:
                extra = Extra(self.item.source, table=passing, row=offset) if passing is not None else None
                yield _parquet_record(self.item, first_row + offset, raw,
                                      {c: v[offset] for c, v in columns.items()}, self.options, self.source, extra)
            except Exception as exc:  # noqa: BLE001 - one row's failure rejects that row only
                yield failed(self.item, f"row {first_row + offset}", exc, len(raw or b""))

    def _expanded(self, rows: Any, name: str) -> Any:
        """Column ``name`` of a slice with the type it was written with (dictionaries kept for reading
        expanded): only this slice's values are built."""
        column = rows.column(name)
        return column if column.type == self.types[name] else column.cast(self.types[name])


def _row_bytes(column: Any) -> np.ndarray:
    """What each row of ``column`` holds once expanded: the lengths of its strings and binaries, a
    dictionary's value lengths taken by index (nothing expanded), lists and structs as the sum of what
    they hold, fixed-width values their width."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_dictionary(kind):
        indices = column.indices.fill_null(0).to_numpy(zero_copy_only=False)
        sizes = _row_bytes(column.dictionary)[indices] if len(column.dictionary) else np.zeros(len(column), np.int64)
        return np.where(column.is_null().to_numpy(zero_copy_only=False), 0, sizes)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind) \
            or pa.types.is_map(kind) or pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind):
        children = _row_bytes(column.flatten())
        parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
        return np.bincount(parents, weights=children, minlength=len(column)).astype(np.int64)
    if pa.types.is_struct(kind):
        return sum((_row_bytes(pc.struct_field(column, [i])) for i in range(kind.num_fields)),
                   np.zeros(len(column), np.int64))
    try:
        return pc.binary_length(column).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):  # not a string or binary
        width = kind.bit_width // 8 if hasattr(kind, "bit_width") and kind.bit_width > 0 else 8
        return np.full(len(column), width, np.int64)


def _uncompressed_bytes(metadata: Any, group: int, owners: list[str], columns: list[str]) -> int:
    """What the footer says the ``columns`` of row group ``group`` inflate to."""
    chunks = metadata.row_group(group)
    return sum(chunks.column(i).total_uncompressed_size for i in range(chunks.num_columns) if owners[i] in columns)


def _row_group_in(metadata: Any, group: int, piece: Piece) -> bool:
    """Whether ``piece`` reads row group ``group``: the piece its first page starts in. Whatever offset a
    footer gives, exactly one piece of the file has it (the first takes what lies before, the last
    what lies after)."""
    if piece.whole:
        return True
    chunk = metadata.row_group(group).column(0) if metadata.num_columns else None
    offset = 0 if chunk is None else chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    return (piece.start == 0 or offset >= piece.start) and (piece.end is None or offset < piece.end)


def _python_values(column: Any) -> list[Any]:
    """A column's values; a string column holding bytes that are not UTF-8 (a flipped byte: Parquet
    readers do not check) gives bytes, which become text with replacement characters, so one bad
    value in a side column costs no document."""
    import pyarrow as pa

    try:
        return column.to_pylist()
    except UnicodeDecodeError:
        return column.cast(pa.binary()).to_pylist()


def _parquet_record(item: InputFile, row: int, raw: bytes | None, values: Mapping[str, Any],
                    options: ReadOptions, source: str, extra: Extra | None) -> Doc | Reject:
    position = f"row {row}"
    if raw is None:
        return Reject(item.source, position, "empty", "null text", 0)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Reject(item.source, position, "invalid_utf8", f"invalid UTF-8 at byte {exc.start}", len(raw))
    url = values.get("final_url") or values.get("url") or values.get(source)
    return check(record_doc(item, position, text, url, values, options, extra), len(raw), options)

