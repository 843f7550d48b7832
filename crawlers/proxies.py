"""A proxy pool routed per host pattern or per region, with health checks, ban detection and rotation.

Why per region: a page looks different from another country (language, prices, consent walls), so
a German site can be sent through a German exit with ``routes={"*.de": "de"}``. A proxy that fails
to connect is benched for ``cooldown`` seconds (and probed by the health check); one that a host
answers with repeated 403/429 or a captcha page is banned for that host only, and the next healthy
proxy of its group takes over.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

CAPTCHA_MARKERS = re.compile(
    rb"captcha|cf-chl-|challenge-platform|are you a robot|unusual traffic|access denied", re.IGNORECASE)
BAN_STATUSES = frozenset({403, 429})


@dataclass(frozen=True)
class ProxySpec:
    """One proxy: its URL, an optional region (``"de"``) and host glob patterns routed to it."""

    url: str
    region: str | None = None
    hosts: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> ProxySpec:
        """``URL[,region=de][,hosts=*.example.com|*.example.org]`` (the command-line form)."""
        url, *options = [part.strip() for part in text.split(",")]
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"proxy {text!r}: the URL must be http://HOST:PORT or https://HOST:PORT")
        values = dict(option.split("=", 1) for option in options if "=" in option)
        hosts = tuple(h for h in values.get("hosts", "").split("|") if h)
        return cls(url, values.get("region") or None, hosts)


@dataclass
class _ProxyState:
    spec: ProxySpec
    failures: int = 0
    benched_until: float = 0.0
    bans: dict[str, float] = field(default_factory=dict)
    strikes: Counter[str] = field(default_factory=Counter)
    requests: int = 0


class NoProxyAvailable(Exception):
    """Every proxy routed to a host is benched or banned for it right now."""


class ProxyPool:
    """Chooses a proxy per request and learns from the outcome."""

    def __init__(self, proxies: Iterable[ProxySpec], routes: Mapping[str, str] | None = None,
                 ban_after: int = 3, fail_after: int = 3, cooldown: float = 300.0) -> None:
        self._states = [_ProxyState(spec) for spec in proxies]
        self.routes = dict(routes or {})
        self.ban_after = ban_after
        self.fail_after = fail_after
        self.cooldown = cooldown
        self._turn: Counter[str] = Counter()

    def __bool__(self) -> bool:
        return bool(self._states)

    def group(self, host: str) -> tuple[str, list[_ProxyState]]:
        """The proxies a host may use: those naming it, else its region's, else the unrouted ones."""
        named = [s for s in self._states if any(fnmatch.fnmatch(host, p) for p in s.spec.hosts)]
        if named:
            return "hosts", named
        for pattern, region in self.routes.items():
            if fnmatch.fnmatch(host, pattern):
                return f"region {region}", [s for s in self._states if s.spec.region == region]
        return "default", [s for s in self._states if not s.spec.hosts and s.spec.region is None]

    def choose(self, host: str) -> str | None:
        """A proxy URL for ``host`` (round robin over usable ones), or None when no proxies are set."""
        if not self._states:
            return None
        name, group = self.group(host)
        now = time.monotonic()
        usable = [s for s in group if s.benched_until <= now and s.bans.get(host, 0.0) <= now]
        if not usable:
            raise NoProxyAvailable(f"no usable proxy for {host} ({name}: {len(group)} configured, "
                                   "all benched or banned)")
        state = usable[self._turn[f"{name}/{host}"] % len(usable)]
        self._turn[f"{name}/{host}"] += 1
        state.requests += 1
        return state.spec.url

    def _state(self, url: str) -> _ProxyState:
        return next(s for s in self._states if s.spec.url == url)

    def report(self, url: str | None, host: str, status: int | None, body: bytes = b"") -> bool:
        """Learn from one exchange (``status`` None = connection failure); True if it looked like a ban."""
        if url is None:
            return False
        state = self._state(url)
        if status is None:
            state.failures += 1
            if state.failures >= self.fail_after:
                state.benched_until = time.monotonic() + self.cooldown
            return False
        state.failures = 0
        banned = status in BAN_STATUSES or bool(CAPTCHA_MARKERS.search(body[:65536]))
        if not banned:
            state.strikes[host] = 0
            return False
        state.strikes[host] += 1
        if state.strikes[host] >= self.ban_after:
            state.bans[host] = time.monotonic() + self.cooldown
            state.strikes[host] = 0
        return True

    def health(self) -> list[dict[str, object]]:
        """Per-proxy counters for progress reports and the summary."""
        now = time.monotonic()
        return [{"proxy": s.spec.url, "region": s.spec.region, "requests": s.requests,
                 "benched": s.benched_until > now, "banned_for": sorted(h for h, t in s.bans.items() if t > now)}
                for s in self._states]

    def benched(self) -> list[str]:
        now = time.monotonic()
        return [s.spec.url for s in self._states if s.benched_until > now]

    def restore(self, url: str) -> None:
        """A health check got through: put the proxy back in rotation."""
        state = self._state(url)
        state.failures = 0
        state.benched_until = 0.0
