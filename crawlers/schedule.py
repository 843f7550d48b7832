"""The per-host scheduler: which host may take a request now, and when each may be asked again.

Why an object of its own: politeness is a property of the host (how many requests open, how long
since the last one, Crawl-delay, Retry-After, backing off after errors, parking a hopeless host), so
it is decided here and nowhere else, against an injectable clock, and tested with a fake one. Hosts
wait in a heap keyed by the time they may be asked again; a host holds at most ``HOST_WINDOW`` queued
URLs in memory, the rest wait on disk in the frontier.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .frontier import Frontier, Request
from .robots import Robots

ROBOTS = object()  # the dispatch token for "fetch this host's robots.txt first"
HOST_WINDOW = 32  # queued URLs per host held in memory; the rest wait on disk in the frontier
KEEP_WINDOW_S = 5.0  # a host that may not be asked for longer than this gives its window back to disk


@dataclass(slots=True)
class Host:
    """One origin's politeness state and its in-memory window of queued URLs."""

    id: int
    origin: str
    name: str
    delay: float
    queue: deque[Request] = field(default_factory=deque)
    retries: list[tuple[float, int, Request]] = field(default_factory=list)
    cursor: int = 0
    exhausted: bool = False
    inflight: int = 0
    next_at: float = 0.0
    crawl_delay: float = 0.0
    robots: Robots | None = None
    robots_pending: bool = False
    robots_failures: int = 0
    consecutive_failures: int = 0
    failures: int = 0
    requests: int = 0
    parked: str | None = None
    park_outcome: str | None = None
    version: int = 0
    due: float | None = None


