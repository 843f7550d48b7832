"""One HTTP exchange with every guard a hostile host calls for.

Why hand-rolled decompression: aiohttp's own decoder has no output limit, so a 10 KB gzip bomb could
inflate to gigabytes before any size check ran. Bodies are read as raw bytes, capped while streaming,
and inflated through zlib with an output limit.
"""

from __future__ import annotations

import asyncio
import email.utils
import socket
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import aiohttp
from multidict import CIMultiDict

from .safety import AddressPolicy, GuardedResolver, blocked_cause
from .sniff import binary_type, is_generic

HTML_TYPES = ("text/html", "application/xhtml+xml")
SITEMAP_TYPES = ("application/xml", "text/xml", "application/gzip", "application/x-gzip", "text/plain",
                 "application/octet-stream", "application/rss+xml", "application/atom+xml")
CHUNK = 64 * 1024


class FetchError(Exception):
    """A fetch that produced no usable response; ``retryable`` says whether trying again may help."""

    retryable = False
    kind = "error"


class TransientError(FetchError):
    """Connection refused or reset, timeouts, truncated bodies: worth a retry with backoff."""

    retryable = True
    kind = "network"


class RejectedResponse(FetchError):
    """The response broke a guard (size, gzip bomb, content type, encoding): never retried."""

    kind = "rejected"


class BlockedError(FetchError):
    """The address is not allowed by the :class:`AddressPolicy`."""

    kind = "blocked"


class UnresolvableHost(FetchError):
    """DNS has no address for the host: a wrong name, or one only ``--resolve`` knows.

    Why not retried: a retried unresolvable seed host kept a crawl waiting three minutes before it
    said anything; its host is parked at once instead (``--retry-parked`` tries it again).
    """

    kind = "dns"


