"""WARC (plain, .gz, .zst): records framed and digest-checked by hand so damage costs one record, HTML
bodies through the crawler's extraction."""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, NamedTuple

from gristmill.pipeline.job.inputs.faults import raise_storage_fault
from gristmill.pipeline.job.inputs.records import (
    Doc,
    InputFile,
    Piece,
    ReadOptions,
    Reject,
    check,
    describe,
    domain_of,
    encodable,
    failed,
    optional_str,
    parse_time,
)
from gristmill.pipeline.job.inputs.streams import (
    decompressed,
    first_line_start,
    open_piece,
    record_limit,
)

WARC_DOCUMENT_TYPES = ("response", "resource", "conversion")
# The other record types of WARC 1.1: skipped, not counted. A type outside both lists (perhaps a
# damaged header) is an "unsupported" reject, so damage to the type never drops a record unseen.
WARC_OTHER_TYPES = ("warcinfo", "request", "metadata", "revisit", "continuation")



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


def read_warc(piece: Piece, options: ReadOptions,
               storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    """The records of a WARC piece: a later piece starts at the first ``WARC/1.`` line in it (the one
    a whole read reaches, unless a block holds such a line; docs/PIPELINE.md) and reads on through the
    record that crosses its end."""
    item = piece.file
    compression, read_whole = item.compression, piece.start  # read_whole: where the last record read whole ends
    with open_piece(piece, storage_options) as handle:
        try:
            plain, compression = decompressed(piece, handle)
            first = first_line_start(piece, plain, compression)
            if first is None:
                return
            stream = _WarcStream(plain, first)
            end = None if compression is not None else piece.end
            if piece.start > 0 and not _resynchronise(stream, end):
                return
            for record in _warc_records(stream, record_limit(options), end):
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
                    result = failed(item, position, exc, len(record.data))
                yield result
        except Exception as exc:  # noqa: BLE001 - the stream itself: truncated, corrupt or unreadable
            raise_storage_fault(exc)  # a throttle or a missing file is no damage
            after = _warc_offset(read_whole, compression)
            yield Reject(item.source, f"record after {after}", "corrupt",
                         f"truncated or corrupt {compression or 'file'} stream after {after}, where the last record "
                         f"read whole ends ({describe(exc)}); the rest of the file is lost", 0)


def _warc_offset(offset: int, compression: str | None) -> str:
    return f"offset {offset}" if compression is None else f"offset {offset} (decompressed)"


def _warc_record(item: InputFile, framed: _WarcRecord, position: str, options: ReadOptions) -> Doc | Reject:
    """One response/resource record (digests checked): HTML through the crawler's extraction, plain
    text as is."""
    from warcio.archiveiterator import ArchiveIterator

    from gristmill.crawlers.extract import decode_html, detect_language, extract_text

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
    if not encodable(text):  # a declared charset like unicode_escape can decode to lone surrogates
        return Reject(item.source, position, "invalid_utf8", "invalid Unicode in the decoded text", len(body))
    language = record.rec_headers.get_header("WARC-Identified-Content-Language") or (
        detect_language(text) if text.strip() else None)
    doc = Doc(
        id=optional_str(record.rec_headers.get_header("WARC-Record-ID")),
        text=text,
        source=url or item.source,
        domain=domain_of(url),
        language=language,
        fetch_time=parse_time(record.rec_headers.get_header("WARC-Date")),
        position=position,
        url=url,
    )
    return check(doc, len(body), options)
