"""The fetch loop: one event loop, many hosts, per-host politeness, retries; each page fetched,
extracted and stored in the frontier.

Why a dispatcher over a heap of hosts rather than a worker pool per URL: politeness is a property of
the host (how many connections, how long since the last request, whether it is backing off), so the
scheduler asks "which host may take a request now?" and only then "which of its URLs?". A global
semaphore caps connections overall; hosts wait in a heap keyed by the time they may be asked again.
What becomes of a stored page (shards, checkpoints) is :mod:`gristmill.crawlers.persistence`'s job,
which URLs are taken is :mod:`gristmill.crawlers.admission`'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin

from . import sitemaps
from .admission import Admission
from .config import CrawlConfig
from .exchange import PartitionExchange
from .extract import ExtractionError
from .fetch import (
    HTML_TYPES,
    SITEMAP_TYPES,
    BlockedError,
    Fetcher,
    FetchError,
    FetchLimits,
    Response,
    UnresolvableHost,
    retry_after_seconds,
)
from .frontier import KIND_PAGE, KIND_SITEMAP, Frontier, Request
from .oracle import DuplicateOracle
from .pages import OK, PageProcessor
from .partitions import Partition
from .proxies import NoProxyAvailable, ProxyPool
from .robots import Robots, fetch_robots
from .safety import AddressPolicy
from .schedule import ROBOTS, Host, HostScheduler
from .urls import BadURL, normalize_url, site_of

log = logging.getLogger("gristmill.crawl")


class FetchLoop:
    """Fetches what ``frontier`` holds until it is done, stopped or ``max_pages`` is reached, storing
    each page's row in the frontier; the counters are what progress reports and the summary show."""

    def __init__(self, config: CrawlConfig, frontier: Frontier, partition: Partition | None,
                 oracle: DuplicateOracle | None, on_error: Callable[[str], None]) -> None:
        self.config = config
        self.frontier = frontier
        self.on_error = on_error
        self._wake = asyncio.Event()
        self.scheduler = HostScheduler(config, frontier, time.monotonic, self._wake.set)
        self.admission = Admission(config, frontier, self.scheduler, partition, on_error)
        self.pages = PageProcessor(config, oracle, on_error)
        self._stopping = False
        self.inflight = 0
        self._pages_in_flight = 0  # page requests dispatched and not yet stored or given up (max_pages)
        self._tasks: set[asyncio.Task[None]] = set()
        self.status = Counter[str]()
        self.bytes = 0
        self.requests = 0
        self.fetched = 0
        self.documents = 0

    def stop(self) -> None:
        """Finish what is in flight and return; a second call cancels what is in flight (those URLs
        stay queued and are fetched again on resume)."""
        if self._stopping:
            for task in self._tasks:
                task.cancel()
        self._stopping = True
        self._wake.set()

    async def open(self) -> None:
        """The connections, proxies and extraction of this run; the documents stored before it count."""
        cfg = self.config
        self.fetcher = Fetcher(cfg.user_agent, FetchLimits(cfg.max_body_bytes, cfg.max_decompressed_bytes,
                                                           cfg.connect_timeout, cfg.read_timeout, cfg.total_timeout),
                               AddressPolicy(cfg.allow_networks, cfg.allow_private), dict(cfg.host_map),
                               max_connections=cfg.concurrency)
        self.proxies = ProxyPool(cfg.proxies, cfg.proxy_routes, ban_after=cfg.proxy_ban_after,
                                 cooldown=cfg.proxy_cooldown)
        self._slots = asyncio.Semaphore(cfg.concurrency)
        await self.pages.open()
        self.documents = self.frontier.documents()

    async def run(self, on_stored: Callable[[], None], exchange: PartitionExchange | None) -> None:
        """Dispatch until nothing is left (a partition: until the coordinator stops the crawl), then wait
        for the work in flight; ``on_stored`` hears of every page row stored."""
        self._on_stored = on_stored
        self._exchange = exchange
        health = (asyncio.create_task(self._health_loop())
                  if self.proxies and self.config.proxy_health_url else None)
        try:
            await self._dispatch()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            if health is not None:
                health.cancel()
                await asyncio.gather(health, return_exceptions=True)

    async def close(self) -> None:
        await self.fetcher.close()
        await self.pages.close()

    def load_hosts(self) -> None:
        for host_id in self.frontier.queued_hosts():
            self.scheduler.schedule(self.scheduler.host(host_id))

    def _limit_reached(self) -> bool:
        limit = self.config.max_pages
        return limit is not None and self.documents >= limit

    def _limit_taken(self) -> bool:
        """The pages stored and the pages in flight (fetching, waiting for extraction) fill ``max_pages``.

        Why count the pages in flight: a cap checked on stored pages alone let every page already
        dispatched land, and ``--max-pages 150`` stored 362 (issue 28). A page in flight that ends
        without a document frees its place for another."""
        limit = self.config.max_pages
        return limit is not None and self.documents + self._pages_in_flight >= limit

    async def _dispatch(self) -> None:
        while True:
            await self._slots.acquire()
            item = await self._next()
            if item is None:
                self._slots.release()
                return
            host, request = item
            self.pages.start()  # not before: a re-run of a finished crawl starts no extraction worker
            self.inflight += 1
            self.requests += 1
            page = isinstance(request, Request) and request.kind == KIND_PAGE
            self._pages_in_flight += page
            task = asyncio.create_task(self._work(host, request, page))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _next(self) -> tuple[Host, Any] | None:
        while True:
            if self._stopping or self._limit_reached():
                return None
            if self._limit_taken():  # wait for the pages in flight: they may leave room
                self._wake.clear()
                await self._wake.wait()
                continue
            item = self.scheduler.due()
            if item is not None:
                return item
            due = self.scheduler.next_due
            if due is None and not self._tasks:
                if self._exchange is not None and await self._idle():
                    continue
                return None
            timeout = None if due is None else max(0.0, due - time.monotonic())
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except asyncio.TimeoutError:
                pass

    def _park(self, host: Host, reason: str, outcome: str | None = None) -> None:
        count = self.scheduler.park(host, reason, outcome)
        self.on_error(f"{host.origin}: parked ({reason}); {count} queued URLs set aside")

    def _failed(self, host: Host, request: Request, reason: str, retry_after: float | None = None) -> None:
        """A transient failure: slow the host, retry with backoff or give up, park a hopeless host."""
        cfg = self.config
        if retry_after is not None:
            self.scheduler.hold_off(host, retry_after)
        if host.consecutive_failures >= cfg.park_after:
            self._park(host, f"{host.consecutive_failures} consecutive failures, last: {reason}")
            return
        request.attempts += 1
        with self.frontier.transaction():
            if request.attempts > cfg.max_retries:
                self.frontier.finish(request, f"failed: {reason} (after {request.attempts} attempts)")
                self.on_error(f"{request.url}: giving up after {request.attempts} attempts: {reason}")
                return
            self.frontier.retry(request)
        wait = (min(retry_after, cfg.max_retry_after) if retry_after is not None
                else self.scheduler.backoff(request.attempts))
        self.scheduler.retry_later(host, request, wait)

    # -- work --------------------------------------------------------------------------------
    async def _work(self, host: Host, request: Any, page: bool = False) -> None:
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.inflight -= 1
                self._slots.release()
                self.scheduler.finished(host)
                self._wake.set()

        # The gap counts from when the request really leaves, not from when it was dispatched.
        self.scheduler.started(host)
        try:
            if request is ROBOTS:
                await self._robots(host)
            else:
                await self._fetch(host, request, release)
        except Exception as exc:  # a bug must not take the crawl down; the URL is recorded as failed
            url = getattr(request, "url", host.origin + "/robots.txt")
            log.exception("internal error on %s", url)
            self.on_error(f"{url}: internal error {type(exc).__name__}: {exc}")
            if isinstance(request, Request):
                with self.frontier.transaction():
                    self.frontier.finish(request, f"error: internal {type(exc).__name__}")
        finally:
            if request is ROBOTS:
                host.robots_pending = False
            self._pages_in_flight -= page
            release()
            self._tasks.discard(asyncio.current_task())  # type: ignore[arg-type]
            self._wake.set()

    async def _robots(self, host: Host) -> None:
        cfg = self.config
        try:
            proxy = self._proxy(host)
        except NoProxyAvailable as exc:
            host.robots = Robots(host.origin, time.monotonic() + self._proxy_wait(), unavailable=str(exc))
            return

        def observe(status: int | None, body: bytes) -> bool:
            return self.proxies.report(proxy, host.name, status, body) if proxy else False

        robots, latencies = await fetch_robots(self.fetcher, host.origin, cfg.robots_agent, cfg.robots_ttl,
                                               cfg.robots_error_ttl, proxy, observe)
        host.robots = robots
        self.scheduler.on_response(host, max(latencies, default=0.0), robots.unavailable is None)
        if robots.blocked is not None:
            self._park(host, "address not allowed", f"blocked: {robots.blocked}")
            return
        if robots.unresolved is not None:
            self._park(host, "name does not resolve", f"dns: {robots.unresolved}")
            return
        if robots.unavailable is not None:
            host.robots_failures += 1
            self.on_error(f"{host.origin}/robots.txt unavailable, host deferred: {robots.unavailable}")
            if host.robots_failures > cfg.max_retries:
                self._park(host, f"robots.txt unavailable: {robots.unavailable}")
            return
        host.robots_failures = 0
        self.scheduler.set_crawl_delay(host, robots.crawl_delay(cfg.robots_agent) or 0.0)
        if cfg.robots_sitemaps and robots.sitemaps:
            with self.frontier.transaction():
                for link in robots.sitemaps:
                    try:
                        self.admission.admit(normalize_url(link), 0, KIND_SITEMAP)
                    except BadURL:
                        continue

    def _proxy_wait(self) -> float:
        """How long to wait when every proxy for a host is benched or banned."""
        cfg = self.config
        return cfg.proxy_health_interval if cfg.proxy_health_url else cfg.proxy_cooldown / 10

    def _proxy(self, host: Host) -> str | None:
        return self.proxies.choose(host.name) if self.proxies else None

    async def _fetch(self, host: Host, request: Request, release: Callable[[], None]) -> None:
        try:
            proxy = self._proxy(host)
        except NoProxyAvailable:  # not the URL's fault: wait for a proxy without spending an attempt
            self.scheduler.retry_later(host, request, self._proxy_wait())
            return
        accept = SITEMAP_TYPES if request.kind == KIND_SITEMAP else HTML_TYPES
        try:
            response = await self.fetcher.fetch(request.url, accept, proxy)
        except BlockedError as exc:
            self._finish(request, f"blocked: {exc}")
            return
        except UnresolvableHost as exc:
            self._finish(request, f"dns: {exc}")
            self._park(host, "name does not resolve", f"dns: {exc}")
            return
        except FetchError as exc:
            if exc.retryable:
                self.proxies.report(proxy, host.name, None)
                self.status[exc.kind] += 1
                self.scheduler.on_response(host, 0.0, ok=False)
                self._failed(host, request, str(exc))
            else:
                self.status[exc.kind] += 1
                self._finish(request, f"rejected: {exc}")
            return
        status = response.status
        self.status[str(status)] += 1
        self.bytes += len(response.body)
        banned = self.proxies.report(proxy, host.name, status, response.body) if proxy else False
        if status == 429 or status >= 500 or banned:
            self.scheduler.on_response(host, response.elapsed, ok=False)
            self._failed(host, request, f"http {status}" + (" (ban signal via proxy)" if banned else ""),
                         retry_after_seconds(response.headers.get("Retry-After")))
            return
        self.scheduler.on_response(host, response.elapsed, ok=True)
        if 300 <= status < 400:
            self._redirect(request, response)
            return
        if status >= 400 or status < 200:
            self._finish(request, f"http {status}")
            return
        if request.kind == KIND_SITEMAP:
            release()
            self._sitemap(request, response)
            return
        reserved = await self.pages.reserve(response)  # still holding the connection slot: a full budget
        release()  # slows fetching; the connection is done, parsing and extraction do not hold the host's slot
        await self._page(request, response, reserved)

    def _finish(self, request: Request, outcome: str) -> None:
        with self.frontier.transaction():
            self.frontier.finish(request, outcome)

    def _redirect(self, request: Request, response: Response) -> None:
        location = response.headers.get("Location")
        if not location:
            self._finish(request, f"http {response.status}: redirect without Location")
            return
        if request.hops >= self.config.max_redirects:
            self._finish(request, f"redirect: chain longer than {self.config.max_redirects} hops")
            return
        try:
            target = normalize_url(urljoin(request.url, location))
        except BadURL as exc:
            self._finish(request, f"redirect: bad Location ({exc})")
            return
        with self.frontier.transaction():
            if request.depth == 0:
                self.admission.scope.add(site_of(target))  # a seed's redirect target joins the scope
            refused = self.admission.admit(target, request.depth, request.kind, request.via or request.url,
                                  request.hops + 1, scoped=request.depth > 0)
            if refused == "seen":
                self.frontier.finish(request, "redirect: target already seen (loop or duplicate)")
            elif refused is not None:
                self.frontier.finish(request, f"redirect: target refused ({refused})")
            else:
                self.frontier.finish(request, "redirect")

    def _sitemap(self, request: Request, response: Response) -> None:
        try:
            entries = sitemaps.parse_sitemap(response.body, request.url, self.config.max_decompressed_bytes)
        except sitemaps.SitemapError as exc:
            self._finish(request, f"rejected: {exc}")
            self.on_error(str(exc))
            return
        with self.frontier.transaction():
            for link, is_index in entries:
                self.admission.admit(link, 0, KIND_SITEMAP if is_index else KIND_PAGE)
            self.frontier.finish(request, "sitemap")

    async def _page(self, request: Request, response: Response, reserved: int) -> None:
        try:
            page = await self.pages.process(request, response, reserved)
        except ExtractionError as exc:  # no extraction worker can start: stop, leaving the page queued
            if not self._stopping:
                self.on_error(str(exc))
                self.stop()
            return
        with self.frontier.transaction():
            if page.row is not None:
                self.frontier.store_result(request, page.row, page.warc)
            self.frontier.finish(request, page.outcome)
            for link in page.links:
                self.admission.admit(link, request.depth + 1)
        self.fetched += 1
        if page.outcome == OK:
            self.documents += 1
            self._on_stored()

    # -- partitions --------------------------------------------------------------------------------
    async def _idle(self) -> bool:
        """Nothing queued: pass links on, and wait for links from the other partitions until
        the coordinator says every partition is idle and no link is on its way (False: stop)."""
        assert self._exchange is not None
        while not self._stopping and not self._limit_reached():
            self._exchange.swap()
            if self.scheduler.next_due is not None or self._tasks:
                return True
            self._exchange.report(idle=True)
            if self._exchange.stopped():
                return False
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), 0.1)
            except asyncio.TimeoutError:
                pass
        return False

    async def _health_loop(self) -> None:
        """Probe benched proxies with the health URL and return the ones that answer."""
        url = self.config.proxy_health_url
        assert url is not None
        while True:
            await asyncio.sleep(self.config.proxy_health_interval)
            for proxy in self.proxies.benched():
                try:
                    response = await self.fetcher.fetch(url, (), proxy, truncate=True)
                except FetchError:
                    continue
                if response.status < 500:
                    self.proxies.restore(proxy)
