"""The crawl loop: one event loop, many hosts, per-host politeness, retries, and durable state.

Why a dispatcher over a heap of hosts rather than a worker pool per URL: politeness is a property of
the host (how many connections, how long since the last request, whether it is backing off), so the
scheduler asks "which host may take a request now?" and only then "which of its URLs?". A global
semaphore caps connections overall; hosts wait in a heap keyed by the time they may be asked again.
"""

from __future__ import annotations

import asyncio
import email.utils
import ipaddress
import logging
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urljoin

from . import sitemaps
from .extract import (
    ByteBudget,
    ExtractionError,
    ExtractionPool,
    ExtractionTimeout,
    content_hash,
    decode_html,
    detect_language,
)
from .fetch import HTML_TYPES, SITEMAP_TYPES, BlockedError, Fetcher, FetchError, FetchLimits, Response
from .frontier import KIND_PAGE, KIND_SITEMAP, Frontier, Request, ResultLog, now_ms
from .oracle import DuplicateOracle, OracleError
from .output import SHARD_PREFIX, Committer, check_output_folder, warc_payload
from .partitioned import Coordinator, PartitionLauncher, check_partitions, state_root
from .partitions import Exchange, ExchangeError, Link, Partition, partition_of, write_json
from .proxies import NoProxyAvailable, ProxyPool, ProxySpec
from .robots import Robots, fetch_robots
from .safety import AddressPolicy
from .schedule import ROBOTS, Host, HostScheduler
from .urls import BadURL, host_of, normalize_url, origin_of, parse_page, url_id

log = logging.getLogger("gristmill.crawl")

STATE_FILE = "frontier.sqlite"


_NON_NEGATIVE = ("min_delay", "max_delay", "crawl_delay_cap", "max_retries", "max_depth", "max_redirects",
                 "max_body_bytes", "max_decompressed_bytes", "connect_timeout", "read_timeout",
                 "total_timeout", "extract_timeout", "extract_buffer_bytes", "commit_every", "commit_interval")


@dataclass
class CrawlConfig:
    """Every knob of a crawl; the defaults are polite (see docs/CRAWL.md for each)."""

    user_agent: str = "gristmill/0.1 (+https://github.com/gristmill/gristmill)"
    robots_agent: str = "gristmill"
    obey_robots: bool = True
    robots_ttl: float = 24 * 3600.0
    robots_error_ttl: float = 60.0
    robots_sitemaps: bool = True
    concurrency: int = 64
    per_host_concurrency: int = 2
    min_delay: float = 1.0
    max_delay: float = 60.0
    crawl_delay_cap: float = 30.0
    adaptive: bool = True
    target_host_concurrency: float = 1.0
    max_retries: int = 3
    backoff_base: float = 1.0
    backoff_cap: float = 120.0
    max_retry_after: float = 300.0
    park_after: int = 10
    max_depth: int = 10
    max_url_length: int = 2048
    max_pages_per_host: int = 100_000
    max_pages: int | None = None
    max_redirects: int = 5
    follow: str = "same-host"
    max_body_bytes: int = 10 * 1024 * 1024
    max_decompressed_bytes: int = 40 * 1024 * 1024
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    total_timeout: float = 60.0
    allow_private: bool = False
    allow_networks: tuple[str, ...] = ()
    host_map: Mapping[str, str] = field(default_factory=dict)
    proxies: tuple[ProxySpec, ...] = ()
    proxy_routes: Mapping[str, str] = field(default_factory=dict)
    proxy_ban_after: int = 3
    proxy_cooldown: float = 300.0
    proxy_health_url: str | None = None
    proxy_health_interval: float = 30.0
    extract: bool = True
    extract_workers: int = os.cpu_count() or 1  # the event loop needs little CPU; extraction takes it all
    extract_timeout: float = 30.0
    extract_buffer_bytes: int = 64 * 1024 * 1024  # HTML waiting for an extraction worker, all pages together
    warc: bool = False
    commit_every: int = 1000
    commit_interval: float = 30.0
    shard_bytes: int = 256 * 1024 * 1024
    row_group_bytes: int = 4 * 1024 * 1024
    state_dir: str | None = None
    synchronous: str = "NORMAL"
    progress_interval: float = 10.0
    retry_parked: bool = False
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    partitions: int = 1  # crawler processes, each owning the hosts whose registered domain hashes to it

    def __post_init__(self) -> None:
        """Refuse bad settings here, before a crawl creates any state."""
        if self.follow not in ("same-host", "any"):
            raise ValueError(f"follow must be 'same-host' or 'any', not {self.follow!r}")
        if self.partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {self.partitions}")
        if self.per_host_concurrency < 1 or self.concurrency < 1:
            raise ValueError("concurrency and per_host_concurrency must be at least 1")
        if self.max_pages is not None and self.max_pages < 1:
            raise ValueError(f"max_pages must be at least 1, not {self.max_pages}")
        for name in _NON_NEGATIVE:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, not {getattr(self, name)}")
        self.allow_networks = tuple(self.allow_networks)
        for network in self.allow_networks:  # ValueError: "'x' does not appear to be an IPv4 or IPv6 network"
            ipaddress.ip_network(network, strict=False)
        for address in self.host_map.values():
            ipaddress.ip_address(address)
        self.proxies = tuple(ProxySpec.parse(p) if isinstance(p, str) else p for p in self.proxies)