def unresolved_cause(exc: BaseException) -> socket.gaierror | None:
    """The resolver's failure behind an aiohttp connection error, if that is what it was."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, socket.gaierror):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__ or getattr(current, "os_error", None)
    return None


def unresolvable(url: str, host: str, cause: BaseException) -> UnresolvableHost:
    return UnresolvableHost(f"{url}: cannot resolve {host} ({cause}); check the name, or give its address with "
                            f"--resolve {host}=IP")


@dataclass
class Response:
    """A completed exchange: status, headers and the decoded (inflated) body."""

    url: str
    status: int
    headers: CIMultiDict[str]
    body: bytes
    elapsed: float
    request_headers: dict[str, str] = field(default_factory=dict)

    @property
    def content_type(self) -> str:
        return media_type(self.headers)

    @property
    def charset(self) -> str | None:
        for part in self.headers.get("Content-Type", "").split(";")[1:]:
            name, _, value = part.partition("=")
            if name.strip().lower() == "charset":
                return value.strip().strip("\"'") or None
        return None


def media_type(headers: Mapping[str, str]) -> str:
    """The Content-Type without parameters, lower case; "" when there is none."""
    return headers.get("Content-Type", "").split(";")[0].strip().lower()


@dataclass(frozen=True)
class FetchLimits:
    """Size and time limits for one exchange."""

    max_body_bytes: int = 10 * 1024 * 1024
    max_decompressed_bytes: int = 40 * 1024 * 1024
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    total_timeout: float = 60.0


class _Inflater:
    """Streaming gzip/deflate decoder that refuses to produce more than ``cap`` bytes (with
    ``truncate``: stops there, ``full``), and refuses a stream that stops before its end."""

    def __init__(self, encoding: str, cap: int, url: str, truncate: bool = False) -> None:
        self.cap = cap
        self.url = url
        self.truncate = truncate
        self.full = False
        self.fed = 0
        self.out = bytearray()
        self._raw_deflate = False
        if encoding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS)
            self._raw_deflate = True  # some servers send raw deflate; switch on the first error
        else:
            raise RejectedResponse(f"{url}: unsupported Content-Encoding {encoding!r}")

    def feed(self, data: bytes) -> None:
        self.fed += len(data)
        try:
            while data:
                piece = self._decoder.decompress(data, self.cap + 1 - len(self.out))
                self.out += piece
                self._raw_deflate = False
                if len(self.out) > self.cap and self.truncate:
                    del self.out[self.cap:]
                    self.full = True
                    return
                if len(self.out) > self.cap:
                    raise RejectedResponse(f"{self.url}: decompressed body exceeds {self.cap} bytes "
                                           "(compression bomb?)")
                data = self._decoder.unconsumed_tail
        except zlib.error as exc:
            if self._raw_deflate and not self.out:
                self._raw_deflate = False
                self._decoder = zlib.decompressobj(-zlib.MAX_WBITS)
                self.feed(data)
                return
            raise RejectedResponse(f"{self.url}: corrupt compressed body ({exc})") from None

    def finish(self) -> bytes:
        """The inflated body; a stream cut before its end (a gzip body cut in half behind a matching
        Content-Length) is a truncated body, never a complete page."""
        if self.fed and not self.full and not self._decoder.eof:
            raise TransientError(f"{self.url}: truncated body (the compressed stream stops before its end)")
        return bytes(self.out)


class Fetcher:
    """Owns the aiohttp session; ``fetch`` performs one request without following redirects."""

    def __init__(self, user_agent: str, limits: FetchLimits, policy: AddressPolicy,
                 host_map: dict[str, str] | None = None, max_connections: int = 256) -> None:
        self.user_agent = user_agent
        self.limits = limits
        self.policy = policy
        self.resolver = GuardedResolver(policy, host_map)
        connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, resolver=self.resolver,
                                         ttl_dns_cache=300, enable_cleanup_closed=True)
        self.session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=limits.total_timeout, connect=limits.connect_timeout,
                                          sock_read=limits.read_timeout))

    async def close(self) -> None:
        await self.session.close()

    async def check_target(self, url: str, proxied: bool) -> None:
        """Refuse forbidden IP literals always, and forbidden names when a proxy will resolve them."""
        host = urlsplit(url).hostname or ""
        try:
            self.policy.check_literal(host)
            if proxied:
                await self.resolver.resolve(host)
        except OSError as exc:
            blocked = blocked_cause(exc)
            if blocked is not None:
                raise BlockedError(f"{url}: {blocked}") from None
            if isinstance(exc, socket.gaierror):
                raise unresolvable(url, host, exc) from None
            raise TransientError(f"{url}: cannot resolve {host} ({exc})") from None

    async def fetch(self, url: str, accept: tuple[str, ...] = HTML_TYPES, proxy: str | None = None,
                    truncate: bool = False, max_bytes: int | None = None) -> Response:
        """GET ``url`` once; ``accept=()`` takes any Content-Type, ``truncate`` keeps the first
        ``max_bytes`` (default ``max_body_bytes``; also of the inflated body) instead of rejecting a
        longer body.

        With ``accept``, a 2xx body must also look like one of those types: a missing or generic
        Content-Type is judged by sniffing the body, and a body that is evidently some other
        binary type is refused whatever the header says.
        """
        await self.check_target(url, proxy is not None)
        headers = {"User-Agent": self.user_agent, "Accept-Encoding": "gzip, deflate",
                   "Accept": ", ".join(accept) + ", */*;q=0.1" if accept else "*/*"}
        started = time.monotonic()
        try:
            async with self.session.get(url, headers=headers, allow_redirects=False, proxy=proxy) as resp:
                body = await self._read(resp, url, accept, truncate, max_bytes or self.limits.max_body_bytes)
                response = Response(url, resp.status, CIMultiDict(resp.headers), body,
                                    time.monotonic() - started, dict(resp.request_info.headers))
            if accept and 200 <= response.status < 300:
                _refuse_other_binary(response, accept)
            return response
        except FetchError:
            raise
        except asyncio.TimeoutError:
            raise TransientError(f"{url}: timed out after {time.monotonic() - started:.1f}s") from None
        except aiohttp.ClientPayloadError as exc:
            raise TransientError(f"{url}: truncated or malformed body ({exc})") from None
        except aiohttp.InvalidURL as exc:
            raise RejectedResponse(f"{url}: invalid URL ({exc})") from None
        except (aiohttp.ClientError, OSError) as exc:
            blocked = blocked_cause(exc)
            if blocked is not None:
                raise BlockedError(f"{url}: {blocked}") from None
            unresolved = unresolved_cause(exc)
            if unresolved is not None:
                raise unresolvable(url, urlsplit(url).hostname or "", unresolved) from None
            raise TransientError(f"{url}: {type(exc).__name__}: {exc}") from None

    async def _read(self, resp: aiohttp.ClientResponse, url: str, accept: tuple[str, ...],
                    truncate: bool, max_bytes: int) -> bytes:
        if not 200 <= resp.status < 300:  # error pages and redirects: a little body, for ban markers
            return await self._read_capped(resp, url, 64 * 1024, True)
        content_type = media_type(resp.headers)
        if accept and content_type not in accept and not is_generic(content_type):
            raise RejectedResponse(f"{url}: Content-Type {content_type!r} is not one of {', '.join(accept)}")
        declared = resp.content_length
        if declared is not None and declared > max_bytes and not truncate:
            raise RejectedResponse(f"{url}: Content-Length {declared} exceeds {max_bytes} bytes")
        return await self._read_capped(resp, url, max_bytes, truncate)

    async def _read_capped(self, resp: aiohttp.ClientResponse, url: str, cap: int, truncate: bool) -> bytes:
        encoding = resp.headers.get("Content-Encoding", "identity").strip().lower()
        inflater = None if encoding in ("", "identity") else _Inflater(
            encoding, min(cap, self.limits.max_decompressed_bytes) if truncate else self.limits.max_decompressed_bytes,
            url, truncate)
        raw = bytearray()
        async for chunk in resp.content.iter_chunked(CHUNK):
            room = cap - len(raw)
            if len(chunk) > room:
                if not truncate:
                    raise RejectedResponse(f"{url}: body exceeds {cap} bytes")
                chunk = chunk[:room]
            raw += chunk
            if inflater is not None:
                inflater.feed(bytes(chunk))
                if inflater.full:
                    break
            if len(raw) >= cap and truncate:
                if inflater is not None:
                    inflater.full = True  # cut here on purpose: the rest is not read
                break
        return inflater.finish() if inflater is not None else bytes(raw)


def _refuse_other_binary(response: Response, accept: tuple[str, ...]) -> None:
    """Raise :class:`RejectedResponse` if the body's bytes show a binary type ``accept`` lacks."""
    sniffed = binary_type(response.body, response.content_type, response.charset)
    if sniffed is not None and sniffed not in accept:
        declared = f"Content-Type {response.content_type!r}" if response.content_type else "no Content-Type"
        raise RejectedResponse(f"{response.url}: body looks like {sniffed} by its first bytes, not "
                               f"{', '.join(accept)} ({declared})")


def retry_after_seconds(value: str | None) -> float | None:
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
