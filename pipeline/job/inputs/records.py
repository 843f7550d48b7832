"""The records an input yields (:class:`Doc` or :class:`Reject`), the units of work (:class:`InputFile`,
:class:`Piece`, :class:`Split`), and the helpers every format's reader shares to build them.

Why one module: the readers, the split planner and the job's stages all speak in these types; keeping
them apart from any one format lets a reader be added without touching the others.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

import xxhash

from gristmill.pipeline.format.schemas import RESERVED_COLUMNS

KEY_BITS = 32  # ordinal bits of a document key; a split holds at most 2**32 records
FIELDS_SHOWN = 10  # field names a "no text field" reason lists


class InputError(Exception):
    """An INPUT argument names nothing readable; the message names it."""


@dataclass(frozen=True)
class InputFile:
    """One file to read: its fsspec URL, its format, and the INPUT argument that named it."""

    url: str
    kind: str  # "parquet" | "jsonl" | "warc"
    compression: str | None
    size: int
    origin: str
    rows: int | None = None  # the rows a corpus manifest lists for this shard; None for other files
    # what tells this content from a rewrite of the same length (``discover.content_identity``): part of
    # every split's fingerprint, so a changed input is a different job, never the old corpus returned
    version: str = ""

    @cached_property
    def source(self) -> str:
        """The URL as text for the source and reject columns: a file name's bytes that are not UTF-8
        are shown escaped (the text columns cannot hold them, and one such name stopped the job)."""
        return printable(self.url)


@dataclass(frozen=True)
class Piece:
    """The part of one file a split reads: the records that start in bytes [start, end) (``end`` None: to
    the end of the file). JSONL: the lines that start there; WARC: the records whose version line
    starts there; Parquet: the row groups whose first page starts there. A compressed file is one
    piece, read whole."""

    file: InputFile
    start: int = 0
    end: int | None = None
    first_line: int = 1  # JSONL: the number of the first line that starts in the piece (number_lines)
    # JSONL on an object store: the piece's bytes from byte max(start - 1, 0) to its end, fetched with its
    # newline count (``splits.fetch_counted``), which its read parses rather than download them again
    prefetched: Any = field(default=None, compare=False, repr=False)

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.end is None

    @property
    def bytes(self) -> int:
        return (self.file.size if self.end is None else self.end) - self.start


@dataclass(frozen=True)
class Split:
    """A unit of parallel work, and what its read task is sent: consecutive pieces of the sorted files
    up to a byte budget."""

    index: int
    pieces: tuple[Piece, ...]

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.pieces)


@dataclass(frozen=True)
class Extra:
    """A record's input columns that gristmill does not consume, carried to the shards under their own
    names (``gristmill.pipeline.job.extras``): a JSONL record's other fields (``values``), or a Parquet row
    (``row`` of ``table``, its row group's pass-through columns as Arrow read them)."""

    file: str  # the input file, named when its columns conflict with another file's
    values: Mapping[str, Any] | None = None
    table: Any = None
    row: int = 0


@dataclass
class Doc:
    """A parsed document before normalisation."""

    id: str | None
    text: str
    source: str
    domain: str | None
    language: str | None
    fetch_time: _dt.datetime | None
    position: str
    url: str | None = None  # the document's own URL, when it has one (``source`` may be the input file)
    preferred: Any = None  # the value of the input column the survivor policy reads (ReadOptions.prefer_column)
    extra: Extra | None = None  # the input's other columns, to pass through (None: it has none)


@dataclass
class Reject:
    """A record that cannot become a document, with the reason and where it sits."""

    source: str
    position: str
    kind: str  # one of pipeline.format.REJECT_KINDS
    reason: str
    bytes: int
    count: int = 1  # documents it stands for (a corrupt row group stands for all its rows)

    def __post_init__(self) -> None:
        # the reason may quote hostile input (field names, header lines): keep every column writable
        self.source, self.reason = printable(self.source), printable(self.reason)


@dataclass(frozen=True)
class ReadOptions:
    """Column names and limits shared by every reader."""

    text_column: str = "text"
    id_column: str = "id"
    max_doc_bytes: int = 10 * 1024 * 1024
    prefer_column: str | None = None  # the survivor policy's column (pipeline.job.prefer), read as Doc.preferred

    @cached_property
    def consumed(self) -> frozenset[str]:
        """The input columns the job consumes; every other passes through (``passes_through``)."""
        return RESERVED_COLUMNS | {self.text_column, self.id_column}



def generated_id(url: str, position: str) -> str:
    """A stable id for a document whose input has none: a hash of where it came from."""
    return xxhash.xxh3_64_hexdigest(f"{url}#{position}".encode("utf-8", "surrogatepass"))


def domain_of(url: str | None) -> str | None:
    if not url or "://" not in url:
        return None
    try:
        host = urlsplit(url).hostname
    except ValueError:  # e.g. "http://[::1": an unbalanced IPv6 bracket
        return None
    return host.lower() if host else None



def file_reject(item: InputFile, position: str, kind: str, reason: str, size: int, accounted: int = 0) -> Reject:
    """One reject for a whole file, or the unread rest of one: a corpus shard counts the rows its
    manifest lists (less those already accounted for); another file's record count is unknown."""
    if item.rows is None:
        return Reject(item.source, position, kind, f"{reason}; its record count is unknown, counted as one", size)
    rest = max(item.rows - accounted, 0)
    return Reject(item.source, position, kind, f"{reason}; counts {rest} of the {item.rows} rows its manifest lists",
                  size, count=rest)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def printable(text: str) -> str:
    """``text`` with what UTF-8 cannot hold (lone surrogates, undecodable file-name bytes) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def failed(item: InputFile, position: str, exc: Exception, size: int) -> Reject:
    """The reject for a record whose decoding raised what no specific check foresaw."""
    return Reject(item.source, position, "unparseable", f"unparseable record ({describe(exc)})", size)


def check(doc: Doc, raw_bytes: int, options: ReadOptions) -> Doc | Reject:
    if raw_bytes > options.max_doc_bytes:
        return Reject(doc.source, doc.position, "over_size_cap", f"over the size cap ({raw_bytes} > {options.max_doc_bytes} bytes)",
                      raw_bytes)
    if not doc.text.strip():
        return Reject(doc.source, doc.position, "empty", "empty text", raw_bytes)
    return doc


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON), which no text column can hold
        return False
    return True


def parse_time(value: Any) -> _dt.datetime | None:
    """A UTC time, or None for what is not one (or cannot be one in UTC, like year 9999 at -23:59)."""
    if value is None:
        return None
    try:
        parsed = value if isinstance(value, _dt.datetime) else _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return parsed.astimezone(_dt.timezone.utc) if parsed.tzinfo else parsed.replace(tzinfo=_dt.timezone.utc)
    except (ValueError, OverflowError):
        return None


def optional_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# -- compressed streams ------------------------------------------------------------------------


def names_found(names: Iterable[str]) -> str:
    """"has: a, b, c" for the fields or columns a record has (sorted, the first FIELDS_SHOWN)."""
    found = sorted(names)
    shown = ", ".join(name if len(name) <= 40 else name[:40] + "…" for name in found[:FIELDS_SHOWN])
    more = f", and {len(found) - FIELDS_SHOWN} more" if len(found) > FIELDS_SHOWN else ""
    return f"has: {shown}{more}" if found else "has no fields"


def record_doc(item: InputFile, position: str, text: str, url: Any, fields: Mapping[str, Any],
                options: ReadOptions, extra: Extra | None = None) -> Doc:
    """A document from one JSONL record or Parquet row: its URL (else the file) is the source."""
    url = optional_str(url)
    return Doc(
        id=optional_str(fields.get(options.id_column)),
        text=text,
        source=url or item.source,
        domain=optional_str(fields.get("domain")) or domain_of(url),
        language=optional_str(fields.get("language")),
        fetch_time=parse_time(fields.get("fetch_time")),
        position=position,
        url=url,
        preferred=fields.get(options.prefer_column) if options.prefer_column else None,
        extra=extra,
    )

