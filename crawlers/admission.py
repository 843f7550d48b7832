"""Admission: which URLs a crawl takes into its frontier, and under what limits.

Why apart from the fetch loop: every URL a crawl learns of (a seed, a link on a page, a redirect's
target, a sitemap entry, a link another partition hands over) meets the same rules (normalised, in
scope, under the trap limits, sent to the partition that owns its host), and this object is where
they are: the fetch loop only says what it found.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from . import sitemaps
from .config import CrawlConfig
from .frontier import KIND_PAGE, KIND_SITEMAP, Frontier
from .partitions import Link, Partition
from .schedule import HostScheduler
from .urls import BadURL, normalize_url, origin_of, site_of


class Admission:
    """Admits URLs into ``frontier`` and hands each admitted one to ``scheduler``; ``scope`` holds the
    sites of the seeds (and of their redirect targets) that ``follow="same-host"`` keeps to."""

    def __init__(self, config: CrawlConfig, frontier: Frontier, scheduler: HostScheduler,
                 partition: Partition | None, on_error: Callable[[str], None]) -> None:
        self.config = config
        self.frontier = frontier
        self.scheduler = scheduler
        self.partition = partition
        self.on_error = on_error
        self.scope: set[str] = set()

    def enqueue(self, urls: Iterable[str], depth: int = 0) -> int:
        """Admit more URLs (seed-like: in scope, under the trap limits); returns how many were new."""
        added = 0
        with self.frontier.transaction():
            for url in self._scoped_seeds(urls):
                added += self.admit(url, depth) is None
        return added

    def _scoped_seeds(self, urls: Iterable[str]) -> Iterable[str]:
        """Seed URLs normalised, their sites put in scope; a malformed one, or one longer than
        ``max_url_length`` (the limit every discovered URL meets), is recorded as an error."""
        for raw in urls:
            try:
                url = normalize_url(raw)
            except BadURL as exc:
                self.on_error(f"seed {exc}")
                continue
            if len(url) > self.config.max_url_length:
                self.on_error(f"seed {url[:80]!r}...: {len(url)} characters, over max_url_length "
                              f"({self.config.max_url_length})")
                continue
            self.scope.add(site_of(url))
            yield url

    def _owns(self, url: str) -> bool:
        return self.partition is None or self.partition.owner(url) == self.partition.index

    def admit_seeds(self, seeds: Iterable[str]) -> None:
        """The crawl's seeds (this partition's share), and the scope of every seed the frontier holds."""
        with self.frontier.transaction():
            for url in self._scoped_seeds(seeds):
                if not self._owns(url):
                    continue  # every partition gets every seed: all seed hosts are in everyone's scope
                kind = KIND_SITEMAP if sitemaps.looks_like_sitemap(url) else KIND_PAGE
                self.frontier.add(url, origin_of(url), 0, kind)
        for row in self.frontier.db.execute("SELECT DISTINCT url FROM urls WHERE depth = 0"):
            self.scope.add(site_of(row[0]))

    def admit(self, url: str, depth: int, kind: int = KIND_PAGE, via: str | None = None, hops: int = 0,
              scoped: bool = True) -> str | None:
        """Add a discovered URL under the trap limits; returns why it was refused, or None."""
        cfg = self.config
        if self.frontier.recently_seen(url):
            return "seen"
        if len(url) > cfg.max_url_length:
            return "url too long"
        if depth > cfg.max_depth:
            return "too deep"
        if self.partition is not None and (owner := self.partition.owner(url)) != self.partition.index:
            self.frontier.send(owner, url, depth, kind, via, hops, scoped)  # the owner checks scope and seen
            return None
        if scoped and cfg.follow == "same-host" and site_of(url) not in self.scope:
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

    def admit_link(self, link: Link) -> None:
        """A link another partition found for a host of this one (inside the exchange's transaction)."""
        try:
            url = normalize_url(link.url)
        except BadURL as exc:
            self.on_error(f"link from partition exchange: {exc}")
            return
        if not link.scoped and link.depth == 0:
            self.scope.add(site_of(url))  # a seed's redirect target: its site joins the scope
        self.admit(url, link.depth, link.kind, link.via, link.hops, link.scoped)
