"""Serve the demo sites on loopback: one aiohttp server per site, each on its own 127.0.0.1 port.

Why one port per site: the crawler keys politeness, robots.txt and the ``domain`` column on the
host, so each site must be its own origin. With ``host_names=True`` (the default) the base URLs use
the sites' reserved ``.test`` names (``http://lindenpost.test:PORT/``), which the crawler reaches
through its static host map (``DemoSite.host_map``) and which make the statistics read like a real
crawl's; with ``host_names=False`` they are plain ``http://127.0.0.1:PORT/`` URLs. Only 127.0.0.1 is
ever bound.

Run ``python -m gristmill.pipeline.demo.site.server`` to browse the sites by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web

from gristmill.pipeline.demo.site.content import SITE_HOSTS, Page, build_sites

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Hit:
    """One request the demo sites answered: which site, which path, which status."""

    host: str
    path: str
    status: int


@dataclass
class DemoSite:
    """The five demo sites, served from a background thread (so synchronous code can crawl them).

    Use as a context manager, or call :meth:`start` and :meth:`stop`. ``hits`` records every request.
    """

    host_names: bool = True
    bases: dict[str, str] = field(default_factory=dict)
    sites: dict[str, dict[str, Page]] = field(default_factory=dict)
    hits: list[Hit] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runners: list[web.AppRunner] = []

    # -- what a crawler needs ----------------------------------------------------------------------
    @property
    def seeds(self) -> list[str]:
        """The home page of every site (a crawler that stays on its seeds' hosts still finds all pages)."""
        return [self.bases[host] + "/" for host in SITE_HOSTS]

    @property
    def host_map(self) -> dict[str, str]:
        """Host name -> address, for the crawler's resolver (empty when the URLs are IP literals)."""
        return {host: LOOPBACK for host in SITE_HOSTS} if self.host_names else {}

    def url(self, host: str, path: str) -> str:
        return self.bases[host] + path

    def pages(self) -> Iterator[tuple[str, Page]]:
        """Every page as (absolute URL, page), the ground truth for tests and the demo's summary."""
        for host, pages in self.sites.items():
            for path, page in pages.items():
                yield self.bases[host] + path, page

    # -- serving -----------------------------------------------------------------------------------
    def _handler(self, host: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def handle(request: web.Request) -> web.StreamResponse:
            page = self.sites[host].get(request.path)
            if page is None:
                self.hits.append(Hit(host, request.path, 404))
                return web.Response(status=404, text="Not found", content_type="text/plain")
            self.hits.append(Hit(host, request.path, 200))
            content_type, _, charset = page.content_type.partition("; charset=")
            return web.Response(text=page.body, content_type=content_type, charset=charset or None)

        return handle

    async def _start_async(self) -> None:
        ports: dict[str, int] = {}
        for host in SITE_HOSTS:
            app = web.Application()
            app.router.add_route("GET", "/{tail:.*}", self._handler(host))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, LOOPBACK, 0)
            await site.start()
            self._runners.append(runner)
            ports[host] = runner.addresses[0][1]
        self.bases = {host: f"http://{host if self.host_names else LOOPBACK}:{port}" for host, port in ports.items()}
        self.sites = build_sites(self.bases)

    async def _stop_async(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    def start(self) -> DemoSite:
        """Bind the five ports and start serving in a daemon thread; returns once they accept."""
        if self._thread is not None:
            raise RuntimeError("demo site already started")
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._start_async())
            except BaseException as exc:  # reported to the starting thread below
                failure.append(exc)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(self._stop_async())
            self._loop.close()

        self._thread = threading.Thread(target=serve, name="gristmill-demo-site", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self

    def stop(self) -> None:
        """Stop serving and release the ports."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._thread = None

    def __enter__(self) -> DemoSite:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def serving(host_names: bool = True) -> Iterator[DemoSite]:
    """``with serving() as site:`` - the demo sites for the duration of the block."""
    site = DemoSite(host_names=host_names).start()
    try:
        yield site
    finally:
        site.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve gristmill's demo sites on 127.0.0.1 until Ctrl-C.")
    parser.add_argument("--ip-urls", action="store_true",
                        help="print http://127.0.0.1:PORT URLs instead of the sites' .test host names")
    args = parser.parse_args(argv)
    with serving(host_names=not args.ip_urls) as site:
        for host, base in site.bases.items():
            print(f"{host:24} {base}/  ({len(site.sites[host])} pages)")
        if not args.ip_urls:
            print("The .test names resolve only through the crawler's host map; a browser needs --ip-urls.")
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
