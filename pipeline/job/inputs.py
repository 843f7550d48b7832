"""Input discovery and parsing for ``gristmill dedup``: Parquet, JSONL (plain, .gz, .zst), WARC, corpora.

Every record a file holds comes out of :func:`read_piece` as either a :class:`Doc` or a
:class:`Reject` naming the file and the position (line, row or byte offset), so a malformed line, a
truncated stream or a corrupt Parquet file is accounted for and never stops the job. Files are cut
into :class:`Split` s of :class:`Piece` s (deterministic: sorted names, a byte budget per split; an
uncompressed file may be cut, a compressed one is whole) that the job processes in parallel; a
piece reads the records that start in its byte range, with the positions a whole read gives. A
document's key is ``split << 32 | ordinal``, so key order is input order whatever the split size.

How damage is counted (the job's identity kept + exact + near + rejected = input rests on it):

- A record whose decoding fails in any way is one reject at its position; reading goes on with the
  next record (JSONL: the next line; Parquet: the next row or row group; WARC: the next line that
  starts a record, so a damaged record never merges into its neighbour).
- A compressed stream that ends without its proper end (a truncated .gz or .zst) or breaks off
  (corrupt data) keeps the records read whole before the damage; the unreadable rest is one
  ``corrupt`` reject naming the last line (or byte offset) read whole.
- A WARC record is checked against its Content-Length, the empty lines that must follow it, and its
  WARC-Block-Digest / WARC-Payload-Digest when present; a record that fails is one ``corrupt`` reject.
- A Parquet row group that cannot be decoded counts its rows; a file whose footer cannot be read, or
  a file that cannot be opened at all, is one reject for the file: a corpus shard counts the rows its
  manifest lists, any other file counts one (its record count is unknown, and the reason says so).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import gzip
import io
import json
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, BinaryIO, NamedTuple
from urllib.parse import urlsplit

import fsspec
import orjson
import xxhash

from pipeline.format import MANIFEST_NAME, Corpus, CorpusError

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
KEY_BITS = 32  # ordinal bits of a document key; a split holds at most 2**32 records


WARC_DOCUMENT_TYPES = ("response", "resource", "conversion")
# The other record types of WARC 1.1: skipped, not counted. A type outside both lists (perhaps a
# damaged header) is an "unsupported" reject, so damage to the type never drops a record unseen.
WARC_OTHER_TYPES = ("warcinfo", "request", "metadata", "revisit", "continuation")
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

    @cached_property
    def source(self) -> str:
        """The URL as text for the source and reject columns: a file name's bytes that are not UTF-8
        are shown escaped (the text columns cannot hold them, and one such name stopped the job)."""
        return _printable(self.url)


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
        self.source, self.reason = _printable(self.source), _printable(self.reason)


@dataclass(frozen=True)
class ReadOptions:
    """Column names and limits shared by every reader."""

    text_column: str = "text"
    id_column: str = "id"
    max_doc_bytes: int = 10 * 1024 * 1024
    prefer_column: str | None = None  # the survivor policy's column (pipeline.job.prefer), read as Doc.preferred


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
        for path, size, rows in paths:
            kind = classify(path)
            if kind is None:
                continue
            url = prefix + path if prefix and not path.startswith(prefix) else path
            found.setdefault(url, InputFile(url, kind[0], kind[1], size, _printable(spec), rows))
    return [found[url] for url in sorted(found)]


def _expand(fs: fsspec.AbstractFileSystem, spec: str,
            storage_options: Mapping[str, Any] | None) -> list[tuple[str, int, int | None]]:
    """(path, size, manifest rows) of every candidate file an INPUT names; a corpus folder yields its
    manifest's shards with their row counts, so a shard that is gone still counts its rows."""
    _, path = fsspec.core.url_to_fs(spec, **dict(storage_options or {}))
    if fs.isdir(path):
        if fs.exists(posixpath.join(path, MANIFEST_NAME)):
            return _corpus_shards(fs, path, storage_options)
        found = {p: int(info.get("size") or 0) for p, info in fs.find(path, detail=True).items()
                 if classify(p) is not None or posixpath.basename(p) == MANIFEST_NAME}
        return _outside_corpora(fs, path, found, storage_options, walked=True)
    if any(ch in path for ch in "*?["):
        found = {p: int(info.get("size") or 0) for p, info in fs.glob(path, detail=True).items()
                 if info.get("type") != "directory"}
        prefix = path[: min(path.index(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
        return _outside_corpora(fs, prefix, found, storage_options, walked=False)
    if fs.exists(path):
        if classify(path) is None:
            raise InputError(f"{spec}: not a Parquet, JSONL (.jsonl/.gz/.zst) or WARC (.warc/.warc.gz) file")
        return [(path, int(fs.size(path) or 0), None)]
    return []


def _corpus_shards(fs: fsspec.AbstractFileSystem, folder: str,
                   storage_options: Mapping[str, Any] | None) -> list[tuple[str, int, int | None]]:
    """The shards a corpus folder's manifest lists, with their rows (a shard that is gone still counts)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    url = folder if protocol in ("file", "local") else f"{protocol}://{folder}"
    try:
        corpus = Corpus.open(url, storage_options)
    except CorpusError as exc:
        raise InputError(str(exc)) from None
    return [(corpus.shard_path(s), s.bytes, s.rows) for s in corpus.shards]


def _outside_corpora(fs: fsspec.AbstractFileSystem, top: str, found: Mapping[str, int],
                     storage_options: Mapping[str, Any] | None,
                     walked: bool) -> list[tuple[str, int, int | None]]:
    """Files a folder walk or a glob found, never a corpus's own files: a corpus folder among them
    (one holding a manifest) contributes the shards its manifest lists, not its index, rejects, work or
    unlisted files. A walk takes every listed shard of a corpus it finds; a glob keeps only the listed
    shards it matched."""
    holds_manifest: dict[str, bool] = {}

    def corpus_folder(file: str) -> str | None:
        folder = posixpath.dirname(file)
        while folder.startswith(top) and folder != posixpath.dirname(folder):
            if folder not in holds_manifest:
                holds_manifest[folder] = fs.exists(posixpath.join(folder, MANIFEST_NAME))
            if holds_manifest[folder]:
                return folder
            folder = posixpath.dirname(folder)
        return None

    result: list[tuple[str, int, int | None]] = []
    listed: dict[str, dict[str, tuple[int, int | None]]] = {}
    for file, size in sorted(found.items()):
        folder = corpus_folder(file)
        if folder is None:
            if posixpath.basename(file) != MANIFEST_NAME:
                result.append((file, size, None))
            continue
        if folder not in listed:
            shards = _corpus_shards(fs, folder, storage_options)
            listed[folder] = {path: (size, rows) for path, size, rows in shards}
            if walked:
                result.extend(shards)
        if not walked and file in listed[folder]:
            result.append((file, *listed[folder][file]))
    return result


# A split's pieces are its read task's argument: at most this many keeps it a few KB whatever the
# input (a split of small files is cut by count as well as by bytes).
SPLIT_MAX_PIECES = 64
# A file is cut where a split fills up, but never into a piece under this part of a split: the split
# is closed and the file starts the next one.
MIN_PIECE_PART = 4


def cuttable(item: InputFile) -> bool:
    """Whether a file may be cut into pieces: not when compressed (a gzip or zstd stream is read from
    its start, so it is read whole by one task)."""
    return item.compression is None


def plan_splits(files: Sequence[InputFile], split_bytes: int, first_index: int = 0) -> list[Split]:
    """Cut the sorted files into splits of about ``split_bytes`` and at most SPLIT_MAX_PIECES pieces.

    An uncompressed file that does not fit is cut where the split fills up (and its rest goes on in
    the next splits); a compressed one is whole, a split of its own when it is big. The same files
    and budget always give the same splits.
    """
    splits: list[Split] = []
    pieces: list[Piece] = []
    size = 0

    def close() -> None:
        nonlocal pieces, size
        if pieces:
            splits.append(Split(first_index + len(splits), tuple(pieces)))
        pieces, size = [], 0

    for item in files:
        if len(pieces) >= SPLIT_MAX_PIECES:
            close()
        start = 0
        while cuttable(item) and item.size - start > split_bytes - size:
            room = split_bytes - size
            if room >= max(split_bytes // MIN_PIECE_PART, 1):
                pieces.append(Piece(item, start, start + room))
                start += room
            close()
        if pieces and size + item.size - start > split_bytes:
            close()
        pieces.append(Piece(item, start))
        size += item.size - start
    close()
    return splits


_COUNT_CHUNK_BYTES = 4 * 1024 * 1024


def needs_line_count(piece: Piece) -> bool:
    """Whether ``piece``'s newlines must be counted before the read: a JSONL piece with more of its file
    after it (the later pieces number their lines from the count)."""
    return piece.file.kind == "jsonl" and piece.end is not None


def count_newlines(piece: Piece, storage_options: Mapping[str, Any] | None = None) -> int:
    """The newlines in bytes [start - 1, end - 1) of the piece's file (from byte 0 for the first piece):
    summed over a file's earlier pieces, the lines that start before a later one (``number_lines``).

    A file that cannot be read counts 0: its pieces cannot read it either, and the first one says so.
    """
    begin, stop = max(piece.start - 1, 0), (piece.file.size if piece.end is None else piece.end) - 1
    count = 0
    try:
        with fsspec.open(piece.file.url, "rb", **dict(storage_options or {})) as handle:
            handle.seek(begin)
            left = stop - begin
            while left > 0 and (chunk := handle.read(min(left, _COUNT_CHUNK_BYTES))):
                count += chunk.count(b"\n")
                left -= len(chunk)
    except Exception:  # noqa: BLE001 - reading the file is the readers' business, with their rejects
        return 0
    return count


def number_lines(splits: Sequence[Split], newlines: Mapping[int, Sequence[int | None]]) -> list[Split]:
    """The splits with the first line number of every later JSONL piece of a cut file, from the newlines
    ``count_newlines`` found in its earlier pieces (``newlines[split index]``, one entry per piece,
    None where not counted), so a cut file's line numbers (and the ids generated from them) are those
    of a whole read."""
    before: dict[str, int] = {}  # a cut file's newlines before the end of its pieces so far
    numbered = []
    for split in splits:
        counts = newlines.get(split.index, ())
        pieces = []
        for i, piece in enumerate(split.pieces):
            url = piece.file.url
            if piece.file.kind == "jsonl" and piece.start > 0:
                piece = dataclasses.replace(piece, first_line=2 + before[url])
            if i < len(counts) and counts[i] is not None:
                before[url] = before.get(url, 0) + counts[i]
            elif piece.end is None:
                before.pop(url, None)
            pieces.append(piece)
        numbered.append(dataclasses.replace(split, pieces=tuple(pieces)))
    return numbered


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


def read_file(item: InputFile, options: ReadOptions,
              storage_options: Mapping[str, Any] | None = None) -> Iterator[Doc | Reject]:
    """Every record of one whole file, as documents or rejects; never raises for bad content."""
    return read_piece(Piece(item), options, storage_options)


def read_piece(piece: Piece, options: ReadOptions,
               storage_options: Mapping[str, Any] | None = None) -> Iterator[Doc | Reject]:
    """Every record that starts in one piece of a file, as documents or rejects, with the positions
    (line, row, byte offset) a whole read gives; never raises for bad content.

    The readers isolate each record; what still escapes them (the file cannot be opened, or fails
    between records) ends the piece with one reject for what was not read. What concerns the whole
    file (it cannot be opened, a Parquet footer or text column that cannot be used) is reported by its
    first piece alone, so a cut file's rejects count as a whole one's.
    """
    readers = {"jsonl": _read_jsonl, "parquet": _read_parquet, "warc": _read_warc}
    item, accounted = piece.file, 0
    try:
        for record in readers[item.kind](piece, options, storage_options):
            accounted += record.count if isinstance(record, Reject) else 1
            yield record
    except Exception as exc:  # noqa: BLE001 - whatever it is, the job goes on with the next file
        if accounted and piece.whole:
            yield _file_reject(item, f"after record {accounted}", "corrupt",
                               f"reading stopped ({_describe(exc)}); the rest of the file is lost", 0, accounted)
        elif accounted:
            yield Reject(item.source, f"after record {accounted} from byte {piece.start}", "corrupt",
                         f"reading stopped ({_describe(exc)}); the rest of bytes {piece.start}-{piece.end or item.size} "
                         "is lost; its record count is unknown, counted as one", 0)
        elif piece.start == 0:
            yield _file_reject(item, "file", "corrupt", f"unreadable file ({_describe(exc)})", item.size)


def _file_reject(item: InputFile, position: str, kind: str, reason: str, size: int, accounted: int = 0) -> Reject:
    """One reject for a whole file, or the unread rest of one: a corpus shard counts the rows its
    manifest lists (less those already accounted for); another file's record count is unknown."""
    if item.rows is None:
        return Reject(item.source, position, kind, f"{reason}; its record count is unknown, counted as one", size)
    rest = max(item.rows - accounted, 0)
    return Reject(item.source, position, kind, f"{reason}; counts {rest} of the {item.rows} rows its manifest lists",
                  size, count=rest)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _printable(text: str) -> str:
    """``text`` with what UTF-8 cannot hold (lone surrogates, undecodable file-name bytes) escaped."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _failed(item: InputFile, position: str, exc: Exception, size: int) -> Reject:
    """The reject for a record whose decoding raised what no specific check foresaw."""
    return Reject(item.source, position, "unparseable", f"unparseable record ({_describe(exc)})", size)


def _check(doc: Doc, raw_bytes: int, options: ReadOptions) -> Doc | Reject:
    if raw_bytes > options.max_doc_bytes:
        return Reject(doc.source, doc.position, "over_size_cap", f"over the size cap ({raw_bytes} > {options.max_doc_bytes} bytes)",
                      raw_bytes)
    if not doc.text.strip():
        return Reject(doc.source, doc.position, "empty", "empty text", raw_bytes)
    return doc


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in JSON), which no text column can hold
        return False
    return True


def _parse_time(value: Any) -> _dt.datetime | None:
    """A UTC time, or None for what is not one (or cannot be one in UTC, like year 9999 at -23:59)."""
    if value is None:
        return None
    try:
        parsed = value if isinstance(value, _dt.datetime) else _dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        return parsed.astimezone(_dt.timezone.utc) if parsed.tzinfo else parsed.replace(tzinfo=_dt.timezone.utc)
    except (ValueError, OverflowError):
        return None


def _optional_str(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


# -- compressed streams ------------------------------------------------------------------------
_ZSTD_READ_BYTES = 128 * 1024  # compressed bytes decoded at a time
_STREAM_BUFFER_BYTES = 256 * 1024


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of concatenated zstd frames; EOFError where the input ends inside a frame.

    ``zstandard``'s stream reader ends quietly there, so a truncated .zst lost its tail (often all of
    it: a frame's blocks decode only whole) and was counted as 0 documents and 0 rejects.
    """

    def __init__(self, source: BinaryIO) -> None:
        import zstandard

        self._source = source
        self._decompressor = zstandard.ZstdDecompressor()
        self._frame: Any = None  # the decoder of the frame being read; None between frames
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._pending:
            compressed = self._source.read(_ZSTD_READ_BYTES)
            if not compressed:
                if self._frame is not None:
                    raise EOFError("the zstd stream ends inside a frame")
                return 0
            self._pending = memoryview(self._decompress(compressed))
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size

    def _decompress(self, data: bytes) -> bytes:
        out = []
        while data:
            if self._frame is None:
                self._frame = self._decompressor.decompressobj()
            out.append(self._frame.decompress(data))
            if not self._frame.eof:
                break
            data, self._frame = self._frame.unused_data, None
        return b"".join(out)


def _decompressed(item: InputFile, raw: BinaryIO) -> tuple[BinaryIO, str | None]:
    """The file's bytes, decompressed, and the compression used; a stream that ends early or breaks off
    raises while it is read. For WARC the first bytes can add what the name does not say (a gzipped
    .warc, as warcio read it); a JSONL file is taken as named, since a hostile first line may begin
    with a compressor's magic bytes and must cost only itself."""
    head = raw.read(4)
    raw.seek(0)
    compression = item.compression
    if item.kind == "warc" and compression is None:
        compression = "gzip" if head.startswith(b"\x1f\x8b") else "zstd" if head == b"\x28\xb5\x2f\xfd" else None
    if compression and not head:  # gzip reads an empty file as empty content; no compressor writes one
        raise EOFError(f"empty file: no {compression} header")
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw), compression
    if compression == "zstd":
        return io.BufferedReader(_ZstdFrames(raw), _STREAM_BUFFER_BYTES), compression
    if isinstance(raw, fsspec.spec.AbstractBufferedFile):  # an object store's file: its readline takes no size
        return io.BufferedReader(raw, _STREAM_BUFFER_BYTES), None
    return raw, None


# -- JSONL -------------------------------------------------------------------------------------
def _read_jsonl(piece: Piece, options: ReadOptions,
                storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    item = piece.file
    lineno, compression = piece.first_line - 1, item.compression
    with fsspec.open(item.url, "rb", **dict(storage_options or {})) as raw_handle:
        try:
            stream, compression = _decompressed(item, raw_handle)
            first = _first_line_start(piece, stream, compression)
            if first is None:
                return
            stop = None if compression is not None or piece.end is None else piece.end - first
            limit = _record_limit(options)
            for lineno, (raw, length) in enumerate(_bounded_lines(stream, limit, stop),  # noqa: B007 - used after
                                                   piece.first_line):
                if raw is None:
                    yield Reject(item.source, f"line {lineno}", "over_size_cap",
                                 f"line of {length} bytes is over the {limit}-byte line cap (--max-doc-bytes x "
                                 f"{RAW_RECORD_EXPANSION}); skipped without reading it into memory", length)
                    continue
                try:
                    record = _jsonl_record(item, lineno, raw, options)
                except Exception as exc:  # noqa: BLE001 - one line's failure rejects that line only
                    record = _failed(item, f"line {lineno}", exc, len(raw))
                yield record
        except Exception as exc:  # noqa: BLE001 - the stream itself: truncated, corrupt or unreadable
            yield Reject(item.source, f"line {lineno + 1}", "corrupt",
                         f"truncated or corrupt {compression or 'file'} stream after line {lineno}, the last "
                         f"line read whole ({_describe(exc)}); the rest of the file is lost", 0)


# A raw record (a JSONL line, a WARC block) may be up to this many times --max-doc-bytes (JSON escapes
# such as \u00e9 take 6 bytes for 2; HTML carries markup) before it is refused unread: a giant record
# never reaches a worker's memory whole.
RAW_RECORD_EXPANSION = 8
_LINE_CHUNK = 1 << 20


def _record_limit(options: ReadOptions) -> int:
    return max(options.max_doc_bytes * RAW_RECORD_EXPANSION, _LINE_CHUNK)


def _bounded_lines(stream: Any, limit: int, stop: int | None = None) -> Iterator[tuple[bytes | None, int]]:
    """(line, length) for each line of a binary stream (with ``stop``, each line that starts in its next
    ``stop`` bytes); (None, length) for a line over ``limit`` bytes, which is read past in chunks
    rather than held."""
    consumed = 0
    while (stop is None or consumed < stop) and (raw := stream.readline(limit + 1)):
        length = len(raw)
        if length > limit and not raw.endswith(b"\n"):
            while chunk := stream.readline(_LINE_CHUNK):
                length += len(chunk)
                if chunk.endswith(b"\n"):
                    break
            raw = None
        consumed += length
        yield raw, length


def _first_line_start(piece: Piece, stream: Any, compression: str | None) -> int | None:
    """Move ``stream`` to the first line that starts in ``piece`` (the one after the line that holds
    byte start - 1) and return its offset; None when no line starts in the piece. A cut file whose
    content turns out compressed (a gzip stream named .jsonl) is read whole by its first piece."""
    if piece.start == 0 or compression is not None:
        return 0 if piece.start == 0 else None
    position = piece.start - 1
    stream.seek(position)
    while piece.end is None or position < piece.end:
        chunk = stream.readline(_LINE_CHUNK)
        if not chunk:
            return None
        position += len(chunk)
        if chunk.endswith(b"\n"):
            return position if piece.end is None or position < piece.end else None
    return None


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
    return _check(_record_doc(item, position, text, record.get("url"), record, options), size, options)


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
        return Reject(item.source, position, "unparseable", f"unparseable line ({_describe(exc)})", len(raw))
    for name in (options.id_column, "url", "domain", "language") if isinstance(record, dict) else ():
        value = record.get(name)  # json lets lone surrogates ("\ud800") in; no text column can hold them
        if isinstance(value, str) and not _encodable(value):
            return Reject(item.source, position, "invalid_utf8", f"invalid Unicode in the {name!r} field", len(raw))
    return record


def _no_text_reason(record: Mapping[str, Any], text_column: str) -> str:
    """Why a record has no text, naming the fields it does have (a run that rejects everything
    prints them as a hint for ``--text-column``)."""
    if text_column in record:
        kind = _JSON_TYPES.get(type(record[text_column]), "a value")
        return f"{text_column!r} field is {kind}, not a string"
    return f"no {text_column!r} field ({_names_found(record)})"


def _names_found(names: Iterable[str]) -> str:
    """"has: a, b, c" for the fields or columns a record has (sorted, the first FIELDS_SHOWN)."""
    found = sorted(names)
    shown = ", ".join(name if len(name) <= 40 else name[:40] + "…" for name in found[:FIELDS_SHOWN])
    more = f", and {len(found) - FIELDS_SHOWN} more" if len(found) > FIELDS_SHOWN else ""
    return f"has: {shown}{more}" if found else "has no fields"


def _record_doc(item: InputFile, position: str, text: str, url: Any, fields: Mapping[str, Any],
                options: ReadOptions) -> Doc:
    """A document from one JSONL record or Parquet row: its URL (else the file) is the source."""
    url = _optional_str(url)
    return Doc(
        id=_optional_str(fields.get(options.id_column)),
        text=text,
        source=url or item.source,
        domain=_optional_str(fields.get("domain")) or domain_of(url),
        language=_optional_str(fields.get("language")),
        fetch_time=_parse_time(fields.get("fetch_time")),
        position=position,
        url=url,
        preferred=fields.get(options.prefer_column) if options.prefer_column else None,
    )


# -- Parquet -----------------------------------------------------------------------------------
_PARQUET_EXTRA = ("url", "final_url", "source", "domain", "language", "fetch_time")


def _text_column_problem(schema: Any, column: str) -> str | None:
    """Why a Parquet file has no usable text column (each of its rows is then rejected), or None."""
    import pyarrow as pa

    if column not in schema.names:
        return f"no {column!r} column ({_names_found(schema.names)})"
    if schema.names.count(column) > 1:
        return f"the {column!r} column appears {schema.names.count(column)} times"
    arrow_type = schema.field(column).type
    value_type = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    if not any(check(value_type) for check in (
            pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view, pa.types.is_binary,
            pa.types.is_large_binary, pa.types.is_binary_view, pa.types.is_fixed_size_binary)):
        return f"the {column!r} column is {arrow_type}, not text"
    return None


def _read_parquet(piece: Piece, options: ReadOptions,
                  storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    item = piece.file
    first = piece.start == 0  # what concerns the whole file is its first piece's to report
    with fsspec.open(item.url, "rb", **dict(storage_options or {})) as handle:
        try:
            parquet = pq.ParquetFile(handle, page_checksum_verification=True)  # CRCs where written
            metadata, schema = parquet.metadata, parquet.schema_arrow
        except Exception as exc:  # noqa: BLE001 - a footer that cannot be read, whatever pyarrow raises
            if first:
                yield _file_reject(item, "file", "corrupt", f"corrupt Parquet file ({_describe(exc)})", item.size)
            return
        group_rows = [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)]
        if sum(group_rows) != metadata.num_rows or min(group_rows, default=0) < 0:
            if first:
                yield _file_reject(item, "file", "corrupt", f"corrupt Parquet footer (its row groups hold "
                                   f"{sum(group_rows)} rows, the file {metadata.num_rows})", item.size)
            return
        if item.rows is not None and metadata.num_rows != item.rows:
            if first:
                yield _file_reject(item, "file", "corrupt", f"the shard holds {metadata.num_rows} rows", item.size)
            return
        problem = _text_column_problem(schema, options.text_column)
        if problem is not None:
            if first:
                yield Reject(item.source, "file", "unparseable", problem, item.size, count=metadata.num_rows)
            return
        extra = [options.prefer_column] if options.prefer_column else []
        wanted = [c for c in dict.fromkeys([options.text_column, options.id_column, *_PARQUET_EXTRA, *extra])
                  if schema.names.count(c) == 1]
        row = 0
        for group, rows in enumerate(group_rows):
            if not _row_group_in(metadata, group, piece):
                row += rows
                continue
            try:
                # no threads: threaded reads through a Python file object abort the process now and
                # then (apache/arrow#34314); the job's parallelism is across splits anyway
                table = parquet.read_row_group(group, columns=wanted, use_threads=False)
                if table.num_rows != rows:
                    raise ValueError(f"{table.num_rows} rows decoded where the footer says {rows}")
                texts = table.column(options.text_column).cast(pa.binary()).to_pylist()
                columns = {c: _python_values(table.column(c)) for c in wanted if c != options.text_column}
            except Exception as exc:  # noqa: BLE001 - a damaged row group costs its rows, not the file
                yield Reject(item.source, f"row group {group} (rows {row}-{row + rows - 1})", "corrupt",
                             f"corrupt Parquet row group ({_describe(exc)})",
                             metadata.row_group(group).total_byte_size, count=rows)
                row += rows
                continue
            for offset, raw in enumerate(texts):
                try:
                    record = _parquet_record(item, row + offset, raw, {c: v[offset] for c, v in columns.items()},
                                             options)
                except Exception as exc:  # noqa: BLE001 - one row's failure rejects that row only
                    record = _failed(item, f"row {row + offset}", exc, len(raw or b""))
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
                    options: ReadOptions) -> Doc | Reject:
    position = f"row {row}"
    if raw is None:
        return Reject(item.source, position, "empty", "null text", 0)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Reject(item.source, position, "invalid_utf8", f"invalid UTF-8 at byte {exc.start}", len(raw))
    url = values.get("final_url") or values.get("url") or values.get("source")
    return _check(_record_doc(item, position, text, url, values, options), len(raw), options)


# -- WARC --------------------------------------------------------------------------------------
_WARC_LINE_BYTES = 64 * 1024  # a longer header line is damage
_WARC_HEADER_LINES = 1000
_WARC_CHUNK_BYTES = 256 * 1024


class _WarcStream:
    """A WARC byte stream handed out as lines and blocks, which takes bytes back: the block of a record
    whose framing turns out wrong is searched for the next record instead of being skipped whole.
    ``offset`` counts the bytes handed out (in the decompressed stream)."""

    def __init__(self, stream: BinaryIO, offset: int = 0) -> None:
        # read1: one read of a decompressing stream that hits damage loses what it decoded before
        self._read = getattr(stream, "read1", stream.read)
        self._buffer = bytearray()
        self.offset = offset  # where the stream stands in the file

    def _fill(self) -> bool:
        chunk = self._read(_WARC_CHUNK_BYTES)
        self._buffer += chunk
        return bool(chunk)

    def _take(self, size: int) -> bytes:
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        self.offset += len(data)
        return data

    def read(self, size: int) -> bytes:
        """``size`` bytes, or fewer at the end of the stream (read in chunks: a huge Content-Length
        costs only the bytes really there)."""
        while len(self._buffer) < size and self._fill():
            pass
        return self._take(size)

    def readline(self) -> bytes:
        """One line with its newline, at most _WARC_LINE_BYTES (a longer one comes in pieces)."""
        start = 0
        while True:
            end = self._buffer.find(b"\n", start, _WARC_LINE_BYTES)
            if end >= 0:
                return self._take(end + 1)
            start = len(self._buffer)
            if start >= _WARC_LINE_BYTES or not self._fill():
                return self._take(_WARC_LINE_BYTES)

    def skip(self, size: int) -> int:
        """Pass over up to ``size`` bytes without holding them; returns how many there were."""
        skipped = 0
        while skipped < size and (self._buffer or self._fill()):
            skipped += len(self._take(min(size - skipped, len(self._buffer))))
        return skipped

    def unread(self, data: bytes) -> None:
        self._buffer[:0] = data
        self.offset -= len(data)


class _WarcRecord(NamedTuple):
    offset: int
    data: bytes  # header and block, as in the file
    warc_type: str
    problem: str | None  # why the record is damaged; None for a sound one
    oversized: bool = False  # a sound frame whose block was over the cap, skipped unread


def _warc_records(stream: _WarcStream, limit: int, end: int | None = None) -> Iterator[_WarcRecord]:
    """Every record of a WARC byte stream, sound or damaged, in file order; with ``end``, up to the
    first line at or after ``end`` that starts ``WARC/1.`` (a later piece's first record).

    A sound record has a WARC/ version line, well-formed headers with a Content-Length, that many
    bytes of block, then an empty line (CRLF CRLF; the end of the file may cut those). A damaged one
    is reported and reading resumes at the next line that starts a record, searched from just after
    the damaged record's header, so a wrong Content-Length never swallows the next record. A block over
    ``limit`` bytes is passed over unread (``oversized``): a giant record never reaches memory whole.
    """
    while True:
        line = stream.readline()
        if not line:
            return
        if not line.strip():
            continue
        offset = stream.offset - len(line)
        if end is not None and offset >= end and line.startswith(b"WARC/1."):
            return
        lines, warc_type, length, problem = _warc_header(stream, line)
        if problem is None and length > limit:
            skipped = stream.skip(length)
            trailer = stream.read(4) if skipped == length else b""
            if skipped == length and (trailer == b"\r\n\r\n" or b"\r\n\r\n".startswith(trailer)):
                yield _WarcRecord(offset, b"", warc_type, f"a block of {length} bytes, over the {limit}-byte "
                                  "record cap; skipped unread", oversized=True)
                continue
            yield _WarcRecord(offset, b"", warc_type, f"the file ends {skipped} bytes into a block of {length} "
                              "(Content-Length)" if skipped < length else "no empty line after its block")
            if not _resynchronise(stream, end):
                return
            continue
        if problem is None:
            block = stream.read(length)
            trailer = stream.read(4) if len(block) == length else b""
            if len(block) == length and (trailer == b"\r\n\r\n" or b"\r\n\r\n".startswith(trailer)):
                yield _WarcRecord(offset, b"".join(lines) + block, warc_type, None)
                continue
            stream.unread(block + trailer)
            problem = (f"the file ends {len(block)} bytes into a block of {length} (Content-Length)"
                       if len(block) < length else f"no empty line after the {length} bytes of its Content-Length")
        yield _WarcRecord(offset, b"", warc_type, problem)
        if not _resynchronise(stream, end):
            return


def _warc_header(stream: _WarcStream, first: bytes) -> tuple[list[bytes], str, int, str | None]:
    """The header lines of one record, its WARC-Type and Content-Length, or why the header is damaged."""
    if not first.startswith(b"WARC/"):
        return [], "", 0, f"no WARC/ version line (the record starts {first[:40]!r})"
    lines, fields = [first], {}
    while len(lines) <= _WARC_HEADER_LINES:
        line = stream.readline()
        if not line:
            return lines, "", 0, "the file ends inside the record header"
        if line in (b"\r\n", b"\n"):
            lines.append(line)
            break
        if line.startswith(b"WARC/"):
            stream.unread(line)
            return lines, "", 0, "the record header has no end (a new record starts inside it)"
        name, colon, value = line.partition(b":")
        folded = line[:1] in (b" ", b"\t")  # the continuation of the line before
        if not line.endswith(b"\n") or not (folded or colon and name.strip()):
            return lines, "", 0, f"malformed header line {line[:60]!r}"
        if not folded:
            fields[name.strip().lower()] = value.strip()
        lines.append(line)
    else:
        return lines, "", 0, f"more than {_WARC_HEADER_LINES} header lines"
    warc_type = fields.get(b"warc-type", b"").decode("latin-1").lower()
    length = fields.get(b"content-length", b"")
    if not length.isdigit():
        return lines, warc_type, 0, f"no valid Content-Length ({length[:40]!r})"
    return lines, warc_type, int(length), None


def _resynchronise(stream: _WarcStream, end: int | None = None) -> bool:
    """Skip to the next line that starts a record (``WARC/1.``); False when the stream ends first, or
    (with ``end``) no such line starts before ``end``: the next record is then a later piece's."""
    while (end is None or stream.offset < end) and (line := stream.readline()):
        if line.startswith(b"WARC/1."):
            stream.unread(line)
            return True
    return False


def _read_warc(piece: Piece, options: ReadOptions,
               storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    """The records of a WARC piece: a later piece starts at the first ``WARC/1.`` line in it (the one
    a whole read reaches, unless a block holds such a line; docs/PIPELINE.md) and reads on through the
    record that crosses its end."""
    item = piece.file
    compression, read_whole = item.compression, piece.start  # read_whole: where the last record read whole ends
    with fsspec.open(item.url, "rb", **dict(storage_options or {})) as handle:
        try:
            decompressed, compression = _decompressed(item, handle)
            first = _first_line_start(piece, decompressed, compression)
            if first is None:
                return
            stream = _WarcStream(decompressed, first)
            end = None if compression is not None else piece.end
            if piece.start > 0 and not _resynchronise(stream, end):
                return
            for record in _warc_records(stream, _record_limit(options), end):
                read_whole = stream.offset
                position = f"record at {_warc_offset(record.offset, compression)}"
                if record.problem is not None:
                    if record.warc_type not in WARC_OTHER_TYPES:
                        kind = "over_size_cap" if record.oversized else "corrupt"
                        yield Reject(item.source, position, kind, f"{kind.replace('_', ' ')} WARC record "
                                     f"({record.problem})", len(record.data))
                    continue
                if record.warc_type in WARC_OTHER_TYPES:
                    continue
                try:
                    result = _warc_record(item, record, position, options)
                except Exception as exc:  # noqa: BLE001 - one record's failure rejects that record only
                    result = _failed(item, position, exc, len(record.data))
                yield result
        except Exception as exc:  # noqa: BLE001 - the stream itself: truncated, corrupt or unreadable
            after = _warc_offset(read_whole, compression)
            yield Reject(item.source, f"record after {after}", "corrupt",
                         f"truncated or corrupt {compression or 'file'} stream after {after}, where the last record "
                         f"read whole ends ({_describe(exc)}); the rest of the file is lost", 0)


def _warc_offset(offset: int, compression: str | None) -> str:
    return f"offset {offset}" if compression is None else f"offset {offset} (decompressed)"


def _warc_record(item: InputFile, framed: _WarcRecord, position: str, options: ReadOptions) -> Doc | Reject:
    """One response/resource record (digests checked): HTML through the crawler's extraction, plain
    text as is."""
    from warcio.archiveiterator import ArchiveIterator

    from crawlers.extract import decode_html, detect_language, extract_text

    if framed.warc_type not in WARC_DOCUMENT_TYPES:
        return Reject(item.source, position, "unsupported", f"unsupported WARC-Type {framed.warc_type[:40]!r}",
                      len(framed.data))
    record = next(ArchiveIterator(io.BytesIO(framed.data), check_digests=True))
    body = record.content_stream().read()
    while record.raw_stream.read(_WARC_CHUNK_BYTES):  # the digests are checked at the end of the block
        pass
    if record.digest_checker.passed is False:
        return Reject(item.source, position, "corrupt", f"corrupt WARC record ({'; '.join(record.digest_checker.problems)})",
                      len(framed.data))
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
        return Reject(item.source, position, "unsupported", f"unsupported content type {mime!r}", len(body))
    decoded = decode_html(body, charset)[0]
    is_html = "html" in mime or decoded.lstrip()[:15].lower().startswith(("<!doctype", "<html"))
    text = extract_text(decoded, url) if is_html else decoded
    if not _encodable(text):  # a declared charset like unicode_escape can decode to lone surrogates
        return Reject(item.source, position, "invalid_utf8", "invalid Unicode in the decoded text", len(body))
    language = record.rec_headers.get_header("WARC-Identified-Content-Language") or (
        detect_language(text) if text.strip() else None)
    doc = Doc(
        id=_optional_str(record.rec_headers.get_header("WARC-Record-ID")),
        text=text,
        source=url or item.source,
        domain=domain_of(url),
        language=language,
        fetch_time=_parse_time(record.rec_headers.get_header("WARC-Date")),
        position=position,
        url=url,
    )
    return _check(doc, len(body), options)
