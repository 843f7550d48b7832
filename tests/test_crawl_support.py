"""Fault-injecting loopback web sites and a counting forward proxy for the crawler tests.

Each :class:`Site` is a real aiohttp server bound to one 127.x address (so several "hosts" coexist),
named through the crawler's ``host_map`` (``a.test`` -> 127.0.0.2). Every request is logged with its
arrival time, and the in-flight count is tracked, so tests assert politeness from the server side.
Servers run on their own event loop in a thread, so the crawler under test owns the main thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from gristmill.crawlers import crawl
from gristmill.crawlers.crawler import CrawlSummary
from gristmill.pipeline.format import Corpus

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OMIT_CONTENT_TYPE = web.ResponseKey("omit_content_type", bool)  # a response marked so has no Content-Type


async def _omit_content_type(_request: web.Request, response: web.StreamResponse) -> None:
    """aiohttp adds ``application/octet-stream`` to any body without a type; undo it when asked."""
    if response.get(OMIT_CONTENT_TYPE):
        response.headers.popall("Content-Type", None)


@dataclass
class Hit:
    time: float
    path: str
    host: str


@dataclass
class Site:
    """One loopback host: routes by path (with query), a request log, and peak concurrency."""

    ip: str = "127.0.0.1"
    name: str | None = None
    routes: dict[str, Handler] = field(default_factory=dict)
    hits: list[Hit] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0
    port: int = 0
    default: Handler | None = None

    @property
    def base(self) -> str:
        return f"http://{self.name or self.ip}:{self.port}"

    def url(self, path: str) -> str:
        return self.base + path

    def page(self, path: str, body: str | bytes = "", status: int = 200,
             content_type: str | None = "text/html; charset=utf-8", headers: dict[str, str] | None = None,
             delay: float = 0.0) -> None:
        """A fixed response (``delay`` seconds before the headers go out); ``content_type=None``
        sends no Content-Type header at all."""
        payload = body.encode("utf-8") if isinstance(body, str) else body

        async def handler(request: web.Request) -> web.StreamResponse:
            if delay:
                await asyncio.sleep(delay)
            response = web.Response(body=payload, status=status, headers=headers or {})
            if content_type is None:
                response[OMIT_CONTENT_TYPE] = True
            else:
                response.headers["Content-Type"] = content_type
            return response

        self.routes[path] = handler

    def article(self, path: str, title: str, links: list[str] = (), words: int = 120) -> None:  # type: ignore[assignment]
        """A realistic article page (enough prose for extraction) linking to ``links``."""
        prose = " ".join(f"{title} sentence number {i} explains how careful crawlers behave on the web."
                         for i in range(max(1, words // 10)))
        anchors = "".join(f'<li><a href="{link}">{link}</a></li>' for link in links)
        self.page(path, f"<html><head><title>{title}</title></head><body><nav><ul>{anchors}</ul></nav>"
                        f"<article><h1>{title}</h1><p>{prose}</p></article></body></html>")

    def paths(self) -> Counter[str]:
        return Counter(hit.path for hit in self.hits)

    def times(self, exclude_robots: bool = False) -> list[float]:
        return sorted(h.time for h in self.hits if not (exclude_robots and h.path == "/robots.txt"))

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        self.hits.append(Hit(time.monotonic(), request.path_qs, request.headers.get("Host", "")))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            handler = self.routes.get(request.path_qs) or self.routes.get(request.path) or self.default
            if handler is None:
                return web.Response(status=404, text="not found")
            return await handler(request)
        finally:
            self.in_flight -= 1


class ServerThread:
    """An event loop in a daemon thread that hosts any number of :class:`Site` servers."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._runners: list[web.AppRunner] = []
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def call(self, coroutine: Awaitable[object]) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)  # type: ignore[arg-type]

    def start(self, site: Site) -> Site:
        async def start() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", site._dispatch)
            app.on_response_prepare.append(_omit_content_type)
            runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
            await runner.setup()
            tcp = web.TCPSite(runner, site.ip, 0)
            await tcp.start()
            site.port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._runners.append(runner)

        self.call(start())
        return site

    def start_proxy(self, proxy: CountingProxy) -> CountingProxy:
        async def start() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", proxy.handle)
            app.on_cleanup.append(proxy.close)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            tcp = web.TCPSite(runner, "127.0.0.1", 0)
            await tcp.start()
            proxy.port = tcp._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self._runners.append(runner)

        self.call(start())
        return proxy

    def stop(self) -> None:
        async def stop() -> None:
            for runner in self._runners:
                await runner.cleanup()

        self.call(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)


