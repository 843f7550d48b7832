"""Document batches built from a window's decoded blocks: Python lists, Arrow tables, or one flat UTF-8
buffer per text column (for moving batches between processes). The document path of the loader
(loaders/documents.py) picks rows; this module turns them into a batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from gristmill.loaders.prefetch import Window

_PYLIST_ROWS = 64


class Utf8Column:
    """A plain string column of a block (no nulls), in as many chunks as it was decoded in: for each
    row, the chunk's bytes (a view of Arrow's buffer) and the row's byte range in them."""

    __slots__ = ("data", "begin", "end")

    def __init__(self, chunks: list[pa.Array]) -> None:
        offsets, self.data = [], []
        for chunk in chunks:
            _, raw_offsets, raw_data = chunk.buffers()
            width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
            offsets.append(np.frombuffer(raw_offsets, dtype=width)[chunk.offset: chunk.offset + len(chunk) + 1])
            view = memoryview(raw_data).cast("B") if raw_data is not None else memoryview(b"")
            self.data.extend([view] * len(chunk))
        empty = [np.zeros(0, np.int64)]  # (a table of no chunks)
        self.begin = np.concatenate([o[:-1] for o in offsets] or empty, dtype=np.int64)
        self.end = np.concatenate([o[1:] for o in offsets] or empty, dtype=np.int64)


class DecodedBlock:
    """A decoded block, read by the consuming thread one batch at a time.

    String columns become Python strings straight from Arrow's buffers as each batch needs them, so a
    block costs its Arrow size only; other columns become Python lists once, on first use.
    """

    __slots__ = ("table", "lists", "buffers", "ranges")

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.lists: dict[str, list] = {}
        self.buffers: dict[str, Utf8Column | None] = {}
        self.ranges: dict[str, tuple[list[int], list[int]]] = {}

    def utf8(self, name: str) -> Utf8Column | None:
        """The rows' bytes of a string column without nulls, as views of Arrow's buffers; else None."""
        if name not in self.buffers:
            chunks = self.table.column(name).chunks  # not combined: that would copy the block
            plain = all((pa.types.is_string(c.type) or pa.types.is_large_string(c.type)) and not c.null_count
                        for c in chunks)
            self.buffers[name] = Utf8Column(chunks) if plain else None
        return self.buffers[name]

    def getter(self, name: str) -> Callable[[int], Any]:
        """A function from row number to the column's Python value."""
        views = self.utf8(name)
        if views is None:
            return self.column(name).__getitem__
        if name not in self.ranges:
            self.ranges[name] = (views.begin.tolist(), views.end.tolist())
        (begin, end), data = self.ranges[name], views.data
        return lambda row: str(data[row][begin[row]:end[row]], "utf-8")

    def column(self, name: str) -> list:
        values = self.lists.get(name)
        if values is None:
            # In slices: one to_pylist of a whole block holds the GIL for tens of milliseconds, and every
            # fetch thread that needs it meanwhile (to start a read or a decode) stalls that long.
            column, values = self.table.column(name), []
            for start in range(0, len(column), _PYLIST_ROWS):
                values.extend(column.slice(start, _PYLIST_ROWS).to_pylist())
            self.lists[name] = values
        return values


def python_batch(window: Window, blocks: np.ndarray, rows: np.ndarray, columns: list[str]) -> dict[str, list]:
    pairs = list(zip(blocks.tolist(), rows.tolist()))
    out = {}
    for name in columns:
        getters = {b: window.data[b].getter(name) for b in set(blocks.tolist())}
        out[name] = [getters[b](r) for b, r in pairs]
    return out


def utf8_batch(window: Window, blocks: np.ndarray, rows: np.ndarray, columns: list[str]) -> dict[str, Any]:
    """Text columns as one UTF-8 byte string plus int64 offsets each: cheap to pickle."""
    out: dict[str, Any] = {}
    for column in columns:
        buffer = gather_utf8(window, blocks, rows, column, np.empty)
        if buffer is None:
            out[column] = python_batch(window, blocks, rows, [column])[column]
            continue
        head = 8 * (len(rows) + 1)
        out[column] = {"offsets": buffer[:head].tobytes(), "utf8": buffer[head:].tobytes()}
    return out


def gather_utf8(window: Window, blocks: np.ndarray, rows: np.ndarray, name: str,
                 allocate: Callable[[int, Any], Any]) -> Any:
    """The rows' values of a string column in one flat uint8 buffer made by ``allocate(size, dtype)``:
    ``rows + 1`` int64 offsets, then the UTF-8 bytes. None when some block's column is not plain strings."""
    views = {b: window.data[b].utf8(name) for b in np.unique(blocks).tolist()}
    if any(v is None for v in views.values()):
        return None
    starts, ends = np.empty(len(rows), np.int64), np.empty(len(rows), np.int64)
    for block, view in views.items():
        where = blocks == block
        starts[where], ends[where] = view.begin[rows[where]], view.end[rows[where]]  # type: ignore[union-attr]
    bounds = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=bounds[1:])
    head = bounds.nbytes
    buffer = allocate(head + int(bounds[-1]), np.uint8)
    flat = np.asarray(buffer)
    flat[:head] = bounds.view(np.uint8)
    target = memoryview(flat[head:])
    for block, row, at, begin, stop in zip(blocks.tolist(), rows.tolist(), bounds.tolist(), starts.tolist(),
                                           ends.tolist()):
        target[at:at + stop - begin] = views[block].data[row][begin:stop]  # type: ignore[union-attr]
    return buffer


def arrow_batch(window: Window, blocks: np.ndarray, rows: np.ndarray) -> pa.Table:
    """Gather rows from several blocks: one take per block, then one reorder of the small result."""
    pieces, order = [], np.empty(len(blocks), dtype=np.int64)
    done = 0
    for block in np.unique(blocks):
        where = np.flatnonzero(blocks == block)
        pieces.append(window.data[int(block)].take(arrow_indices(rows[where])))
        order[where] = np.arange(done, done + len(where))
        done += len(where)
    return pa.concat_tables(pieces).combine_chunks().take(arrow_indices(order))


def arrow_indices(values: np.ndarray) -> pa.Array:
    """An int64 Arrow array over a NumPy array without ``pa.array``, whose first call imports pandas."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])
