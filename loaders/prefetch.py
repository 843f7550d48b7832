"""Background prefetch of a stream's blocks on threads, bounded in decoded bytes.

A scheduler thread walks the stream's windows in order and submits the blocks a window needs to a
thread pool, reserving each block's decoded size from the byte budget first. A pool task reads a *run*
of blocks (one block, or adjacent small row groups of one shard in one ranged read) and hands each to
a decode pool, which decodes and prepares it (tokens, or a wrapper that makes Python strings later).
Reads and decodes are limited apart: reads by the source's adaptive ``ReadGate`` (many in flight when
the store is far away), decodes by ``threads`` threads (about one per core), so a slow link does not
idle the cores nor a fast one crowd them.
The consumer receives whole windows in order and releases a window's blocks when it moves past it.
Blocks shared by consecutive windows are fetched once. Everything waits on condition variables or
futures: nothing polls.

Stored bytes are read ahead of the decoded-bytes reservation. A block's decoded size is about four
times its stored size, and the consumer holds a window while the next is decoded, so a budget counted
in decoded bytes alone leaves no room for reads beyond the next window: against a store 20 ms away the
reads came in bursts, one window at a time, and the decoders sat idle while each burst was in flight
(half of every epoch had no read in flight). A read-ahead thread walks the same windows as the
scheduler and reads the runs it has not reached yet, holding their stored bytes within a share of the
budget (``READ_AHEAD_SHARE``); the first task for such a block takes the bytes and decodes them at
once instead of reading. A block is read ahead only while no task holds it, so that first task is
still to come and every read ahead is taken.

The first window's blocks are fetched alone (slow start), so the first batch does not share the
cores with read-ahead. The budget is a hard limit with one exception that prevents deadlock: when a
single window needs more than the budget, that window alone is admitted (the consumer cannot make
progress without it). A block's reservation is the footer's figure when its shard's footer is in, else
an estimate (a footer read would cost the scheduler a round trip), corrected once the block is decoded.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.ma  # noqa: F401  (np.unique imports it on its first call: 12 ms on the way to the first batch)

from gristmill.loaders.blocks import BlockSource, Counters
from gristmill.loaders.plan import EpochOrder, StreamSpec

READ_AHEAD_SHARE = 0.2  # of the budget: stored bytes read ahead (the rest is decoded bytes reserved)


@dataclass
class _Entry:
    future: Future[Any]
    refs: int
    nbytes: int


@dataclass
class Window:
    """One shuffle window, ready to read: rows in order as (block, row) plus each block's prepared data."""

    index: int
    positions: np.ndarray
    blocks: np.ndarray
    rows: np.ndarray
    data: dict[int, Any] = field(default_factory=dict)


_END = object()


