"""The split planner: sorted files cut into :class:`Split` s of :class:`Piece` s by a byte budget, and the
line numbering that lets a cut JSONL file's later pieces name lines as a whole read would."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import fsspec
import numpy as np

from gristmill.pipeline.format.storage import is_local
from gristmill.pipeline.job.inputs.faults import InputUnreadable, retrying
from gristmill.pipeline.job.inputs.records import InputFile, Piece, Split

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

    Read in exact ranges (no read-ahead past the piece); a transient storage fault is retried and a file
    that cannot be read raises ``InputUnreadable`` (a count of 0 would number the later pieces' lines
    wrong).
    """
    begin, stop = max(piece.start - 1, 0), (piece.file.size if piece.end is None else piece.end) - 1

    def count() -> int:
        newlines = 0
        fs, path = fsspec.core.url_to_fs(piece.file.url, **dict(storage_options or {}))
        with fs.open(path, "rb", size=piece.file.size, cache_type="none") as handle:
            handle.seek(begin)
            left = stop - begin
            while left > 0 and (chunk := handle.read(min(left, _COUNT_CHUNK_BYTES))):
                newlines += chunk.count(b"\n")
                left -= len(chunk)
        return newlines

    return retrying(piece.file.url, count)


def fetch_counted(piece: Piece, storage_options: Mapping[str, Any] | None = None) -> tuple[int, np.ndarray | None]:
    """:func:`count_newlines`, and on an object store the bytes it counted (from byte max(start - 1, 0) to
    the piece's end, in one ranged read) for the piece's read to parse (``Piece.prefetched``): a cut
    file is then downloaded once, not once to count and once to read (1.6-2x its size). On a local
    disk the read goes back to the file (None), as cheap as holding the bytes."""
    fs, path = fsspec.core.url_to_fs(piece.file.url, **dict(storage_options or {}))
    if is_local(fs):
        return count_newlines(piece, storage_options), None
    begin, end = max(piece.start - 1, 0), piece.end if piece.end is not None else piece.file.size
    data = retrying(piece.file.url, lambda: fs.cat_file(path, start=begin, end=end))
    if len(data) != end - begin:  # the file changed since the plan listed it: its lines cannot be numbered
        raise InputUnreadable(f"{piece.file.url}: read {len(data)} bytes of {begin}-{end}, the file is shorter "
                              "than when the job listed it")
    return data.count(b"\n", 0, max(len(data) - 1, 0)), np.frombuffer(data, np.uint8)


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
