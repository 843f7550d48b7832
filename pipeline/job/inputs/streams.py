"""Byte streams the line- and record-based readers share: decompression that raises where a stream ends
early, lines bounded in size, and the first line that starts in a piece."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import fsspec

from gristmill.pipeline.job.inputs.records import Piece, ReadOptions

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


# A cut piece is fetched in ranged reads of about a sixteenth of it, within these bounds: the read past
# its end (to finish the last record) then stays near 1/16 of it, and a 64 MiB piece takes 16 requests.
# (s3fs's default, 50 MiB blocks from the piece start, downloaded 6.5x the input on cut files.)
PIECE_BLOCK_MIN = 64 * 1024
PIECE_BLOCK_MAX = 8 * 1024 * 1024
TAIL_BYTES = 16 * 1024  # the first read past a cut piece's end (doubled for each further one)


def piece_block_bytes(piece: Piece) -> int:
    """The bytes a stream over ``piece`` buffers: for a piece of a cut file, the size of each ranged read."""
    if piece.whole:  # read ahead in the client's blocks: nothing is read past what is needed
        return _STREAM_BUFFER_BYTES
    return min(max(piece.bytes // 16, PIECE_BLOCK_MIN), PIECE_BLOCK_MAX)


def open_piece(piece: Piece, storage_options: Mapping[str, Any] | None) -> BinaryIO:
    """The piece's file, open for reading at the size the plan found. A piece of a cut file reads exact
    ranges (no read-ahead cache: a seek to byte 0 and back fetched a block from there), which
    :func:`decompressed` buffers by :func:`piece_block_bytes` and stops at the piece's end, so it
    downloads about its own bytes; a piece whose bytes came with its newline count reads those."""
    fs, path = fsspec.core.url_to_fs(piece.file.url, **dict(storage_options or {}))
    if piece.whole:
        return fs.open(path, "rb", size=piece.file.size)

    def ranged() -> BinaryIO:
        return fs.open(path, "rb", size=piece.file.size, block_size=piece_block_bytes(piece), cache_type="none")

    if piece.prefetched is not None:
        return _Prefetched(memoryview(piece.prefetched), max(piece.start - 1, 0), ranged)  # type: ignore[return-value]
    return ranged()


class _Prefetched(io.RawIOBase):
    """A cut piece's file served from its prefetched bytes (``data``, from byte ``begin``), and past them
    from the store as :class:`_PieceRange` reads it: the record that crosses the piece's end."""

    def __init__(self, data: memoryview, begin: int, open_file: Any) -> None:
        self._data, self._begin, self._position = data, begin, begin
        self._open_file = open_file
        self._file: Any = None  # opened at the first read past the data

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise io.UnsupportedOperation("a piece seeks from its start or its position")
        self._position = offset + (self._position if whence == io.SEEK_CUR else 0)
        return self._position

    def tell(self) -> int:
        return self._position

    def readinto(self, buffer: Any) -> int:
        offset = self._position - self._begin
        if offset < 0:  # a piece's reader starts at byte start - 1 (0 for the first), where the data does
            raise ValueError(f"read at byte {self._position}, before the piece's prefetched bytes ({self._begin} on)")
        if offset < len(self._data):
            size = min(len(buffer), len(self._data) - offset)
            buffer[:size] = self._data[offset:offset + size]
        else:
            if self._file is None:
                self._file = self._open_file()
                self._rest = _PieceRange(self._file, self._begin + len(self._data))
            self._rest.seek(self._position)
            size = self._rest.readinto(buffer)
        self._position += size
        return size

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        super().close()


class _PieceRange(io.RawIOBase):
    """A cut piece's file read in ranges that stop at the piece's end, then, for the record that crosses
    it, in ranges doubling from TAIL_BYTES: a full block past the end cost up to 1/16 more bytes."""

    def __init__(self, source: Any, end: int) -> None:
        self._source, self._end, self._tail = source, end, TAIL_BYTES

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._source.seek(offset, whence)

    def tell(self) -> int:
        return self._source.tell()

    def readinto(self, buffer: Any) -> int:
        position, size = self._source.tell(), len(buffer)
        if position < self._end:
            size = min(size, self._end - position)
        else:
            size, self._tail = min(size, self._tail), self._tail * 2
        data = self._source.read(size)
        buffer[:len(data)] = data
        return len(data)


def decompressed(piece: Piece, raw: BinaryIO) -> tuple[BinaryIO, str | None]:
    """The file's bytes, decompressed, and the compression used; a stream that ends early or breaks off
    raises while it is read. For WARC the first bytes can add what the name does not say (a gzipped
    .warc, as warcio read it); a JSONL file is taken as named, since a hostile first line may begin
    with a compressor's magic bytes and must cost only itself."""
    item, compression = piece.file, piece.file.compression
    head = b""
    if compression or item.kind == "warc":  # (a request on object storage: only where it can matter)
        head = raw.read(4)
        raw.seek(0)
    if item.kind == "warc" and compression is None:
        compression = "gzip" if head.startswith(b"\x1f\x8b") else "zstd" if head == b"\x28\xb5\x2f\xfd" else None
    if compression and not head:  # gzip reads an empty file as empty content; no compressor writes one
        raise EOFError(f"empty file: no {compression} header")
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw), compression
    if compression == "zstd":
        return io.BufferedReader(_ZstdFrames(raw), _STREAM_BUFFER_BYTES), compression
    if isinstance(raw, _Prefetched):
        return io.BufferedReader(raw, piece_block_bytes(piece)), None
    if isinstance(raw, fsspec.spec.AbstractBufferedFile):  # an object store's file: its readline takes no size
        return io.BufferedReader(raw if piece.end is None else _PieceRange(raw, piece.end),
                                 piece_block_bytes(piece)), None
    return raw, None




# A raw record (a JSONL line, a WARC block) may be up to this many times --max-doc-bytes (JSON escapes
# such as \u00e9 take 6 bytes for 2; HTML carries markup) before it is refused unread: a giant record
# never reaches a worker's memory whole.
RAW_RECORD_EXPANSION = 8
_LINE_CHUNK = 1 << 20


def record_limit(options: ReadOptions) -> int:
    return max(options.max_doc_bytes * RAW_RECORD_EXPANSION, _LINE_CHUNK)


def bounded_lines(stream: Any, limit: int, stop: int | None = None) -> Iterator[tuple[bytes | None, int]]:
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


def first_line_start(piece: Piece, stream: Any, compression: str | None) -> int | None:
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
