"""Packing documents' tokens into ``[batch_size, seq_len]`` rows with segment ids (the packed-token
path of the loader, loaders/packed.py, feeds it documents in stream order)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

Packed = tuple[np.ndarray, np.ndarray, tuple[int, int], np.ndarray]


class Packer:
    """Packs documents (in stream order) into ``[batch, seq_len]`` rows, holding about one batch of tokens.

    Documents are kept as views of their block's token array (the eos is written separately), so a
    token is copied once, into the batch. The position after a batch is (documents of the stream
    fully emitted, tokens of the next one already emitted, eos included), counted from the stream's
    start, so a resume starts reading at that document and drops that many of its tokens.
    """

    def __init__(self, seq_len: int, batch_size: int, eos_id: int | None, pad_id: int, docs: int,
                 skip: int, alloc: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.eos_id = eos_id
        self.extra = 0 if eos_id is None else 1
        self.pad_id = pad_id
        self.skip = skip
        self.next_doc = docs  # stream index of the next document added
        self.pending: deque[list[Any]] = deque()  # [document index, tokens, tokens already emitted, block]
        self.buffered = 0
        self.alloc = alloc or self._new

    def _new(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        shape = (rows, self.seq_len)
        return np.empty(shape, dtype=np.int32), np.empty(shape, dtype=np.int32)

    def add(self, tokens: np.ndarray, block: int) -> None:
        total = len(tokens) + self.extra
        start, self.skip = min(self.skip, total), 0
        self.pending.append([self.next_doc, tokens, start, block])
        self.buffered += total - start
        self.next_doc += 1

    def full(self) -> bool:
        return self.buffered >= self.seq_len * self.batch_size

    def take(self, rows: int | None = None, pad_to: int | None = None) -> Packed:
        rows = rows or self.batch_size
        out_rows = pad_to or rows
        length = self.seq_len
        grid_2d, segments_2d = self.alloc(out_rows)
        grid, segments = grid_2d.reshape(-1), segments_2d.reshape(-1)
        need, at, blocks = rows * length, 0, []
        row_first_doc = -1  # index, within this batch, of the document a row starts with
        piece = 0
        while need and self.pending:
            entry = self.pending[0]
            _, tokens, start, block = entry
            total = len(tokens) + self.extra
            use = min(total - start, need)
            body = min(start + use, len(tokens)) - start
            if body > 0:
                grid[at:at + body] = tokens[start:start + body]
            if use > body:  # the eos falls in this piece
                grid[at + use - 1] = self.eos_id
            # segment ids: 1, 2, ... per row; a piece crossing a row boundary is segment 1 of the next row
            row = at // length
            while row * length < at + use:
                begin, end = max(at, row * length), min(at + use, (row + 1) * length)
                if begin == row * length:
                    row_first_doc = piece
                segments[begin:end] = piece - row_first_doc + 1
                row += 1
            blocks.append(block)
            piece += 1
            at += use
            need -= use
            if start + use == total:
                self.pending.popleft()
            else:
                entry[2] += use
        self.buffered -= at
        grid[at:] = self.pad_id  # only the tail: every position before it was just written
        segments[at:] = 0
        position = (self.pending[0][0], self.pending[0][2]) if self.pending else (self.next_doc, 0)
        return grid_2d, segments_2d, position, np.asarray(blocks, dtype=np.int64)

    def flush(self, pad_rows: bool) -> Iterator[Packed]:
        """What is left: full batches, then one partly filled (its last row padded with ``pad_id``)."""
        while self.full():
            yield self.take()
        if self.buffered:
            rows = math.ceil(self.buffered / self.seq_len)
            yield self.take(rows, pad_to=self.batch_size if pad_rows else rows)

    def padding(self) -> Packed:
        tokens, segments = self.alloc(self.batch_size)
        tokens.fill(self.pad_id)
        segments.fill(0)
        return tokens, segments, (self.next_doc, 0), np.zeros(0, np.int64)
