"""Epoch planning from the manifest alone: block order, rank/worker spans, shuffle windows, resume points.

Everything here is a pure function of a few numbers (seed, epoch, world size, workers, batch size,
positions consumed), so every rank and every DataLoader worker computes the same plan without talking
to the others, and a checkpoint only has to store those numbers.

Vocabulary: a *block* is one Parquet row group. An epoch orders the blocks (a seeded permutation when
shuffling) and numbers the rows of the blocks in that order ``0..N-1``: the *epoch positions*. A
*sequence* is an ordered list of epoch positions, stored as ranges plus small arrays so that a corpus of
a billion rows costs a few bytes to describe. Each (rank, worker) pair reads one contiguous slice of the
epoch's sequence: its *stream*. A stream is cut into *windows* (a bounded number of rows); each window
is permuted as a whole, which is the in-memory shuffle buffer. The first windows of a stream ramp up
(one batch, two, four, ...) so the first batch needs one block, not a whole buffer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.random  # noqa: F401  (numpy loads it on first use: 7 ms on the way to the first batch)

Piece = range | np.ndarray


class Positions:
    """An ordered sequence of epoch positions held as ranges and small int64 arrays."""

    def __init__(self, pieces: Iterable[Piece] = ()) -> None:
        self.pieces: list[Piece] = [p for p in pieces if len(p)]
        self._ends = np.cumsum([len(p) for p in self.pieces], dtype=np.int64)

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def slice(self, start: int, stop: int) -> Positions:
        """Positions ``[start, stop)`` of this sequence, still as ranges where they were ranges."""
        start, stop = max(start, 0), min(stop, len(self))
        out: list[Piece] = []
        if start >= stop:
            return Positions()
        first = int(np.searchsorted(self._ends, start, side="right"))
        for index in range(first, len(self.pieces)):
            begin = int(self._ends[index - 1]) if index else 0
            if begin >= stop:
                break
            piece = self.pieces[index]
            out.append(piece[max(start - begin, 0): stop - begin])
        return Positions(out)

    def array(self) -> np.ndarray:
        """Materialise as one int64 array (only ever done for one window at a time)."""
        if not self.pieces:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(p.start, p.stop, p.step, dtype=np.int64) if isinstance(p, range)
                               else np.asarray(p, dtype=np.int64) for p in self.pieces])

    @staticmethod
    def concat(parts: Iterable[Positions]) -> Positions:
        return Positions([piece for part in parts for piece in part.pieces])


@dataclass(frozen=True)
class EpochOrder:
    """The epoch's block order and where each block's rows start in the epoch positions."""

    order: np.ndarray  # block ids in reading order
    starts: np.ndarray  # epoch position of the first row of order[i]; one extra entry: the total

    @classmethod
    def build(cls, block_rows: np.ndarray, seed: int, epoch: int, shuffle: bool) -> EpochOrder:
        count = len(block_rows)
        order = (np.random.default_rng([seed, epoch, 0xB10C]).permutation(count) if shuffle
                 else np.arange(count))
        starts = np.zeros(count + 1, dtype=np.int64)
        np.take(block_rows, order, out=starts[1:])  # in place: no third array of a million blocks
        np.cumsum(starts[1:], out=starts[1:])
        return cls(order=order, starts=starts)

    @property
    def total(self) -> int:
        return int(self.starts[-1])

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Map epoch positions to (block id, row within block)."""
        slot = np.searchsorted(self.starts, positions, side="right") - 1
        return self.order[slot], positions - self.starts[slot]


@dataclass(frozen=True)
class Split:
    """How one generation divides its positions: per-rank count and per-worker spans inside a rank."""

    per_rank: int
    worker_sizes: tuple[int, ...]  # rows of each worker's stream, in worker order
    worker_batches: tuple[int, ...]  # batches each worker yields (document mode)

    def worker_start(self, worker: int) -> int:
        return sum(self.worker_sizes[:worker])