class Prefetcher:
    """Iterates the windows of one stream from a starting row, prefetching within ``budget_bytes``."""

    def __init__(self, source: BlockSource, order: EpochOrder, spec: StreamSpec, start_row: int,
                 prepare: Callable[[Any], tuple[Any, int]], *, budget_bytes: int, threads: int,
                 counters: Counters, expansion: float = 1.0, max_windows_ahead: int = 8) -> None:
        self.source = source
        self.order = order
        self.spec = spec
        self.start_row = start_row
        self.prepare = prepare
        self.ahead_budget = max(1, int(budget_bytes * READ_AHEAD_SHARE))
        self.budget = max(1, budget_bytes - self.ahead_budget)
        self.counters = counters
        self.expansion = expansion
        self.max_ahead = max_windows_ahead
        self._cv = threading.Condition()
        self._used = 0
        self._released = 0  # windows the consumer has finished, counted from the first one
        self._ready: deque[Any] = deque()
        self._stop = False
        self._live: dict[int, _Entry] = {}  # block id, or -1 - block id for a first window's head decode
        self._raw: dict[int, bytes] = {}  # a block's bytes fetched for a head decode, until its full decode
        self._footers_asked: set[int] = set()
        self._first_done = False
        self._scheduled = -1  # the window (counted from the first) the scheduler has reached
        self._ahead: dict[int, Future[bytes]] = {}  # block -> its stored bytes, read ahead of its task
        self._ahead_bytes = 0
        self._pins: Counter[int] = Counter()  # disk-cache pins this prefetcher holds, by block
        # one thread per read the gate may allow (the pool starts them only as needed); decodes run on
        # ``threads`` threads of their own, so the decoded blocks' memory is reused rather than faulted in
        # afresh (see ``_run``)
        self._pool = ThreadPoolExecutor(max_workers=source.gate.maximum, thread_name_prefix="gristmill-fetch")
        self._decoders = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="gristmill-decode")
        # reads ahead have a pool of their own: a task in the first pool may wait for one of them
        self._ahead_pool = ThreadPoolExecutor(max_workers=source.gate.maximum, thread_name_prefix="gristmill-ahead")
        self._thread = threading.Thread(target=self._schedule, name="gristmill-plan", daemon=True)
        self._thread.start()
        self._reader = threading.Thread(target=self._read_ahead, name="gristmill-read-ahead", daemon=True)
        self._reader.start()

    @property
    def used_bytes(self) -> int:
        """Decoded bytes currently held or reserved (a figure for tests and counters)."""
        with self._cv:
            return self._used

    def _run(self, items: list[tuple[int, int, int, Future[Any]]], head_rows: int | None) -> None:
        """Read a run of blocks (one ranged read), then hand each to the decoders.

        ``items`` are (key in _live, block, reserved bytes, future) of adjacent blocks. Decoding on the
        few decode threads rather than on the thread that read: the allocator keeps memory per thread, so
        decoding on whichever of dozens of read threads finished (against an object store) spread the
        decoded blocks over as many heaps, and the kernel zeroed fresh pages for most of them (a third
        of the epoch's CPU at 20 ms, measured with perf).
        """
        try:
            raw = {block: self._raw.pop(block) for _, block, _, _ in items if block in self._raw}
            with self._cv:
                ahead = {block: self._ahead.pop(block) for _, block, _, _ in items if block in self._ahead}
            for block, read in ahead.items():
                try:
                    raw[block] = read.result()  # a failed read raises here as it would have below
                finally:
                    self._drop_ahead(block)
            missing = [block for _, block, _, _ in items if block not in raw]
            if missing:
                self._pin(missing)
                raw.update(self.source.fetch_run(missing))
            for key, block, estimate, future in items:
                data = raw.pop(block)
                if head_rows is not None:
                    self._raw[block] = data  # the whole block's decode, for later windows, reuses this read
                self.source.footer(int(self.source.layout.shard[block]))  # (a read: not on a decode thread)
                task = self._decoders.submit(self._decode, key, block, estimate, future, data, head_rows)
                task.add_done_callback(lambda task, future=future: task.cancelled() and future.cancel())
        except BaseException as exc:
            for _, _, _, future in items:
                if not future.done():
                    future.set_exception(exc)

    def _decode(self, key: int, block: int, estimate: int, future: Future[Any], data: bytes,
                head_rows: int | None) -> None:
        """Decode and prepare one block into its future, correcting its reservation to the real size."""
        try:
            prepared, actual = self.prepare(self.source.decode(block, data, head_rows))
        except BaseException as exc:
            future.set_exception(exc)
            return
        with self._cv:
            entry = self._live.get(key)
            if entry is not None and entry.nbytes == estimate:
                self._used += actual - estimate
                entry.nbytes = actual
        future.set_result(prepared)

    def _submit(self, run: list[tuple[int, int, int]], head_rows: int | None) -> None:
        """Hand a run of reserved blocks to the pool; their futures fail if the pool drops the task."""
        items = [(key, block, estimate, Future()) for key, block, estimate in run]
        for key, _, estimate, future in items:
            self._live[key] = _Entry(future, 1, estimate)
        task = self._pool.submit(self._run, items, head_rows)
        task.add_done_callback(lambda task, items=items: task.cancelled() and [f.cancel() for *_, f in items])

    def _schedule(self) -> None:
        try:
            pending = None  # the previous window, published once this one holds its shared blocks
            windows = stream_windows(self.order, self.spec, self.start_row)
            for relative, (index, positions, blocks, rows) in enumerate(windows):
                needed = [(int(b), int(b)) for b in np.unique(blocks)]  # (key in _live, block)
                head_rows = None
                if relative == 0 and len(needed) == 1:
                    # The first window decodes only the pages holding its rows: a fast first batch.
                    head_rows = int(rows.max()) + 1
                    needed = [(-1 - needed[0][1], needed[0][1])]
                with self._cv:
                    if self._stop:
                        return
                    self._scheduled = relative
                    self._cv.notify_all()
                    fresh = []
                    for key, block in needed:
                        if key in self._live:
                            self._live[key].refs += 1
                        else:
                            fresh.append((key, block))
                if pending is not None and not self._publish(*pending):
                    return
                if head_rows is not None:
                    runs = [[pair] for pair in fresh]
                else:
                    runs = [[(block, block) for block in run] for run in self.source.runs([b for _, b in fresh])]
                for run in runs:
                    shard = int(self.source.layout.shard[run[0][1]])
                    if not self.source.has_footer(shard) and shard not in self._footers_asked:
                        # read beside the block, not after it: one round trip less for a shard's first block
                        self._footers_asked.add(shard)
                        self._pool.submit(self.source.footer, shard)  # (a failure is raised by the block's task)
                    reserved = []
                    for key, block in run:
                        share = 1.0 if head_rows is None else head_rows / max(1, int(self.source.layout.rows[block]))
                        reserved.append((key, block, int(self.source.estimate_nbytes(block) * self.expansion * share)))
                    need = sum(estimate for _, _, estimate in reserved)
                    with self._cv:
                        self._cv.wait_for(lambda rel=relative, n=need: self._stop or self._released >= rel
                                          or self._used + n <= self.budget)
                        if self._stop:
                            return
                        self._used += need
                        self._submit(reserved, head_rows)
                pending = (relative, (index, positions, blocks, rows, needed))
                if relative == 0:  # slow start: the first batch's blocks get the cores to themselves
                    with self._cv:
                        first_futures = [self._live[key].future for key, _ in needed]
                    wait(first_futures)
                    with self._cv:
                        self._first_done = True
                        self._cv.notify_all()
            if pending is not None and not self._publish(*pending):
                return
            with self._cv:
                self._ready.append(_END)
                self._cv.notify_all()
        except BaseException as exc:  # handed to the consumer, which raises it
            with self._cv:
                self._ready.append(exc)
                self._cv.notify_all()

    def _read_ahead(self) -> None:
        """Read the runs of windows the scheduler has not reached, within ``ahead_budget`` stored bytes.

        It walks the windows as the scheduler does (a block shared with the window before is not fresh)
        and starts once the first window is in, so the first batch has the link to itself. Runs the
        scheduler reaches first are left to it; a failure here only ends the read-ahead (the block's own
        task reads it again and reports the error with the shard's name).
        """
        with self._cv:
            self._cv.wait_for(lambda: self._stop or self._first_done)
        layout, previous = self.source.layout, set()
        try:
            for relative, (_, _, blocks, _) in enumerate(stream_windows(self.order, self.spec, self.start_row)):
                current = set(np.unique(blocks).tolist())
                fresh, previous = sorted(current - previous), current
                for run in self.source.runs(fresh) if relative else ():
                    need = int(layout.length[run].sum())
                    if need > self.ahead_budget:
                        continue
                    with self._cv:
                        self._cv.wait_for(lambda n=need, r=relative: self._stop or self._scheduled >= r
                                          or self._ahead_bytes + n <= self.ahead_budget)
                        if self._stop:
                            return
                        if self._scheduled >= relative or any(b in self._live or b in self._ahead for b in run):
                            continue  # the scheduler is here already: it reads these itself
                        reads = {block: Future() for block in run}
                        self._ahead.update(reads)
                        self._ahead_bytes += need
                    self._ahead_pool.submit(self._fetch_ahead, run, reads)
        except RuntimeError:  # the pool was shut down: the consumer stopped
            return

    def _fetch_ahead(self, run: list[int], reads: dict[int, Future[bytes]]) -> None:
        try:
            self._pin(run)
            data = self.source.fetch_run(run)
            self.counters.add(reads_ahead=1)
            for block in run:
                reads[block].set_result(data[block])
        except BaseException as exc:
            for read in reads.values():
                if not read.done():
                    read.set_exception(exc)

    def _drop_ahead(self, block: int) -> None:
        """A read-ahead block's stored bytes are no longer held: return them to the read-ahead share."""
        with self._cv:
            self._ahead_bytes -= int(self.source.layout.length[block])
            self._cv.notify_all()

    def _publish(self, relative: int, item: tuple[Any, ...]) -> bool:
        """Hand a window to the consumer, staying at most ``max_ahead`` windows ahead; False once stopped."""
        with self._cv:
            self._cv.wait_for(lambda: self._stop or relative - self._released < self.max_ahead)
            if self._stop:
                return False
            self._ready.append(item)
            self._cv.notify_all()
            return True

    def __iter__(self) -> Iterator[Window]:
        try:
            while True:
                began = time.perf_counter()
                with self._cv:
                    self._cv.wait_for(lambda: bool(self._ready))
                    item = self._ready.popleft()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                index, positions, blocks, rows, needed = item
                with self._cv:
                    entries = {key: (block, self._live[key]) for key, block in needed}
                window = Window(index, positions, blocks, rows,
                                {block: entry.future.result() for block, entry in entries.values()})
                self.counters.add(wait_seconds=time.perf_counter() - began)
                yield window
                window.data.clear()  # the consumer may still hold the Window: let go of its blocks now
                self._release(entries)
                del window, entries  # (their futures hold the blocks too) before waiting for the next
        finally:
            self.close()

    def _release(self, entries: dict[int, tuple[int, _Entry]]) -> None:
        with self._cv:
            for key, (block, entry) in entries.items():
                entry.refs -= 1
                if entry.refs == 0:
                    self._used -= entry.nbytes
                    if self._live.get(key) is entry:
                        del self._live[key]
                    if key >= 0:
                        self._unpin(block)
            self._released += 1
            self._cv.notify_all()

    def _pin(self, blocks: list[int]) -> None:
        """Keep blocks about to be read from eviction from the node's disk cache until released; what is
        pinned is counted here, so that :meth:`close` lets go of what no window released."""
        if self.source.cache is None:
            return
        with self._cv:  # (not after close: a pin taken then would never be let go)
            for block in [] if self._stop else blocks:
                self.source.cache.pin(self.source.cache_key(block))
                self._pins[block] += 1

    def _unpin(self, block: int) -> None:
        with self._cv:
            if self._pins[block] > 0:
                self._pins[block] -= 1
                self.source.cache.unpin(self.source.cache_key(block))  # type: ignore[union-attr]

    def close(self) -> None:
        """Stop the scheduler and the fetch threads (also when the consumer stops early), and let go of
        the disk-cache pins of blocks no window released (read ahead, or held when the consumer stopped)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
            for block, count in self._pins.items():
                for _ in range(count):
                    self.source.cache.unpin(self.source.cache_key(block))  # type: ignore[union-attr]
            self._pins.clear()
        for pool in (self._pool, self._decoders, self._ahead_pool):
            pool.shutdown(wait=False, cancel_futures=True)


def stream_windows(order: EpochOrder, spec: StreamSpec,
                   start_row: int) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """(index, positions, blocks, rows) of each window of a stream from ``start_row`` on; the first
    window starts part-way through when ``start_row`` falls inside it (a resume)."""
    first = spec.window_of(start_row) if len(spec.positions) else 0
    for index in range(first, len(spec.bounds) - 1):
        positions = spec.window(index)
        if index == first:
            positions = positions[start_row - int(spec.bounds[index]):]
        blocks, rows = order.locate(positions)
        yield index, positions, blocks, rows


def read_inline(source: BlockSource, order: EpochOrder, spec: StreamSpec, start_row: int,
                prepare: Callable[[Any], tuple[Any, int]]) -> Iterator[Window]:
    """The windows of one stream read in the calling thread, with no read-ahead and no thread left running.

    For a process about to fork (a thread running at the fork could leave a lock held in the child).
    The first window decodes only the pages holding its rows, as the prefetcher's does.
    """
    for relative, (index, positions, blocks, rows) in enumerate(stream_windows(order, spec, start_row)):
        window = Window(index, positions, blocks, rows)
        for block in np.unique(blocks).tolist():
            head = int(rows[blocks == block].max()) + 1 if relative == 0 else None
            window.data[block] = prepare(source.decode(block, _fetch_beside_footer(source, block), head))[0]
        yield window
        window.data.clear()  # before the next window's blocks are decoded, so their memory is reused


def _fetch_beside_footer(source: BlockSource, block: int) -> bytes:
    """A block's bytes, with its shard's footer read at the same time if not yet in: one round trip to the
    first batch, not two (0.1 s at 100 ms). The footer's thread has ended when this returns."""
    shard = int(source.layout.shard[block])
    if source.has_footer(shard):
        return source.fetch(block)
    with ThreadPoolExecutor(1, thread_name_prefix="gristmill-footer") as pool:
        footer = pool.submit(source.footer, shard)
        data = source.fetch(block)
        footer.result()
    return data