@dataclass
class CountingProxy:
    """A plain-HTTP forward proxy on loopback that counts requests per target host.

    ``ban`` makes it answer 403 with a captcha page for those hosts (a banned exit); ``down`` makes
    it refuse everything with a dropped connection (a dead exit). Targets are reached through
    ``host_map`` so the proxy never resolves a name outside loopback.
    """

    host_map: dict[str, str]
    name: str = "proxy"
    counts: Counter[str] = field(default_factory=Counter)
    ban: set[str] = field(default_factory=set)
    down: bool = False
    port: int = 0
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        target = request.url
        host = target.host or ""
        if self.down:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=502)
        self.counts[host] += 1
        if host in self.ban:
            return web.Response(status=403, text="<html>Please solve this CAPTCHA</html>",
                                content_type="text/html")
        ip = self.host_map.get(host, host)
        assert ip.startswith("127."), f"proxy asked to leave loopback: {host}"
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        async with self._session.get(target.with_host(ip), headers={"Host": f"{host}:{target.port}"},
                                     allow_redirects=False) as upstream:
            body = await upstream.read()
            headers = {k: v for k, v in upstream.headers.items()
                       if k.lower() not in ("transfer-encoding", "content-length", "connection")}
            return web.Response(status=upstream.status, body=body, headers=headers)

    async def close(self, _app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()


def crawl_sites(out: object, seeds: list[str], sites: list[Site], **options: object) -> CrawlSummary:
    """Crawl loopback sites with test-sized limits (no delays, quick retries, loopback allowed)."""
    settings: dict[str, object] = dict(
        allow_networks=["127.0.0.0/8"], host_map={s.name: s.ip for s in sites if s.name}, min_delay=0.0,
        extract=False, backoff_base=0.05, connect_timeout=2.0, read_timeout=2.0, total_timeout=5.0,
        commit_interval=1.0, progress_interval=60.0, robots_error_ttl=0.2, max_retries=2)
    settings.update(options)
    return crawl(seeds, str(out), **settings)


def outcomes(out: object) -> dict[str, str]:
    """Every admitted URL and what happened to it, from the crawl's frontier."""
    with sqlite3.connect(f"{out}/.crawl/frontier.sqlite") as db:
        return {url: outcome or "queued" for url, outcome in db.execute("SELECT url, outcome FROM urls")}


def documents(out: object) -> list[dict[str, object]]:
    """The committed rows of a crawl's output corpus."""
    return Corpus.open(str(out)).to_table().to_pylist()


def serve() -> Iterator[ServerThread]:
    """Body of each test module's ``servers`` fixture: a server thread, stopped afterwards."""
    thread = ServerThread()
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture
def servers() -> Iterator[ServerThread]:
    yield from serve()


def test_support_site_answers_and_logs(servers: ServerThread) -> None:
    """The harness itself: a site serves its routes, 404s the rest, and logs both."""
    site = servers.start(Site("127.0.0.2"))
    site.page("/hello", "<p>hi</p>")
    site.page("/bare", b"\x00\x01", content_type=None)

    async def get(path: str) -> tuple[int, str, str | None]:
        async with aiohttp.ClientSession() as session, session.get(site.url(path)) as response:
            return response.status, await response.text("latin-1"), response.headers.get("Content-Type")

    assert asyncio.run(get("/hello")) == (200, "<p>hi</p>", "text/html; charset=utf-8")
    assert asyncio.run(get("/bare")) == (200, "\x00\x01", None)  # no type at all, not aiohttp's default
    assert asyncio.run(get("/nope"))[0] == 404
    assert site.paths() == Counter({"/hello": 1, "/bare": 1, "/nope": 1})
