"""Parquet: row groups read one at a time, a damaged row group costs its rows and a bad row itself."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import fsspec
import numpy as np

from pipeline.job.inputs.records import (
    Doc,
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
from pipeline.job.inputs.streams import RAW_RECORD_EXPANSION, record_limit

# -- Parquet -----------------------------------------------------------------------------------
_PARQUET_EXTRA = ("url", "final_url", "source", "domain", "language", "fetch_time")


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
    with fsspec.open(item.url, "rb", **dict(storage_options or {})) as handle:
        try:
            parquet = pq.ParquetFile(handle, page_checksum_verification=True)  # CRCs where written
            metadata, schema = parquet.metadata, parquet.schema_arrow
        except Exception as exc:  # noqa: BLE001 - a footer that cannot be read, whatever pyarrow raises
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
        wanted = [c for c in dict.fromkeys([options.text_column, options.id_column, *_PARQUET_EXTRA, *extra])
                  if schema.names.count(c) == 1]
        stored_once = _dictionary_encoded(metadata, wanted)
        if stored_once:  # kept as dictionaries when decoded, expanded a slice at a time (_batch_records)
            parquet = pq.ParquetFile(handle, metadata=metadata, page_checksum_verification=True,
                                     read_dictionary=stored_once)
        limit = record_limit(options)
        row = 0
        for group, rows in enumerate(group_rows):
            if _row_group_in(metadata, group, piece):
                yield from _read_row_group(parquet, item, group, row, rows, wanted, limit, options)
            row += rows


def _read_row_group(parquet: Any, item: InputFile, group: int, first_row: int, rows: int, wanted: list[str],
                    limit: int, options: ReadOptions) -> Iterator[Doc | Reject]:
    """One row group in batches that each inflate to about ``limit`` bytes (one raw record's cap, 8 x
    --max-doc-bytes), sized from the footer's uncompressed column sizes, so a small file that inflates
    to gigabytes is never held whole. A group that says it inflates past ``limit`` a row is refused
    unread as ``over_size_cap``; a damaged one costs the rows not yet read."""
    declared = _uncompressed_bytes(parquet.metadata, group, wanted)
    if declared > rows * limit:
        yield Reject(item.source, f"row group {group} (rows {first_row}-{first_row + rows - 1})", "over_size_cap",
                     f"row group inflates to {declared} bytes, over the cap of {limit} bytes a row "
                     f"({RAW_RECORD_EXPANSION} x --max-doc-bytes); not read", declared, count=rows)
        return
    row = first_row
    try:
        # no threads: threaded reads through a Python file object abort the process now and then
        # (apache/arrow#34314); the job's parallelism is across splits anyway
        for batch in parquet.iter_batches(batch_size=max(1, limit * rows // max(declared, 1)), row_groups=[group],
                                          columns=wanted, use_threads=False):
            if row + batch.num_rows > first_row + rows:
                raise ValueError(f"more rows decoded than the footer's {rows}")
            yield from _batch_records(item, row, batch, wanted, options)
            row += batch.num_rows
        if row != first_row + rows:
            raise ValueError(f"{row - first_row} rows decoded where the footer says {rows}")
    except Exception as exc:  # noqa: BLE001 - a damaged row group costs its unread rows, not the file
        last = first_row + rows - 1
        yield Reject(item.source, f"row group {group} (rows {min(row, last)}-{last})", "corrupt",
                     f"corrupt Parquet row group ({describe(exc)})",
                     parquet.metadata.row_group(group).total_byte_size, count=max(first_row + rows - row, 1))


def _batch_records(item: InputFile, first_row: int, batch: Any, wanted: list[str],
                   options: ReadOptions) -> Iterator[Doc | Reject]:
    """The records of one decoded batch, expanded to Python a slice of rows at a time: a slice holds
    at most --max-doc-bytes, or one row of at most 8 x that. Dictionary-encoded columns (read as
    dictionaries, see ``read_parquet``) are sized from their values' lengths before anything is
    expanded, so a thousand rows naming one 1 MiB value cost 1 MiB, and a row over the cap is
    rejected from its lengths alone."""
    import pyarrow as pa

    cap, limit = options.max_doc_bytes, record_limit(options)
    text_bytes = _row_bytes(batch.column(options.text_column))
    row_bytes = sum((_row_bytes(batch.column(c)) for c in wanted if c != options.text_column), text_bytes)
    start = 0
    while start < batch.num_rows:
        stop, size = start + 1, int(row_bytes[start])
        while stop < batch.num_rows and size + row_bytes[stop] <= cap:
            size += int(row_bytes[stop])
            stop += 1
        if text_bytes[start] > cap or size > limit:  # one row alone, over the cap: rejected unexpanded
            yield Reject(item.source, f"row {first_row + start}", "over_size_cap",
                         f"over the size cap ({text_bytes[start] if text_bytes[start] > cap else size} > "
                         f"{cap if text_bytes[start] > cap else limit} bytes)", size)
            start = stop
            continue
        rows = batch.slice(start, stop - start)
        texts = _expanded(rows.column(options.text_column)).cast(pa.binary()).to_pylist()
        columns = {c: _python_values(_expanded(rows.column(c))) for c in wanted if c != options.text_column}
        for offset, raw in enumerate(texts):
            row = first_row + start + offset
            try:
                yield _parquet_record(item, row, raw, {c: v[offset] for c, v in columns.items()}, options)
            except Exception as exc:  # noqa: BLE001 - one row's failure rejects that row only
                yield failed(item, f"row {row}", exc, len(raw or b""))
        start = stop


def _row_bytes(column: Any) -> np.ndarray:
    """What each row of a string or binary column holds once expanded (0 for nulls and other types)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = column.dictionary if pa.types.is_dictionary(column.type) else column
    try:
        lengths = pc.binary_length(values)
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # not a string or binary column
        return np.zeros(len(column), np.int64)
    if values is not column:
        lengths = lengths.take(column.indices)
    return lengths.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _expanded(column: Any) -> Any:
    """A column slice with its dictionary (if any) expanded: only this slice's values are built."""
    import pyarrow as pa

    return column.dictionary.take(column.indices) if pa.types.is_dictionary(column.type) else column


def _dictionary_encoded(metadata: Any, columns: list[str]) -> list[str]:
    """Those of ``columns`` that some row group stores with a dictionary page (many rows, one value)."""
    found = {metadata.row_group(g).column(i).path_in_schema for g in range(metadata.num_row_groups)
             for i in range(metadata.num_columns) if metadata.row_group(g).column(i).has_dictionary_page}
    return [c for c in columns if c in found]


def _uncompressed_bytes(metadata: Any, group: int, columns: list[str]) -> int:
    """What the footer says the ``columns`` of row group ``group`` inflate to."""
    chunks = metadata.row_group(group)
    return sum(chunks.column(i).total_uncompressed_size for i in range(chunks.num_columns)
               if chunks.column(i).path_in_schema.split(".")[0] in columns)


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
                    options: ReadOptions) -> Doc | Reject:
    position = f"row {row}"
    if raw is None:
        return Reject(item.source, position, "empty", "null text", 0)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Reject(item.source, position, "invalid_utf8", f"invalid UTF-8 at byte {exc.start}", len(raw))
    url = values.get("final_url") or values.get("url") or values.get("source")
    return check(record_doc(item, position, text, url, values, options), len(raw), options)

