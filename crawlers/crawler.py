"""The crawl loop: one event loop, many hosts, per-host politeness, retries, and durable state.

Why a dispatcher over a heap of hosts rather than a worker pool per URL: politeness is a property of
the host (how many connections, how long since the last request, whether it is backing off), so the
scheduler asks "which host may take a request now?" and only then "which of its URLs?". A global
semaphore caps connections overall; hosts wait in a heap keyed by the time they may be asked again.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urljoin

from . import sitemaps
from .admission import Admission
from .config import CrawlConfig, CrawlSummary
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
from .frontier import KIND_PAGE, KIND_SITEMAP, Request
from .hub import Hub
from .oracle import DuplicateOracle
from .pages import OK, PageProcessor
from .partitions import Partition
from .persistence import Persistence
from .progress import progress_line
from .proxies import NoProxyAvailable, ProxyPool
from .robots import Robots, fetch_robots
from .safety import AddressPolicy
from .schedule import ROBOTS, Host, HostScheduler
from .urls import BadURL, normalize_url, site_of

log = logging.getLogger("gristmill.crawl")


class Crawler:
    """A crawl into ``output``; ``run()`` resumes whatever state the output folder already holds.

    With an ``oracle`` (e.g. the dedup service), a page whose text it already holds is not stored.
    """

    def __init__(self, seeds: list[str], output: str, config: CrawlConfig | None = None,
                 on_progress: Callable[[dict[str, Any]], None] | None = None,
                 oracle: DuplicateOracle | None = None, partition: Partition | None = None,
                 hub: Hub | None = None) -> None:
        self.config = config or CrawlConfig()
        if (partition is None) != (hub is None):
            raise ValueError("a partition needs the hub it talks through, and only a partition has one")
        self.partition = partition
        self.hub = hub
        self.output = output
        self.seeds = list(seeds)
        self.on_progress = on_progress
        self.persistence = Persistence(output, self.config, partition, hub)
        self.frontier = self.persistence.frontier
        self._wake = asyncio.Event()
        self.scheduler = HostScheduler(self.config, self.frontier, time.monotonic, self._wake.set)
        self._stopping = False
        self._inflight = 0
        self._pages_in_flight = 0  # page requests dispatched and not yet stored or given up (max_pages)
        self._tasks: set[asyncio.Task[None]] = set()
        self._status = Counter[str]()
        self._errors: list[str] = []
        self._bytes = 0
        self._requests = 0
        self._fetched = 0
        self._documents = 0
        self.pages = PageProcessor(self.config, oracle, self._error)
        self.admission = Admission(self.config, self.frontier, self.scheduler, partition, self._error)

    # -- public ------------------------------------------------------------------------------
    def stop(self) -> None:
        """Finish what is in flight, commit, and return (SIGINT/SIGTERM call this).

        A second call does not wait for slow pages: it cancels what is in flight (those URLs stay
        queued and are fetched again on resume) and commits what is done.
        """
        if self._stopping:
            for task in self._tasks:
                task.cancel()
        self._stopping = True
        self._wake.set()

    async def run(self) -> CrawlSummary:
        cfg = self.config
        started = time.monotonic()
        part = self.partition
        self.exchange = None if self.hub is None or part is None else PartitionExchange(
            self.hub, part, self.frontier, self.admission.admit_link, self._error,
            deferred=self.persistence.checkpoint is not None)
        self.commits = self.persistence.start(self.exchange, self._error)
        if cfg.retry_parked:
            self.frontier.unpark_all()
        self.fetcher = Fetcher(cfg.user_agent, FetchLimits(cfg.max_body_bytes, cfg.max_decompressed_bytes,
                                                           cfg.connect_timeout, cfg.read_timeout, cfg.total_timeout),
                               AddressPolicy(cfg.allow_networks, cfg.allow_private), dict(cfg.host_map),
                               max_connections=cfg.concurrency)
        self.proxies = ProxyPool(cfg.proxies, cfg.proxy_routes, ban_after=cfg.proxy_ban_after,
                                 cooldown=cfg.proxy_cooldown)
        self._slots = asyncio.Semaphore(cfg.concurrency)
        await self.pages.open()
        self._documents = self.frontier.documents()
        background: list[asyncio.Task[None]] = []
        try:
            self.commits.publish()
            self.admission.admit_seeds(self.seeds)
            self._load_hosts()
            background = [asyncio.create_task(self.commits.run()),
                          asyncio.create_task(self._progress_loop(started))]
            if self.proxies and cfg.proxy_health_url:
                background.append(asyncio.create_task(self._health_loop()))
            await self._dispatch()
            if self._tasks:
                await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.fetcher.close()
            await self.pages.close()
            try:
                await self.commits.finish()
            finally:
                summary = self._summary(time.monotonic() - started)
                self.persistence.close()
        return summary

    def enqueue(self, urls: Iterable[str], depth: int = 0) -> int:
        """Admit more URLs (seed-like: in scope, under the trap limits); returns how many were new."""
        return self.admission.enqueue(urls, depth)

    # -- scheduling --------------------------------------------------------------------------
    def _load_hosts(self) -> None:
        for host_id in self.frontier.queued_hosts():
            self.scheduler.schedule(self.scheduler.host(host_id))

    def _limit_reached(self) -> bool:
        limit = self.config.max_pages
        return limit is not None and self._documents >= limit

    def _limit_taken(self) -> bool:
        """The pages stored and the pages in flight (fetching, waiting for extraction) fill ``max_pages``.

        Why count the pages in flight: a cap checked on stored pages alone let every page already
        dispatched land, and ``--max-pages 150`` stored 362 (issue 28). A page in flight that ends
        without a document frees its place for another."""
        limit = self.config.max_pages
        return limit is not None and self._documents + self._pages_in_flight >= limit

    async def _dispatch(self) -> None:
        while True:
            await self._slots.acquire()
            item = await self._next()
            if item is None:
                self._slots.release()
                return
            host, request = item
            self.pages.start()  # not before: a re-run of a finished crawl starts no extraction worker
            self._inflight += 1
            self._requests += 1
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
                if self.partition is not None and await self._idle():
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
        self._error(f"{host.origin}: parked ({reason}); {count} queued URLs set aside")

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
                self._error(f"{request.url}: giving up after {request.attempts} attempts: {reason}")
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
                self._inflight -= 1
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
            self._error(f"{url}: internal error {type(exc).__name__}: {exc}")
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
            self._error(f"{host.origin}/robots.txt unavailable, host deferred: {robots.unavailable}")
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
                self._status[exc.kind] += 1
                self.scheduler.on_response(host, 0.0, ok=False)
                self._failed(host, request, str(exc))
            else:
                self._status[exc.kind] += 1
                self._finish(request, f"rejected: {exc}")
            return
        status = response.status
        self._status[str(status)] += 1
        self._bytes += len(response.body)
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
            self._error(str(exc))
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
                self._error(str(exc))
                self.stop()
            return
        with self.frontier.transaction():
            if page.row is not None:
                self.frontier.store_result(request, page.row, page.warc)
            self.frontier.finish(request, page.outcome)
            for link in page.links:
                self.admission.admit(link, request.depth + 1)
        self._fetched += 1
        if page.outcome == OK:
            self._documents += 1
            self.commits.stored()

    # -- partitions --------------------------------------------------------------------------------
    async def _idle(self) -> bool:
        """Nothing queued: pass links on, and wait for links from the other partitions until
        the coordinator says every partition is idle and no link is on its way (False: stop)."""
        assert self.exchange is not None
        while not self._stopping and not self._limit_reached():
            self.exchange.swap()
            if self.scheduler.next_due is not None or self._tasks:
                return True
            self.exchange.report(idle=True)
            if self.exchange.stopped():
                return False
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), 0.1)
            except asyncio.TimeoutError:
                pass
        return False

    # -- progress, health -----------------------------------------------------------------------
    async def _progress_loop(self, started: float) -> None:
        """Every ``progress_interval``: the report to ``on_progress`` when given, else a log line."""
        last_time, last_fetched, first_documents = time.monotonic(), 0, self._documents
        while True:
            await asyncio.sleep(self.config.progress_interval)
            now = time.monotonic()
            report = self._progress(now - started, (self._fetched - last_fetched) / max(now - last_time, 1e-9),
                                    (self._documents - first_documents) / max(now - started, 1e-9))
            last_time, last_fetched = now, self._fetched
            if self.on_progress is not None:
                self.on_progress(report)
            else:
                log.info("%s", report["line"])

    def _progress(self, elapsed: float, pages_per_s: float, documents_per_s: float) -> dict[str, Any]:
        slowest = sorted(self.scheduler.hosts.values(), key=lambda h: (h.delay, h.failures), reverse=True)[:5]
        report = {"elapsed_s": elapsed, "documents": self._documents, "max_pages": self.config.max_pages,
                  "documents_per_s": documents_per_s, "pages_per_s": pages_per_s, "fetched": self._fetched,
                  "waiting": self.pages.waiting, "bytes": self._bytes, "requests": self._requests,
                  "queued": self.frontier.queued_count(), "status_counts": dict(self._status),
                  "in_flight": self._inflight,
                  "slowest_hosts": {h.origin: {"delay_s": round(self.scheduler.delay(h), 3), "failures": h.failures}
                                    for h in slowest}}
        report["line"] = progress_line(report)
        return report

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

    def _error(self, message: str) -> None:
        log.warning("%s", message)
        if len(self._errors) < 200:
            self._errors.append(message)

    def _summary(self, elapsed: float) -> CrawlSummary:
        counted = self.frontier.outcome_counts()
        outcomes = {kind: count for kind, (count, _example) in counted.items()}
        examples = {kind: example for kind, (_count, example) in counted.items() if example is not None}
        return CrawlSummary(
            output=self.output, documents=self._documents, fetched_this_run=self._fetched,
            requests=self._requests, bytes=self._bytes, elapsed_s=elapsed,
            pages_per_s=self._fetched / elapsed if elapsed > 0 else 0.0, status_counts=dict(self._status),
            outcomes=outcomes, outcome_examples=examples, queued=self.frontier.queued_count(),
            parked_hosts=self.frontier.parked_hosts(),
            hosts={h.origin: {"requests": h.requests, "failures": h.failures, "delay_s": round(self.scheduler.delay(h), 3),
                              "parked": h.parked} for h in self.scheduler.hosts.values()},
            proxies=self.proxies.health(), errors=list(self._errors), dedup_service=dict(self.pages.dedup_counts))


def run_until_signalled(crawler: Crawler) -> tuple[CrawlSummary, list[signal.Signals]]:
    """Run a crawl on a new event loop with SIGINT/SIGTERM stopping it; returns the signals received."""
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        crawler.stop()

    async def main() -> CrawlSummary:
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
        try:
            return await crawler.run()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    return asyncio.run(main()), received