class HostScheduler:
    """Hosts in a heap by the time they may be asked next; ``config`` is a :class:`CrawlConfig`.

    ``clock`` gives seconds (``time.monotonic`` in a crawl, a fake in tests); ``on_scheduled`` is
    called whenever a host enters the heap, so a sleeping dispatcher wakes up.
    """

    def __init__(self, config: Any, frontier: Frontier, clock: Callable[[], float] = time.monotonic,
                 on_scheduled: Callable[[], None] = lambda: None) -> None:
        self.config = config
        self.frontier = frontier
        self.clock = clock
        self.on_scheduled = on_scheduled
        self.hosts: dict[int, Host] = {}
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = itertools.count()

    # -- hosts and their queues ----------------------------------------------------------------------
    def host(self, host_id: int) -> Host:
        host = self.hosts.get(host_id)
        if host is None:
            origin = self.frontier.origin(host_id)
            host = Host(host_id, origin, urlsplit(origin).hostname or "", self.config.min_delay)
            host.parked = self.frontier.parked(host_id)
            self.hosts[host_id] = host
        return host

    def admitted(self, request: Request) -> None:
        """A new URL of a host: into its window if the window had run dry, then the host is scheduled."""
        host = self.host(request.host)
        if host.exhausted and len(host.queue) < HOST_WINDOW:
            host.queue.append(request)
            host.cursor = request.rowid
        else:
            host.exhausted = False
        self.schedule(host)

    def _release(self, host: Host) -> None:
        """Drop a waiting host's window (it reloads from the frontier when due): memory goes to the hosts
        being crawled now. Retries stay: their rows sit below the window's first, which the cursor keeps."""
        host.cursor = host.queue[0].rowid - 1
        host.queue.clear()
        host.exhausted = False

    def _refill(self, host: Host) -> None:
        if host.queue or host.exhausted:
            return
        batch = self.frontier.load(host.id, host.cursor, HOST_WINDOW)
        host.queue.extend(batch)
        if batch:
            host.cursor = batch[-1].rowid
        host.exhausted = len(batch) < HOST_WINDOW

    # -- the heap ------------------------------------------------------------------------------------
    def schedule(self, host: Host, at: float | None = None) -> None:
        """(Re)enter a host in the heap at the earliest time it may be asked for a request."""
        if host.parked:
            return
        if not host.queue and not host.retries and host.exhausted:
            return  # hosts with nothing queued come back through admitted() or when a request finishes
        when = host.next_at if at is None else max(at, host.next_at)
        if not host.queue and host.exhausted:
            when = max(when, host.retries[0][0])
        if host.queue and when - self.clock() > KEEP_WINDOW_S:
            self._release(host)
        if host.due is not None and host.due <= when:
            return  # an earlier entry is live; the host is re-examined when it fires
        host.version += 1
        host.due = when
        heapq.heappush(self._heap, (when, next(self._seq), host.version, host.id))
        self.on_scheduled()

    @property
    def next_due(self) -> float | None:
        """When the earliest host in the heap may be asked (None: no host waits)."""
        return self._heap[0][0] if self._heap else None

    def due(self) -> tuple[Host, Any] | None:
        """A host that may take a request now and that request (or :data:`ROBOTS`), else None.
        The request counts as open until :meth:`finished`."""
        now = self.clock()
        while self._heap and self._heap[0][0] <= now:
            _when, _seq, version, host_id = heapq.heappop(self._heap)
            host = self.hosts[host_id]
            if version != host.version:
                continue
            host.version += 1
            host.due = None
            request = self._take(host, now)
            if request is not None:
                host.inflight += 1
                host.requests += 1
                return host, request
        return None

    def finished(self, host: Host) -> None:
        """A request of the host is done with its connection: another may be asked."""
        host.inflight -= 1
        self.schedule(host)

    def _take(self, host: Host, now: float) -> Any:
        """The next request for a host that is due now, or None (the host is rescheduled as needed)."""
        cfg = self.config
        if host.parked or host.inflight >= cfg.per_host_concurrency or host.robots_pending:
            return None  # rescheduled when a request finishes or robots.txt arrives
        if host.next_at > now:
            self.schedule(host)
            return None
        if cfg.obey_robots and (host.robots is None or host.robots.expires <= now):
            host.robots_pending = True
            host.next_at = now + host.delay
            return ROBOTS
        if host.robots is not None and host.robots.unavailable is not None:
            self.schedule(host, host.robots.expires)
            return None
        request = self._pop(host, now)
        if request is None:
            self.schedule(host)
            return None
        host.next_at = now + self.delay(host)
        self.schedule(host)
        return request

    def _pop(self, host: Host, now: float) -> Request | None:
        """Next URL of a host, skipping (and recording) those robots.txt disallows."""
        while True:
            if host.retries and host.retries[0][0] <= now:
                request = heapq.heappop(host.retries)[2]
            else:
                self._refill(host)
                if not host.queue:
                    return None
                request = host.queue.popleft()
            if host.robots is not None and not host.robots.allowed(request.url, self.config.robots_agent):
                with self.frontier.transaction():
                    self.frontier.finish(request, "robots: disallowed by robots.txt")
                continue
            return request

    # -- politeness ----------------------------------------------------------------------------------
    def delay(self, host: Host) -> float:
        return max(host.delay, host.crawl_delay, self.config.min_delay)

    def started(self, host: Host) -> None:
        """A request really leaves now: the gap to the next one counts from here, not from dispatch."""
        host.next_at = max(host.next_at, self.clock() + self.delay(host))

    def on_response(self, host: Host, latency: float, ok: bool) -> None:
        """AutoThrottle-style: aim at latency / target concurrency; errors only ever lengthen."""
        cfg = self.config
        floor = max(cfg.min_delay, host.crawl_delay)
        if ok:
            host.consecutive_failures = 0
            if cfg.adaptive:
                target = latency / cfg.target_host_concurrency
                host.delay = max(target, (host.delay + target) / 2)
        else:
            host.consecutive_failures += 1
            host.failures += 1
            host.delay = max(host.delay * 2, cfg.backoff_base / 4, latency)
        host.delay = min(cfg.max_delay, max(floor, host.delay))

    def set_crawl_delay(self, host: Host, seconds: float) -> None:
        """robots.txt's Crawl-delay, capped by ``crawl_delay_cap``."""
        host.crawl_delay = min(seconds, self.config.crawl_delay_cap) if seconds else 0.0
        host.delay = max(host.delay, host.crawl_delay)

    def hold_off(self, host: Host, retry_after: float) -> None:
        """Retry-After: ask the host nothing for that long (capped by ``max_retry_after``)."""
        host.next_at = max(host.next_at, self.clock() + min(retry_after, self.config.max_retry_after))

    def backoff(self, attempt: int) -> float:
        """Exponential backoff with equal jitter: half fixed, half random."""
        ceiling = min(self.config.backoff_cap, self.config.backoff_base * 2 ** (attempt - 1))
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def retry_later(self, host: Host, request: Request, wait: float) -> None:
        """Ask for ``request`` again after ``wait`` seconds (before the host's fresh URLs once due)."""
        request.not_before = self.clock() + wait
        heapq.heappush(host.retries, (request.not_before, next(self._seq), request))

    def park(self, host: Host, reason: str, outcome: str | None = None) -> int:
        """Set a host aside: nothing more is asked of it; returns how many queued URLs went with it."""
        host.parked = reason
        host.park_outcome = outcome
        host.queue.clear()
        host.retries.clear()
        return self.frontier.park_host(host.id, reason, outcome)
