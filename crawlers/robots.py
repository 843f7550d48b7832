"""robots.txt as RFC 9309 says, cached per origin with expiry.

2xx: parse the first ``ROBOTS_MAX_BYTES`` (RFC 9309's 500 KiB; the rest is ignored, as the RFC allows),
off the event loop, so a huge or slow-to-parse file stalls no other host;
3xx: follow up to five hops; 4xx: no restrictions; 429, 5xx or unreachable: assume complete
disallow and ask again after a short time (the crawler defers that host's URLs meanwhile).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urljoin

from protego import Protego

from .fetch import BlockedError, Fetcher, FetchError, UnresolvableHost
from .urls import BadURL, normalize_url

MAX_ROBOTS_REDIRECTS = 5
ROBOTS_MAX_BYTES = 500 * 1024  # RFC 9309 2.5: parsers must accept at least 500 KiB


@dataclass
class Robots:
    """The rules of one origin. ``unavailable`` means the RFC's complete disallow after 5xx/errors."""

    origin: str
    expires: float
    parser: Protego | None = None
    unavailable: str | None = None
    blocked: str | None = None
    unresolved: str | None = None  # DNS has no address for the host: park it, do not retry
    sitemaps: list[str] = field(default_factory=list)

    def allowed(self, url: str, agent: str) -> bool:
        if self.unavailable is not None:
            return False
        return self.parser is None or self.parser.can_fetch(url, agent)

    def crawl_delay(self, agent: str) -> float | None:
        if self.parser is None:
            return None
        delay = self.parser.crawl_delay(agent)
        return float(delay) if delay is not None else None


async def fetch_robots(fetcher: Fetcher, origin: str, agent: str, ttl: float, error_ttl: float,
                       proxy: str | None = None,
                       observe: Callable[[int | None, bytes], bool] | None = None) -> tuple[Robots, list[float]]:
    """Fetch and parse ``origin``/robots.txt; also returns each request's latency (for politeness).

    ``observe(status or None, body)`` sees every exchange (the proxy pool learns from it); when it
    answers True the answer was a ban page, which says nothing about the rules: try again later.
    """
    observe = observe or (lambda status, body: False)
    url = origin + "/robots.txt"
    latencies: list[float] = []
    for _ in range(MAX_ROBOTS_REDIRECTS + 1):
        try:
            response = await fetcher.fetch(url, accept=(), proxy=proxy, truncate=True, max_bytes=ROBOTS_MAX_BYTES)
        except BlockedError as exc:
            return Robots(origin, time.monotonic() + ttl, unavailable=str(exc), blocked=str(exc)), latencies
        except UnresolvableHost as exc:
            return Robots(origin, time.monotonic() + ttl, unavailable=str(exc), unresolved=str(exc)), latencies
        except FetchError as exc:
            observe(None, b"")
            return Robots(origin, time.monotonic() + error_ttl, unavailable=str(exc)), latencies
        latencies.append(response.elapsed)
        if observe(response.status, response.body):
            return Robots(origin, time.monotonic() + error_ttl,
                          unavailable=f"{url}: answered {response.status} with a ban signal"), latencies
        status = response.status
        if 300 <= status < 400 and "Location" in response.headers:
            try:
                url = normalize_url(urljoin(url, response.headers["Location"]))
            except BadURL:
                break
            continue
        if 200 <= status < 300:
            text = response.body[:ROBOTS_MAX_BYTES].decode("utf-8", errors="replace")
            parser = await asyncio.to_thread(Protego.parse, text)
            return Robots(origin, time.monotonic() + ttl, parser, sitemaps=list(parser.sitemaps)), latencies
        if status == 429 or status >= 500:
            return Robots(origin, time.monotonic() + error_ttl,
                          unavailable=f"{url}: robots.txt answered {status}"), latencies
        return Robots(origin, time.monotonic() + ttl), latencies  # 4xx: unavailable, so no restrictions
    return Robots(origin, time.monotonic() + ttl), latencies  # RFC 9309: too many redirects counts as 4xx
