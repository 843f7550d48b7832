"""Input discovery and parsing for ``gristmill dedup``: Parquet, JSONL (plain, .gz, .zst), WARC, corpora.

Every record a file holds comes out of :func:`read_file` as either a :class:`Doc` or a
:class:`Reject` naming the file and the position (line, row or byte offset), so a malformed line, a
truncated stream or a corrupt Parquet file is accounted for and never stops the job. Files are
grouped into :class:`Split` s (deterministic: sorted names, a byte budget per split) that the job
processes in parallel; a document's key is ``split << 32 | ordinal``, so key order is input order
whatever the split size.
"""

from __future__ import annotations

import datetime as _dt
import gzip
import io
import json
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import fsspec
import orjson
import xxhash

from pipeline.format import MANIFEST_NAME, Corpus, CorpusError

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
KEY_BITS = 32  # ordinal bits of a document key; a split holds at most 2**32 records


REJECT_KINDS = ("invalid_utf8", "empty", "over_size_cap", "unparseable", "corrupt", "unsupported")


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


@dataclass(frozen=True)
class Split:
    """A unit of parallel work: consecutive files (in sorted order) up to a byte budget."""

    index: int
    files: tuple[InputFile, ...]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


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


@dataclass
class Reject:
    """A record that cannot become a document, with the reason and where it sits."""

    source: str
    position: str
    kind: str  # one of REJECT_KINDS
    reason: str
    bytes: int
    count: int = 1  # documents it stands for (a corrupt row group stands for all its rows)


@dataclass(frozen=True)
class ReadOptions:
    """Column names and limits shared by every reader."""

    text_column: str = "text"
    id_column: str = "id"
    max_doc_bytes: int = 10 * 1024 * 1024


def classify(path: str) -> tuple[str, str | None] | None:
    """Map a file name to (kind, compression); None for files that are not inputs."""
    name = path.lower()
    compression = None
    for suffix, codec in COMPRESSIONS.items():
        if name.endswith(suffix):
            compression, name = codec, name[: -len(suffix)]
            break
    if name.endswith(".parquet"):
        return ("parquet", None) if compression is None else None
    if name.endswith(".warc"):
        return "warc", compression
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl", compression
    return None


def _protocol_prefix(url: str) -> str:
    scheme = urlsplit(url).scheme
    return f"{scheme}://" if scheme and len(scheme) > 1 else ""


def resolve_inputs(inputs: Sequence[str], storage_options: Mapping[str, Any] | None = None) -> list[InputFile]:
    """Expand INPUT arguments (files, globs, folders, corpus folders) into a sorted, unique file list."""
    found: dict[str, InputFile] = {}
    for spec in inputs:
        fs, _ = fsspec.core.url_to_fs(spec, **dict(storage_options or {}))
        prefix = _protocol_prefix(spec)
        paths = _expand(fs, spec, storage_options)
        if not paths:
            raise InputError(f"{spec}: matches no Parquet, JSONL or WARC file")
        for path, size in paths:
            kind = classify(path)
            if kind is None:
                continue
            url = prefix + path if prefix and not path.startswith(prefix) else path
            found.setdefault(url, InputFile(url, kind[0], kind[1], size, spec))
    return [found[url] for url in sorted(found)]


def _expand(fs: fsspec.AbstractFileSystem, spec: str,
            storage_options: Mapping[str, Any] | None) -> list[tuple[str, int]]:
    """(path, size) of every candidate file an INPUT names; a corpus folder yields its manifest's shards."""
    _, path = fsspec.core.url_to_fs(spec, **dict(storage_options or {}))
    if fs.isdir(path):
        if fs.exists(posixpath.join(path, MANIFEST_NAME)):
            try:
                corpus = Corpus.open(spec, storage_options)
            except CorpusError as exc:
                raise InputError(str(exc)) from None
            return [(corpus.shard_path(s), s.bytes) for s in corpus.shards]
        return [(p, int(info.get("size") or 0)) for p, info in fs.find(path, detail=True).items()
                if classify(p) is not None]
    if any(ch in path for ch in "*?["):
        return [(p, int(info.get("size") or 0)) for p, info in fs.glob(path, detail=True).items()
                if info.get("type") != "directory"]
    if fs.exists(path):
        if classify(path) is None:
            raise InputError(f"{spec}: not a Parquet, JSONL (.jsonl/.gz/.zst) or WARC (.warc/.warc.gz) file")
        return [(path, int(fs.size(path) or 0))]
    return []


def plan_splits(files: Sequence[InputFile], split_bytes: int, first_index: int = 0) -> list[Split]:
    """Group sorted files into splits of about ``split_bytes``; a big file is a split of its own."""
    splits: list[Split] = []
    current: list[InputFile] = []
    size = 0
    for item in files:
        if current and size + item.size > split_bytes:
            splits.append(Split(first_index + len(splits), tuple(current)))
            current, size = [], 0
        current.append(item)
        size += item.size
    if current:
        splits.append(Split(first_index + len(splits), tuple(current)))
    return splits