def split_rows(total: int, world_size: int, workers: int, batch_size: int, drop_last: bool,
               by_batches: bool) -> tuple[Split, int]:
    """Divide ``total`` rows so every rank gets the same count; returns the split and rows used.

    Document mode (``by_batches``): ranks get equal row counts, so equal batch counts. ``drop_last``
    drops the remainder that does not fill a batch on every rank; otherwise the sequence is padded by
    repeating its first ``< world_size`` rows (as torch's DistributedSampler does). Rank ``r``'s batch
    ``i`` comes from worker ``i % workers`` (DataLoader's round-robin), so each worker's span is sized
    to exactly its batches. Token mode splits rows evenly; the packer equalises batch counts instead.
    """
    if by_batches:
        if drop_last:
            per_rank = (total // (world_size * batch_size)) * batch_size
        else:
            per_rank = math.ceil(total / world_size) if total else 0
        batches = math.ceil(per_rank / batch_size)
        worker_batches = tuple(len(range(w, batches, workers)) for w in range(workers))
        short = batches * batch_size - per_rank  # the rank's last batch lacks these rows
        sizes = tuple(count * batch_size - (short if batches and (batches - 1) % workers == w else 0)
                      for w, count in enumerate(worker_batches))
        return Split(per_rank, sizes, worker_batches), per_rank * world_size
    per_rank = math.ceil(total / world_size) if total else 0
    base, extra = divmod(per_rank, workers)
    sizes = tuple(base + (1 if w < extra else 0) for w in range(workers))
    return Split(per_rank, sizes, (0,) * workers), per_rank * world_size


def fit(sequence: Positions, used: int) -> Positions:
    """Truncate, or pad by repeating from the start, to exactly ``used`` positions."""
    have = len(sequence)
    if used <= have:
        return sequence.slice(0, used)
    parts = [sequence]
    while have < used:
        take = min(used - have, len(sequence))
        parts.append(sequence.slice(0, take))
        have += take
    return Positions.concat(parts)


def window_starts(length: int, first: int, window: int) -> np.ndarray:
    """Window boundaries of a stream: sizes first, 2*first, 4*first, ... capped at ``window``.

    The ramp keeps time to the first batch to one block's fetch while later windows reach the full
    shuffle buffer. Returns ``[0, ..., length]``.
    """
    bounds = [0]
    size = max(1, min(first, window))
    while bounds[-1] < length and size < window:
        bounds.append(min(bounds[-1] + size, length))
        size *= 2
    if bounds[-1] < length:
        full = np.arange(bounds[-1] + window, length, window, dtype=np.int64)
        return np.concatenate([np.asarray(bounds, dtype=np.int64), full, [length]])
    return np.asarray(bounds, dtype=np.int64)


@dataclass(frozen=True)
class StreamSpec:
    """One (rank, worker) stream of one generation: its positions and how they are windowed."""

    positions: Positions
    bounds: np.ndarray
    key: tuple[int, ...]  # seeds this stream's window permutations
    shuffle: bool

    def window(self, index: int) -> np.ndarray:
        """The epoch positions of window ``index`` in the order they are read."""
        part = self.positions.slice(int(self.bounds[index]), int(self.bounds[index + 1])).array()
        if self.shuffle:
            part = part[np.random.default_rng([*self.key, index]).permutation(len(part))]
        return part

    def window_of(self, offset: int) -> int:
        return int(np.searchsorted(self.bounds, offset, side="right") - 1)

    def remaining(self, consumed: int) -> Positions:
        """What is left after the first ``consumed`` rows were read, in a form the next generation re-splits."""
        if consumed >= len(self.positions):
            return Positions()
        index = self.window_of(consumed)
        begin = int(self.bounds[index])
        if consumed == begin:
            return self.positions.slice(begin, len(self.positions))
        leftover = self.window(index)[consumed - begin:]
        return Positions([leftover, *self.positions.slice(int(self.bounds[index + 1]), len(self.positions)).pieces])


@dataclass(frozen=True)
class Generation:
    """One stretch of an epoch read under fixed settings; a new one starts at each elastic resume."""

    world_size: int
    workers: int
    batch_size: int
    window: int
    consumed: tuple[int, ...] = ()  # rows each stream (rank-major, worker-minor) read before the next one


def streams_of(base: Positions, generation: Generation, index: int, *, seed: int, epoch: int, shuffle: bool,
               drop_last: bool, by_batches: bool) -> tuple[list[StreamSpec], Split]:
    """Every stream of one generation, in rank-major, worker-minor order."""
    split, used = split_rows(len(base), generation.world_size, generation.workers, generation.batch_size,
                             drop_last, by_batches)
    sequence = fit(base, used)
    first = generation.batch_size
    specs = []
    for rank in range(generation.world_size):
        offset = rank * split.per_rank
        for worker in range(generation.workers):
            start = offset + split.worker_start(worker)
            positions = sequence.slice(start, start + split.worker_sizes[worker])
            specs.append(StreamSpec(
                positions=positions,
                bounds=window_starts(len(positions), first, generation.window),
                key=(seed, epoch, index, rank, worker),
                shuffle=shuffle,
            ))
    return specs, split


def plan_generation(total: int, history: Sequence[Generation], current: Generation, *, seed: int, epoch: int,
                    shuffle: bool, drop_last: bool, by_batches: bool) -> tuple[list[StreamSpec], Split]:
    """Streams of the current generation, after replaying (as arithmetic, not I/O) the earlier ones."""
    base = Positions([range(total)])
    for index, generation in enumerate(history):
        specs, _ = streams_of(base, generation, index, seed=seed, epoch=epoch, shuffle=shuffle,
                              drop_last=drop_last, by_batches=by_batches)
        if len(generation.consumed) != len(specs):
            raise ValueError(f"resume state has {len(generation.consumed)} stream positions for a generation "
                             f"of {len(specs)} streams")
        for stream, (spec, done) in enumerate(zip(specs, generation.consumed)):
            if done > len(spec.positions):
                raise ValueError(f"state field 'history[{index}].consumed[{stream}]' is {done}, more than the "
                                 f"{len(spec.positions)} rows of that stream")
        base = Positions.concat(spec.remaining(done) for spec, done in zip(specs, generation.consumed))
    return streams_of(base, current, len(history), seed=seed, epoch=epoch, shuffle=shuffle,
                      drop_last=drop_last, by_batches=by_batches)


def consumed_by_batches(split: Split, workers: int, batch_size: int, batches: int) -> list[int]:
    """Rows each worker of a rank has read once the rank has yielded ``batches`` batches (round-robin)."""
    out = []
    for worker in range(workers):
        taken = len(range(worker, batches, workers))
        out.append(min(taken * batch_size, split.worker_sizes[worker]))
    return out
