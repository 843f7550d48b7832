"""How many ranged reads a process keeps in flight: as many as the link rewards, found by measuring.

A link that takes ``L`` seconds to the first byte and carries ``B`` bytes/s per connection needs about
``throughput x read time / read size`` reads in flight to reach a given throughput (Little's law: the
bandwidth-delay product counted in reads). Neither ``L``, ``B`` nor the link's total is known in advance,
and all of them move, so the limit is found by measuring rather than by formula:

- reads are counted in *rounds* of ``limit`` completed reads; a round's throughput is its bytes over its
  wall time;
- when a round was limited by the gate (some read had to wait for a slot) and its throughput beat the
  best round's by 10 %, the limit grows (more reads in flight paid off: grow while it pays): it doubles
  until the first round that does not pay (slow start, so a 100 ms link is filled within a few rounds
  rather than most of a short epoch), and grows by half after that;
- the best throughput fades by 5 % a round, so a link that got faster (or a slow patch that lifted the
  best too high) is probed upward again rather than never;
- a throttling answer (503 SlowDown) halves the limit at once and forgets the best throughput, so
  growth starts over from there, by halves (multiplicative decrease, as TCP and the S3 SDKs do);
- a round that was not limited by the gate (the byte-bounded prefetch budget or the consumer was)
  changes nothing: more slots would not have been used.

So against local disk the limit stays near its start, while against 100 ms to first byte it climbs
until the link's capacity, the budget, the CPU or ``maximum`` stops the throughput from rising.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gristmill.loaders.blocks import Counters

START_READS = 4  # the fixed number of fetch threads before reads followed the link
# Against an object store: 16 reads of 4 MiB are what a link 100 ms away at 40 MB/s per connection needs
# for the ~200 MB/s two cores decode, and 64 MiB in flight fits the prefetch budget. Starting at 4, the
# doubling rounds took a third of a 3 s epoch at 100 ms (measured: 12 % more throughput starting at 16).
REMOTE_START_READS = 16
SLOW_START_GROWTH = 2.0  # until the first round whose extra reads did not pay
GROWTH = 1.5
GAIN = 1.10  # a round must beat the best so far by this factor for the limit to grow
FADE = 0.95  # the best throughput's weight after each round: old measurements count less and less


def room_for_reads(url: str, storage_options: Mapping[str, Any], max_reads: int) -> dict[str, Any]:
    """``storage_options`` with room for ``max_reads`` connections where the client would allow fewer.

    s3fs's botocore client keeps at most 10 connections unless told (``max_pool_connections``), so the
    reads the gate let through beyond 10 waited inside the client: the store never saw more than 10 at
    once. A value the caller set is kept.
    """
    options = dict(storage_options)
    config = options.get("config_kwargs") or {}
    if url.split("://", 1)[0] in ("s3", "s3a") and isinstance(config, Mapping):
        options["config_kwargs"] = {"max_pool_connections": max_reads, **config}
    return options


class ReadGate:
    """Admits ranged reads up to an adaptive limit and keeps the in-flight counters."""

    def __init__(self, counters: Counters, *, start: int = START_READS, maximum: int = 64) -> None:
        self.counters = counters
        self.maximum = max(1, maximum)
        self.limit = min(start, self.maximum)
        self._cv = threading.Condition()
        self._in_flight = 0
        self._busy_since = 0.0
        self._best = 0.0
        self._slow_start = True
        self._new_round(time.perf_counter())
        counters.set(in_flight_limit=self.limit)

    def _new_round(self, now: float) -> None:
        self._round_began, self._round_bytes, self._round_reads, self._round_waited = now, 0, 0, False

    @contextmanager
    def slot(self, extra: int = 0) -> Iterator[int]:
        """Hold one of the ``limit`` read slots for the duration of a read; yields how many are held.

        ``extra`` more are taken too, as far as free, when the link is idle (at most one other read in
        flight, as on the way to a first batch): a read split into parts then arrives that many times
        sooner over a link capped per connection, without adding requests when reads are already many.
        """
        with self._cv:
            if self._in_flight >= self.limit:
                self._round_waited = True
                self._cv.wait_for(lambda: self._in_flight < self.limit)
            held = 1 + (min(extra, self.limit - self._in_flight - 1) if self._in_flight <= 1 else 0)
            self._in_flight += held
            if self._in_flight == held:
                self._busy_since = time.perf_counter()
            self.counters.peak(max_in_flight=self._in_flight)
        try:
            yield held
        finally:
            with self._cv:
                self._in_flight -= held
                if self._in_flight == 0:
                    self.counters.add(read_seconds=time.perf_counter() - self._busy_since)
                self._cv.notify_all()

    def finished(self, nbytes: int) -> None:
        """A read of ``nbytes`` completed; at the end of a round, decide whether to grow."""
        with self._cv:
            self._round_bytes += nbytes
            self._round_reads += 1
            if self._round_reads < self.limit:
                return
            now = time.perf_counter()
            rate = self._round_bytes / max(now - self._round_began, 1e-9)
            if self._round_waited and rate > self._best * GAIN:
                growth = SLOW_START_GROWTH if self._slow_start else GROWTH
                self.limit = min(self.maximum, max(self.limit + 1, math.ceil(self.limit * growth)))
                self._cv.notify_all()
            elif self._round_waited:
                self._slow_start = False
            self._best = max(self._best * FADE, rate)
            self._new_round(now)
            self.counters.set(in_flight_limit=self.limit)

    def throttled(self) -> None:
        """The store asked us to slow down: halve the limit and measure afresh."""
        with self._cv:
            self.limit = max(1, self.limit // 2)
            self._best = 0.0
            self._slow_start = False
            self._new_round(time.perf_counter())
            self.counters.set(in_flight_limit=self.limit)