def generated_id(url: str, position: str) -> str:
    """A stable id for a document whose input has none: a hash of where it came from."""
    return xxhash.xxh3_64_hexdigest(f"{url}#{position}".encode())


def domain_of(url: str | None) -> str | None:
    if not url or "://" not in url:
        return None
    host = urlsplit(url).hostname
    return host.lower() if host else None


def read_file(item: InputFile, options: ReadOptions,
              storage_options: Mapping[str, Any] | None = None) -> Iterator[Doc | Reject]:
    """Every record of one file, as documents or rejects; never raises for bad content."""
    readers = {"jsonl": _read_jsonl, "parquet": _read_parquet, "warc": _read_warc}
    try:
        yield from readers[item.kind](item, options, storage_options)
    except (OSError, ValueError) as exc:  # unreadable file (missing, permission): one reject for it all
        yield Reject(item.url, "file", "corrupt", f"unreadable file ({type(exc).__name__}: {exc})", item.size)


def _check(doc: Doc, raw_bytes: int, options: ReadOptions) -> Doc | Reject:
    if raw_bytes > options.max_doc_bytes:
        return Reject(doc.source, doc.position, "over_size_cap", f"over the size cap ({raw_bytes} > {options.max_doc_bytes} bytes)",
                      raw_bytes)
    if not doc.text.strip():
        return Reject(doc.source, doc.position, "empty", "empty text", raw_bytes)
    return doc


def _parse_time(value: Any) -> _dt.datetime | None:
    if value is None or isinstance(value, _dt.datetime):
        return value
    try:
        parsed = _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=_dt.timezone.utc)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _read_jsonl(item: InputFile, options: ReadOptions,
                storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    import zstandard

    lineno = 0
    with fsspec.open(item.url, "rb", **dict(storage_options or {})) as raw_handle:
        if item.compression == "gzip":
            handle: Any = gzip.GzipFile(fileobj=raw_handle)
        elif item.compression == "zstd":
            handle = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw_handle))
        else:
            handle = raw_handle
        try:
            for lineno, raw in enumerate(handle, 1):  # noqa: B007 - lineno is used after the loop
                yield _jsonl_record(item, lineno, raw, options)
        except (EOFError, OSError, zstandard.ZstdError) as exc:
            yield Reject(item.url, f"line {lineno + 1}", "corrupt",
                         f"truncated or corrupt {item.compression or 'file'} stream after line {lineno} "
                         f"({type(exc).__name__}: {exc}); the rest of the file is lost", 0)


def _jsonl_record(item: InputFile, lineno: int, raw: bytes, options: ReadOptions) -> Doc | Reject:
    position = f"line {lineno}"
    if not raw.strip():
        return Reject(item.url, position, "empty", "empty line", len(raw))
    try:
        record = orjson.loads(raw)  # a third of json's time; it also checks the UTF-8
    except orjson.JSONDecodeError:
        # what orjson refuses (bad bytes, lone surrogates, huge integers, NaN) the standard library
        # classifies, so every line is judged as before
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            return Reject(item.url, position, "invalid_utf8", f"invalid UTF-8 at byte {exc.start}", len(raw))
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            return Reject(item.url, position, "unparseable", f"unparseable line ({exc.msg} at column {exc.colno})",
                          len(raw))
    if not isinstance(record, dict):
        return Reject(item.url, position, "unparseable", "unparseable line (not a JSON object)", len(raw))
    text = record.get(options.text_column)
    if not isinstance(text, str):
        return Reject(item.url, position, "unparseable", f"unparseable line (no string {options.text_column!r} field)", len(raw))
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:  # JSON may escape lone surrogates ("\ud800"), which are not text
        return Reject(item.url, position, "invalid_utf8", f"invalid Unicode in text ({exc.reason} at {exc.start})",
                      len(raw))
    return _check(_record_doc(item, position, text, record.get("url"), record, options), size, options)


_PARQUET_EXTRA = ("url", "final_url", "source", "domain", "language", "fetch_time")