@dataclass
class CrawlSummary:
    """What a crawl did; ``outcomes`` covers every URL ever admitted (all runs), and
    ``outcome_examples`` gives one full outcome (with its URL and reason) of each kind that has one."""

    output: str
    documents: int
    fetched_this_run: int
    requests: int
    bytes: int
    elapsed_s: float
    pages_per_s: float
    status_counts: dict[str, int]
    outcomes: dict[str, int]
    queued: int
    parked_hosts: dict[str, str]
    hosts: dict[str, dict[str, Any]]
    proxies: list[dict[str, Any]]
    errors: list[str]
    outcome_examples: dict[str, str] = field(default_factory=dict)
    dedup_service: dict[str, int] = field(default_factory=dict)  # checked / duplicates / errors
    stopped_by: str | None = None  # "SIGTERM" when a signal ended the crawl before its frontier was empty

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header in either form (delta-seconds or HTTP-date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


class Crawler:
    """A crawl into ``output``; ``run()`` resumes whatever state the output folder already holds.

    With an ``oracle`` (e.g. the dedup service), a page whose text it already holds is not stored.
    """

    def __init__(self, seeds: list[str], output: str, config: CrawlConfig | None = None,
                 on_progress: Callable[[dict[str, Any]], None] | None = None,
                 oracle: DuplicateOracle | None = None, partition: Partition | None = None) -> None:
        self.config = config or CrawlConfig()
        self.partition = partition
        self.output = output
        self.seeds = list(seeds)
        self.on_progress = on_progress
        state_dir = state_root(output, self.config.state_dir)
        os.makedirs(state_dir, exist_ok=True)
        self.state_path = os.path.join(state_dir, STATE_FILE)
        self.frontier = Frontier(self.state_path, self.config.synchronous)
        self._wake = asyncio.Event()
        self.scheduler = HostScheduler(self.config, self.frontier, time.monotonic, self._wake.set)
        self._stopping = False
        self._inflight = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._scope: set[str] = set()
        self._status = Counter[str]()
        self._errors: list[str] = []
        self._bytes = 0
        self._requests = 0
        self._fetched = 0
        self._pending_results = 0
        self._documents = 0
        self._oracle = oracle
        self._committing: asyncio.Future[int] | None = None
        self._dedup_counts = Counter[str]()
        self._epoch = 0  # bumped whenever this partition gets work: the coordinator's proof of quiet
        self._reported_idle: bool | None = None
        self._reported_at = 0.0

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
        self.results = ResultLog(self.state_path, cfg.synchronous)
        part = self.partition
        self.committer = Committer(self.output, self.results, shard_bytes=cfg.shard_bytes,
                                   row_group_bytes=cfg.row_group_bytes, warc=cfg.warc,
                                   storage_options=cfg.storage_options,
                                   prefix=part.shard_prefix if part else SHARD_PREFIX,
                                   segment=part.segment if part else None)
        self.exchange = Exchange(part.root, part.index, part.count) if part else None
        if part is not None:
            self._report(idle=False)
        for orphan in self.committer.remove_orphans():
            log.info("removed %s: written by an interrupted commit, never listed by a manifest", orphan)
        if cfg.retry_parked:
            self.frontier.unpark_all()
        self.fetcher = Fetcher(cfg.user_agent, FetchLimits(cfg.max_body_bytes, cfg.max_decompressed_bytes,
                                                           cfg.connect_timeout, cfg.read_timeout, cfg.total_timeout),
                               AddressPolicy(cfg.allow_networks, cfg.allow_private), dict(cfg.host_map),
                               max_connections=cfg.concurrency)
        self.proxies = ProxyPool(cfg.proxies, cfg.proxy_routes, ban_after=cfg.proxy_ban_after,
                                 cooldown=cfg.proxy_cooldown)
        self.pool = ExtractionPool(cfg.extract_workers, cfg.extract_timeout) if cfg.extract else None
        self._extract_slots = asyncio.Semaphore(max(4, 4 * cfg.extract_workers))
        self._html_budget = ByteBudget(cfg.extract_buffer_bytes)
        self._slots = asyncio.Semaphore(cfg.concurrency)
        if self._oracle is not None:
            await self._oracle.open()
        self._documents = self.frontier.documents()
        self._pending_results = self.results.unsharded_count()
        background: list[asyncio.Task[None]] = []
        try:
            self.committer.publish(self._stats())  # a crash between recording a shard and publishing
            self._admit_seeds()
            self._load_hosts()
            background = [asyncio.create_task(self._committer_loop()),
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
            if self._oracle is not None:
                await self._oracle.close()
            if self.pool is not None:
                self.pool.close()
            if self._committing is not None:
                await asyncio.wait([self._committing])  # a failure was logged; its rows are still pending
            try:
                self.committer.flush(self._stats())
                self._pending_results = 0
            finally:
                summary = self._summary(time.monotonic() - started)
                self.frontier.close()
                self.results.close()
        return summary

    def enqueue(self, urls: Iterable[str], depth: int = 0) -> int:
        """Admit more URLs (seed-like: in scope, under the trap limits); returns how many were new."""
        added = 0
        with self.frontier.transaction():
            for url in self._scoped_seeds(urls):
                added += self._admit(url, depth) is None
        return added

    # -- admission ---------------------------------------------------------------------------
    def _scoped_seeds(self, urls: Iterable[str]) -> Iterable[str]:
        """Seed URLs normalised, their hosts put in scope; a malformed one is recorded as an error."""
        for raw in urls:
            try:
                url = normalize_url(raw)
            except BadURL as exc:
                self._error(f"seed {exc}")
                continue
            self._scope.add(host_of(url))
            yield url

    def _owns(self, url: str) -> bool:
        return self.partition is None or partition_of(url, self.partition.count) == self.partition.index

    def _admit_seeds(self) -> None:
        with self.frontier.transaction():
            for url in self._scoped_seeds(self.seeds):
                if not self._owns(url):
                    continue  # every partition gets every seed: all seed hosts are in everyone's scope
                kind = KIND_SITEMAP if sitemaps.looks_like_sitemap(url) else KIND_PAGE
                self.frontier.add(url, origin_of(url), 0, kind)
        for row in self.frontier.db.execute("SELECT DISTINCT url FROM urls WHERE depth = 0"):
            self._scope.add(host_of(row[0]))

    def _admit(self, url: str, depth: int, kind: int = KIND_PAGE, via: str | None = None, hops: int = 0,
               scoped: bool = True) -> str | None:
        """Add a discovered URL under the trap limits; returns why it was refused, or None."""
        cfg = self.config
        if self.frontier.recently_seen(url):
            return "seen"
        if len(url) > cfg.max_url_length:
            return "url too long"
        if depth > cfg.max_depth:
            return "too deep"
        if self.partition is not None and (owner := partition_of(url, self.partition.count)) != self.partition.index:
            self.frontier.send(owner, url, depth, kind, via, hops, scoped)  # the owner checks scope and seen
            return None
        name = host_of(url)
        if scoped and cfg.follow == "same-host" and name not in self._scope:
            return "out of scope"
        origin = origin_of(url)
        if self.frontier.admitted(origin) >= cfg.max_pages_per_host:
            return "host page limit"
        request = self.frontier.add(url, origin, depth, kind, via, hops)
        if request is None:
            return "seen"
        host = self.scheduler.host(request.host)
        if host.parked:
            self.frontier.park_host(host.id, host.parked, host.park_outcome)
            return None
        self.scheduler.admitted(request)
        return None

    def _load_hosts(self) -> None:
        for host_id in self.frontier.queued_hosts():
            self.scheduler.schedule(self.scheduler.host(host_id))

    def _limit_reached(self) -> bool:
        limit = self.config.max_pages
        return limit is not None and self._documents >= limit

    async def _dispatch(self) -> None:
        while True:
            await self._slots.acquire()
            item = await self._next()
            if item is None:
                self._slots.release()
                return
            host, request = item
            self._inflight += 1
            self._requests += 1
            task = asyncio.create_task(self._work(host, request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _next(self) -> tuple[Host, Any] | None:
        while True:
            if self._stopping or self._limit_reached():
                return None
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
    async def _work(self, host: Host, request: Any) -> None:
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
                        self._admit(normalize_url(link), 0, KIND_SITEMAP)
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
                         _retry_after(response.headers.get("Retry-After")))
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
        held = len(response.body) if self.pool is not None else 0
        await self._html_budget.acquire(held)  # still holding the connection slot: a full budget slows fetching
        release()  # the connection is done; parsing and extraction do not hold the host's slot
        try:
            await self._page(request, response)
        finally:
            await self._html_budget.release(held)

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
                self._scope.add(host_of(target))
            refused = self._admit(target, request.depth, request.kind, request.via or request.url,
                                  request.hops + 1, scoped=False)
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
                self._admit(link, 0, KIND_SITEMAP if is_index else KIND_PAGE)
            self.frontier.finish(request, "sitemap")

    async def _page(self, request: Request, response: Response) -> None:
        cfg = self.config
        html, encoding = decode_html(response.body, response.charset)
        links, plain = parse_page(html, response.url, want_text=self.pool is None)
        if self.pool is not None:
            try:
                async with self._extract_slots:
                    text, language = await self.pool.process(html, response.url)
            except ExtractionError as exc:  # a timeout, or a worker that crashed on this page
                if self.pool.broken is not None:  # no worker can start: stop, leaving the page queued
                    if not self._stopping:
                        self._error(str(self.pool.broken))
                        self.stop()
                    return
                self._error(str(exc))
                self._finish(request, "rejected: extraction timed out" if isinstance(exc, ExtractionTimeout)
                             else "rejected: extraction failed")
                return
        else:
            text, language = plain, detect_language(plain)
        final = response.url
        row = {"id": url_id(final), "text": text, "url": request.via or request.url, "final_url": final,
               "status": response.status, "fetch_time": now_ms(), "domain": host_of(final),
               "language": language, "content_hash": content_hash(text), "depth": request.depth,
               "encoding": encoding}
        blob = None
        if cfg.warc:
            blob = warc_payload(response.request_headers, response.status, "OK", list(response.headers.items()),
                                response.body, {"language": language, "encoding": encoding,
                                                "links": len(links), "depth": request.depth})
        duplicate_of = await self._known_to_oracle(row) if text and self._oracle is not None else None
        with self.frontier.transaction():
            if duplicate_of is not None:
                self.frontier.finish(request, f"duplicate: of {duplicate_of} (dedup service)")
            elif text:
                self.frontier.store_result(request, row, blob)
                self.frontier.finish(request, "ok")
                self._pending_results += 1
                self._documents += 1
            else:
                self.frontier.finish(request, "empty: no main text")
            for link in links:
                self._admit(link, request.depth + 1)
        self._fetched += 1
        if self._pending_results >= cfg.commit_every:
            self._commit()

    async def _known_to_oracle(self, row: dict[str, Any]) -> str | None:
        """Ask the oracle (checking and adding in one step) whether it already holds this text.

        Returns the id of the document it duplicates, or None to store it. The oracle is advisory:
        when it cannot answer, the page is stored and the error counted. A match with this page's own
        id (it was added before a crash kept it from being stored) does not count as a duplicate.
        """
        assert self._oracle is not None
        try:
            [verdict] = await self._oracle.add([(row["id"], row["text"])])
        except OracleError as exc:
            self._dedup_counts["errors"] += 1
            self._error(f"{row['final_url']}: dedup service: {exc}")
            return None
        self._dedup_counts["checked"] += 1
        others = [i for i in verdict.duplicate_of if i != row["id"]]
        if verdict.new or not others:
            return None
        self._dedup_counts["duplicates"] += 1
        return others[0]

    # -- partitions --------------------------------------------------------------------------------
    def _exchange(self) -> bool:
        """Hand links to the partitions owning their hosts, and admit those handed to this one.

        Returns whether any arrived. A received file is deleted only after its links are admitted and
        this partition has reported itself busy, so the coordinator never sees it gone while we look idle.
        """
        assert self.exchange is not None
        while rows := self.frontier.outbox():
            by_destination: dict[int, list[Link]] = {}
            for _id, destination, *link in rows:
                by_destination.setdefault(destination, []).append(Link(*link))
            for destination, links in by_destination.items():
                self.exchange.post(destination, links, rows[-1][0])
            self.frontier.handed_over(rows[-1][0])
        files = self.exchange.received()
        if not files:
            return False
        with self.frontier.transaction():
            for path in files:
                for link in Exchange.read(path):
                    if isinstance(link, ExchangeError):
                        self._error(str(link))
                        continue
                    try:
                        url = normalize_url(link.url)
                    except BadURL as exc:
                        self._error(f"{path}: {exc}")
                        continue
                    if not link.scoped and link.depth == 0:
                        self._scope.add(host_of(url))  # a seed's redirect target: its host joins the scope
                    self._admit(url, link.depth, link.kind, link.via, link.hops, link.scoped)
        self._report(idle=False)
        for path in files:
            os.remove(path)
        return True

    def _report(self, idle: bool) -> None:
        """Tell the coordinator whether this partition is idle; every busy report is a new epoch, and an
        idle one is renewed every half second (a heartbeat: a dead partition's status goes stale)."""
        assert self.partition is not None
        now = time.time()
        if idle and self._reported_idle and now - self._reported_at < 0.5:
            return
        self._epoch += not idle
        self._reported_idle, self._reported_at = idle, now
        write_json(self.partition.status, {"idle": idle, "epoch": f"{os.getpid()}:{self._epoch}", "at": now})

    async def _idle(self) -> bool:
        """Nothing queued: pass links on, and wait for links from the other partitions until
        the coordinator says every partition is idle and no link is on its way (False: stop)."""
        assert self.partition is not None
        while not self._stopping and not self._limit_reached():
            self._exchange()
            if self.scheduler.next_due is not None or self._tasks:
                return True
            self._report(idle=True)
            if os.path.exists(self.partition.done):
                return False
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), 0.1)
            except asyncio.TimeoutError:
                pass
        return False

    # -- commit, progress, health --------------------------------------------------------------
    def _commit(self) -> None:
        """Write the pending results into a shard in a thread, while the crawl goes on; one at a time.

        The rows are already durable in the frontier, so nothing waits for the shard: while one is
        being written, the next commit starts with the first page that finds the previous one done.
        """
        if self.exchange is not None:
            self._exchange()
        if self._committing is not None and not self._committing.done():
            return
        self._pending_results = 0
        self._committing = asyncio.ensure_future(asyncio.to_thread(self.committer.flush, self._stats()))
        self._committing.add_done_callback(self._committed)

    def _committed(self, future: asyncio.Future[int]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._error(f"commit failed, its rows wait for the next one: {future.exception()!r}")

    async def _committer_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.commit_interval)
            if self._pending_results or self.exchange is not None:
                self._commit()

    async def _progress_loop(self, started: float) -> None:
        last_time, last_fetched = time.monotonic(), 0
        while True:
            await asyncio.sleep(self.config.progress_interval)
            now = time.monotonic()
            report = self._progress(now - started, (self._fetched - last_fetched) / max(now - last_time, 1e-9))
            last_time, last_fetched = now, self._fetched
            log.info("%.0fs: %.1f pages/s, %d pages, %.1f MB, queue %d, statuses %s, slowest hosts %s",
                     report["elapsed_s"], report["pages_per_s"], report["fetched"], report["bytes"] / 1e6,
                     report["queued"], report["status_counts"], report["slowest_hosts"])
            if self.on_progress is not None:
                self.on_progress(report)

    def _progress(self, elapsed: float, rate: float) -> dict[str, Any]:
        slowest = sorted(self.scheduler.hosts.values(), key=lambda h: (h.delay, h.failures), reverse=True)[:5]
        return {"elapsed_s": elapsed, "pages_per_s": rate, "fetched": self._fetched, "bytes": self._bytes,
                "requests": self._requests, "queued": self.frontier.queued_count(),
                "status_counts": dict(self._status), "in_flight": self._inflight,
                "slowest_hosts": {h.origin: {"delay_s": round(self.scheduler.delay(h), 3), "failures": h.failures}
                                  for h in slowest}}

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

    def _outcomes(self) -> tuple[dict[str, int], dict[str, str]]:
        """Every admitted URL (all runs) counted by outcome kind, and one outcome with a reason per kind."""
        counted = self.frontier.outcome_counts()
        return ({kind: count for kind, (count, _example) in counted.items()},
                {kind: example for kind, (_count, example) in counted.items() if example is not None})

    def _stats(self) -> dict[str, Any]:
        return {"crawl": {"documents": self._documents, "outcomes": self._outcomes()[0],
                          "parked_hosts": self.frontier.parked_hosts()}}

    def _summary(self, elapsed: float) -> CrawlSummary:
        outcomes, examples = self._outcomes()
        return CrawlSummary(
            output=self.output, documents=self._documents, fetched_this_run=self._fetched,
            requests=self._requests, bytes=self._bytes, elapsed_s=elapsed,
            pages_per_s=self._fetched / elapsed if elapsed > 0 else 0.0, status_counts=dict(self._status),
            outcomes=outcomes, outcome_examples=examples, queued=self.frontier.queued_count(),
            parked_hosts=self.frontier.parked_hosts(),
            hosts={h.origin: {"requests": h.requests, "failures": h.failures, "delay_s": round(self.scheduler.delay(h), 3),
                              "parked": h.parked} for h in self.scheduler.hosts.values()},
            proxies=self.proxies.health(), errors=list(self._errors), dedup_service=dict(self._dedup_counts))


def crawl(seeds: list[str], output: str, config: CrawlConfig | None = None, *,
          on_progress: Callable[[dict[str, Any]], None] | None = None, oracle: DuplicateOracle | None = None,
          launcher: PartitionLauncher | None = None, **options: Any) -> CrawlSummary:
    """Crawl ``seeds`` (page or sitemap URLs) into the corpus folder ``output``; re-running resumes.

    Options are :class:`CrawlConfig` fields, e.g. ``crawl(seeds, "out", allow_networks=["127.0.0.0/8"])``.
    With an ``oracle`` (:mod:`crawlers.oracle`), pages whose text it already holds are not stored.
    SIGINT and SIGTERM stop the crawl gracefully (in-flight pages finish, results are committed; a
    second signal cancels the pages in flight). After SIGTERM the summary is returned; after SIGINT
    (Ctrl-C) :class:`KeyboardInterrupt` is raised once everything is committed, as Python code
    expects of Ctrl-C, and the crawl resumes when run again.
    With ``partitions=K`` (K > 1) the crawl runs as K partitions (:mod:`crawlers.partitioned`), local
    processes unless a ``launcher`` runs them elsewhere (``gristmill crawl --ray-address``: Ray
    actors); ``on_progress`` is then not called (each partition logs its own progress).
    """
    cfg = config or CrawlConfig(**options)
    check_output_folder(output, cfg.storage_options)  # before any state is made
    check_partitions(state_root(output, cfg.state_dir), cfg.partitions)
    if cfg.partitions > 1:
        merged, received = Coordinator(seeds, output, cfg, oracle, launcher).run()
        summary = CrawlSummary(**merged)
    else:
        summary, received = run_until_signalled(Crawler(seeds, output, cfg, on_progress, oracle))
    if signal.SIGINT in received:
        log.warning("interrupted: %d documents stored in %s so far, %d URLs still queued; everything "
                    "finished is committed", summary.documents, output, summary.queued)
        raise KeyboardInterrupt
    if received:
        summary.stopped_by = received[0].name
    return summary


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
