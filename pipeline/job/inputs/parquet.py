"""Parquet: row groups read one at a time, a damaged row group costs its rows and a bad row itself."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

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
from gristmill.pipeline.job.inputs.streams import open_piece

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
    import pyarrow as pa
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
        read = list(dict.fromkeys([*wanted, *carried]))
        # a dedup corpus shard's own source column is where its documents came from (format 1 and 2 call
        # it "source"); in a folder `gristmill index` made a corpus, "source" is the user's
        legacy = item.rows is not None and "cluster_id" in schema.names
        source = source_column(schema) if legacy else SOURCE_COLUMN
        row = 0
        for group, rows in enumerate(group_rows):
            if not _row_group_in(metadata, group, piece):
                row += rows
                continue
            try:
                # no threads: threaded reads through a Python file object abort the process now and
                # then (apache/arrow#34314); the job's parallelism is across splits anyway
                table = parquet.read_row_group(group, columns=read, use_threads=False)
                if table.num_rows != rows:
                    raise ValueError(f"{table.num_rows} rows decoded where the footer says {rows}")
                texts = table.column(options.text_column).cast(pa.binary()).to_pylist()
                columns = {c: _python_values(table.column(c)) for c in wanted if c != options.text_column}
                passing = table.select(carried) if carried else None
            except Exception as exc:  # noqa: BLE001 - a damaged row group costs its rows, not the file
                raise_storage_fault(exc)  # a throttle or a missing file is no damage
                yield Reject(item.source, f"row group {group} (rows {row}-{row + rows - 1})", "corrupt",
                             f"corrupt Parquet row group ({describe(exc)})",
                             metadata.row_group(group).total_byte_size, count=rows)
                row += rows
                continue
            for offset, raw in enumerate(texts):
                try:
                    extra = Extra(item.source, table=passing, row=offset) if passing is not None else None
                    record = _parquet_record(item, row + offset, raw, {c: v[offset] for c, v in columns.items()},
                                             options, source, extra)
                except Exception as exc:  # noqa: BLE001 - one row's failure rejects that row only
                    record = failed(item, f"row {row + offset}", exc, len(raw or b""))
                yield record
            row += rows


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