def _read_parquet(item: InputFile, options: ReadOptions,
                  storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fsspec.open(item.url, "rb", **dict(storage_options or {})) as handle:
        try:
            parquet = pq.ParquetFile(handle)
        except (pa.ArrowException, OSError) as exc:
            yield Reject(item.url, "file", "corrupt", f"corrupt Parquet file ({type(exc).__name__}: {exc})", item.size)
            return
        names = parquet.schema_arrow.names
        if options.text_column not in names:
            yield Reject(item.url, "file", "unparseable", f"Parquet file has no {options.text_column!r} column "
                                           f"(columns: {', '.join(names)})", item.size)
            return
        wanted = [c for c in dict.fromkeys([options.text_column, options.id_column, *_PARQUET_EXTRA]) if c in names]
        row = 0
        for group in range(parquet.metadata.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            try:
                table = parquet.read_row_group(group, columns=wanted)
                texts = table.column(options.text_column).cast(pa.binary()).to_pylist()
                columns = {c: table.column(c).to_pylist() for c in wanted if c != options.text_column}
            except (pa.ArrowException, OSError, ValueError) as exc:
                yield Reject(item.url, f"row group {group} (rows {row}-{row + rows - 1})", "corrupt",
                             f"corrupt Parquet row group ({type(exc).__name__}: {exc})",
                             parquet.metadata.row_group(group).total_byte_size, count=rows)
                row += rows
                continue
            for offset, raw in enumerate(texts):
                yield _parquet_record(item, row + offset, raw, {c: v[offset] for c, v in columns.items()}, options)
            row += rows


def _parquet_record(item: InputFile, row: int, raw: bytes | None, values: Mapping[str, Any],
                    options: ReadOptions) -> Doc | Reject:
    position = f"row {row}"
    if raw is None:
        return Reject(item.url, position, "empty", "null text", 0)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Reject(item.url, position, "invalid_utf8", f"invalid UTF-8 at byte {exc.start}", len(raw))
    url = values.get("final_url") or values.get("url") or values.get("source")
    return _check(_record_doc(item, position, text, url, values, options), len(raw), options)


def _record_doc(item: InputFile, position: str, text: str, url: Any, fields: Mapping[str, Any],
                options: ReadOptions) -> Doc:
    """A document from one JSONL record or Parquet row: its URL (else the file) is the source."""
    return Doc(
        id=_optional_str(fields.get(options.id_column)),
        text=text,
        source=str(url) if url else item.url,
        domain=_optional_str(fields.get("domain")) or domain_of(url),
        language=_optional_str(fields.get("language")),
        fetch_time=_parse_time(fields.get("fetch_time")),
        position=position,
    )


def _read_warc(item: InputFile, options: ReadOptions,
               storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    from warcio.archiveiterator import ArchiveIterator
    from warcio.exceptions import ArchiveLoadFailed

    with fsspec.open(item.url, "rb", **dict(storage_options or {})) as handle:
        iterator = ArchiveIterator(handle)
        offset = 0
        try:
            for record in iterator:
                if record.rec_type not in ("response", "resource", "conversion"):
                    continue
                body = record.content_stream().read()  # before get_record_offset, which skips the rest
                offset = iterator.get_record_offset()
                yield _warc_record(item, record, body, offset, options)
        except (ArchiveLoadFailed, EOFError, OSError, ValueError, AttributeError, KeyError) as exc:
            # warcio raises AttributeError/KeyError, not only ArchiveLoadFailed, on some malformed headers
            yield Reject(item.url, f"record after offset {offset}", "corrupt",
                         f"corrupt WARC record ({type(exc).__name__}: {exc}); the rest of the file is lost", 0)


def _warc_record(item: InputFile, record: Any, body: bytes, offset: int, options: ReadOptions) -> Doc | Reject:
    """One response/resource record: HTML through the crawler's extraction, plain text as is."""
    from crawlers.extract import decode_html, detect_language, extract_text

    position = f"record at offset {offset}"
    url = record.rec_headers.get_header("WARC-Target-URI")
    headers = record.http_headers if record.http_headers is not None else record.rec_headers
    content_type = headers.get_header("Content-Type") or ""
    mime = content_type.split(";")[0].strip().lower()
    charset = None
    for part in content_type.split(";")[1:]:
        key, _, value = part.partition("=")
        if key.strip().lower() == "charset":
            charset = value.strip()
    if mime and not (mime.startswith("text/") or "html" in mime or "xml" in mime):
        return Reject(item.url, position, "unsupported", f"unsupported content type {mime!r}", len(body))
    decoded = decode_html(body, charset)[0]
    is_html = "html" in mime or decoded.lstrip()[:15].lower().startswith(("<!doctype", "<html"))
    text = extract_text(decoded, url) if is_html else decoded
    language = record.rec_headers.get_header("WARC-Identified-Content-Language") or (
        detect_language(text) if text.strip() else None)
    doc = Doc(
        id=_optional_str(record.rec_headers.get_header("WARC-Record-ID")),
        text=text,
        source=url or item.url,
        domain=domain_of(url),
        language=language,
        fetch_time=_parse_time(record.rec_headers.get_header("WARC-Date")),
        position=position,
    )
    return _check(doc, len(body), options)
