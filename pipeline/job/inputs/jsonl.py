"""JSONL (plain, .gz, .zst): one record a line; a bad line is one reject at its line number."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

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
    encodable,
    failed,
    names_found,
    record_doc,
)
from gristmill.pipeline.job.inputs.streams import (
    RAW_RECORD_EXPANSION,
    bounded_lines,
    decompressed,
    first_line_start,
    open_piece,
    record_limit,
)


# -- JSONL -------------------------------------------------------------------------------------
def read_jsonl(piece: Piece, options: ReadOptions,
                storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    item = piece.file
    lineno, compression = piece.first_line - 1, item.compression
    with open_piece(piece, storage_options) as raw_handle:
        try:
            stream, compression = decompressed(piece, raw_handle)
            first = first_line_start(piece, stream, compression)
            if first is None:
                return
            stop = None if compression is not None or piece.end is None else piece.end - first
            limit = record_limit(options)
            for lineno, (raw, length) in enumerate(bounded_lines(stream, limit, stop),  # noqa: B007 - used after
                                                   piece.first_line):
                if raw is None:
                    yield Reject(item.source, f"line {lineno}", "over_size_cap",
                                 f"line of {length} bytes is over the {limit}-byte line cap (--max-doc-bytes x "
                                 f"{RAW_RECORD_EXPANSION}); skipped without reading it into memory", length)
                    continue
                try:
                    record = _jsonl_record(item, lineno, raw, options)
                except Exception as exc:  # noqa: BLE001 - one line's failure rejects that line only
                    record = failed(item, f"line {lineno}", exc, len(raw))
                yield record
        except Exception as exc:  # noqa: BLE001 - the stream itself: truncated, corrupt or unreadable
            raise_storage_fault(exc)  # a throttle or a missing file is no damage
            yield Reject(item.source, f"line {lineno + 1}", "corrupt",
                         f"truncated or corrupt {compression or 'file'} stream after line {lineno}, the last "
                         f"line read whole ({describe(exc)}); the rest of the file is lost", 0)




_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number",
               float: "a number", type(None): "null"}


def _jsonl_record(item: InputFile, lineno: int, raw: bytes, options: ReadOptions) -> Doc | Reject:
    position = f"line {lineno}"
    if not raw.strip():
        return Reject(item.source, position, "empty", "empty line", len(raw))
    try:
        record = orjson.loads(raw)  # a third of json's time; it also checks the UTF-8
    except orjson.JSONDecodeError:
        record = _json_fallback(item, position, raw, options)
        if isinstance(record, Reject):
            return record
    if not isinstance(record, dict):
        return Reject(item.source, position, "unparseable",
                      f"unparseable line ({_JSON_TYPES.get(type(record), 'a value')}, not a JSON object)", len(raw))
    text = record.get(options.text_column)
    if not isinstance(text, str):
        return Reject(item.source, position, "unparseable", _no_text_reason(record, options.text_column), len(raw))
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:  # JSON may escape lone surrogates ("\ud800"), which are not text
        return Reject(item.source, position, "invalid_utf8", f"invalid Unicode in text ({exc.reason} at {exc.start})",
                      len(raw))
    consumed = options.consumed
    others = {name: value for name, value in record.items() if name not in consumed}
    for name, value in others.items():
        kind = type(value)
        if kind is dict or kind is list or (kind is int and not -(2**63) <= value < 2**63):
            others[name] = _json_text(value)
    extra = Extra(item.source, values=others) if others else None
    return check(record_doc(item, position, text, record.get("url"), record, options, extra), size, options)


def _json_text(value: Any) -> str:
    """How the corpus carries an object, an array or an integer beyond 64 bits: its JSON text
    (``gristmill.pipeline.job.extras``). Done here, per line, so a value that cannot be written rejects its line."""
    try:
        return orjson.dumps(value).decode("utf-8")
    except orjson.JSONEncodeError:  # lone surrogates, huge integers, nesting orjson refuses
        return json.dumps(value)


def _json_fallback(item: InputFile, position: str, raw: bytes, options: ReadOptions) -> Any:
    """A line orjson refuses (bad bytes, lone surrogates, huge integers, NaN, deep nesting), judged by
    the standard library: its value, or the reject saying why it is not one."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Reject(item.source, position, "invalid_utf8", f"invalid UTF-8 at byte {exc.start}", len(raw))
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return Reject(item.source, position, "unparseable", f"unparseable line (column {exc.colno}: {exc.msg})",
                      len(raw))
    except RecursionError:
        return Reject(item.source, position, "unparseable", "unparseable line (nested too deeply)", len(raw))
    except ValueError as exc:  # an integer of more than 4300 digits
        return Reject(item.source, position, "unparseable", f"unparseable line ({describe(exc)})", len(raw))
    for name in (options.id_column, "url", "domain", "language") if isinstance(record, dict) else ():
        value = record.get(name)  # json lets lone surrogates ("\ud800") in; no text column can hold them
        if isinstance(value, str) and not encodable(value):
            return Reject(item.source, position, "invalid_utf8", f"invalid Unicode in the {name!r} field", len(raw))
    return record


def _no_text_reason(record: Mapping[str, Any], text_column: str) -> str:
    """Why a record has no text, naming the fields it does have (a run that rejects everything
    prints them as a hint for ``--text-column``)."""
    if text_column in record:
        kind = _JSON_TYPES.get(type(record[text_column]), "a value")
        return f"{text_column!r} field is {kind}, not a string"
    return f"no {text_column!r} field ({names_found(record)})"

