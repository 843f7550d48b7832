"""The crawler against bodies that are larger or shorter than they say, from real aiohttp servers on
127.0.0.1: a compressed page cut short behind a matching Content-Length is a truncated fetch, never a
stored page; robots.txt is read up to RFC 9309's 500 KiB (the rest ignored) and parsed off the event
loop, so a large file stalls no other host."""

from __future__ import annotations

import asyncio
import gzip
import threading
import zlib
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_crawl_support import ServerThread, Site, crawl_sites, documents, outcomes, serve

from gristmill.crawlers import robots
from gristmill.crawlers.fetch import Fetcher, FetchLimits
from gristmill.crawlers.robots import ROBOTS_MAX_BYTES, fetch_robots
from gristmill.crawlers.safety import AddressPolicy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def servers() -> Iterator[ServerThread]:
    yield from serve()


def compressed(body: bytes, encoding: str) -> bytes:
    return gzip.compress(body) if encoding == "gzip" else zlib.compress(body)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(encoding=st.sampled_from(["gzip", "deflate"]), keep=st.floats(0.05, 0.95), words=st.integers(50, 3000))
def test_a_compressed_body_cut_short_is_never_stored(servers: ServerThread, tmp_path_factory: pytest.TempPathFactory,
                                                     encoding: str, keep: float, words: int) -> None:
    site = servers.start(Site("127.0.0.1"))
    page = ("<html><body><article><p>" + " ".join(f"word{i}" for i in range(words)) + "</p></article></body></html>")
    whole = compressed(page.encode(), encoding)
    cut = whole[: max(1, int(len(whole) * keep))]  # aiohttp sends Content-Length: len(cut), which matches
    site.page("/", '<html><body><a href="/cut">cut</a><a href="/whole">whole</a></body></html>')
    site.page("/cut", cut, headers={"Content-Encoding": encoding})
    site.page("/whole", whole, headers={"Content-Encoding": encoding})
    out = tmp_path_factory.mktemp("cut")
    crawl_sites(out, [site.url("/")], [site], max_retries=1)
    seen = outcomes(out)
    assert seen[site.url("/whole")] == "ok"
    assert "truncated body" in seen[site.url("/cut")]
    stored = {row["final_url"] for row in documents(out)}
    assert site.url("/cut") not in stored and site.url("/whole") in stored


def robots_of(site: Site, body: bytes, encoding: str | None = None) -> robots.Robots:
    site.page("/robots.txt", compressed(body, encoding) if encoding else body, content_type="text/plain",
              headers={"Content-Encoding": encoding} if encoding else None)

    async def run() -> robots.Robots:
        fetcher = Fetcher("test-bot", FetchLimits(), AddressPolicy(["127.0.0.0/8"]))
        try:
            return (await fetch_robots(fetcher, site.base, "test-bot", 60.0, 1.0))[0]
        finally:
            await fetcher.close()

    return asyncio.run(run())


@pytest.mark.parametrize("encoding", [None, "gzip"])
def test_robots_is_read_up_to_500_kib_and_the_rest_ignored(servers: ServerThread, encoding: str | None) -> None:
    site = servers.start(Site("127.0.0.1"))
    head = b"User-agent: *\nDisallow: /early\n"
    filler = b"# padding to push the next rule past 500 KiB\n" * (ROBOTS_MAX_BYTES // 40)
    rules = robots_of(site, head + filler + b"Disallow: /late\n" + filler * 40, encoding)  # ~20 MB in all
    assert rules.unavailable is None
    assert not rules.allowed(site.url("/early"), "test-bot")
    assert rules.allowed(site.url("/late"), "test-bot")  # beyond 500 KiB: ignored, as RFC 9309 allows


def test_robots_is_parsed_off_the_event_loop(servers: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parser waits for a tick of the event loop: it can only get one if it runs elsewhere."""
    site = servers.start(Site("127.0.0.1"))
    parsing, ticked = threading.Event(), threading.Event()
    parse = robots.Protego.parse

    def slow_parse(text: str) -> robots.Protego:
        parsing.set()
        ticked.wait(10)
        return parse(text)

    async def ticker() -> None:
        while True:
            await asyncio.sleep(0.01)
            if parsing.is_set():
                ticked.set()

    monkeypatch.setattr(robots.Protego, "parse", staticmethod(slow_parse))

    async def run() -> robots.Robots:
        fetcher = Fetcher("test-bot", FetchLimits(), AddressPolicy(["127.0.0.0/8"]))
        task = asyncio.create_task(ticker())
        try:
            return (await fetch_robots(fetcher, site.base, "test-bot", 60.0, 1.0))[0]
        finally:
            task.cancel()
            await fetcher.close()

    site.page("/robots.txt", b"User-agent: *\nDisallow: /no\n", content_type="text/plain")
    rules = asyncio.run(run())
    assert ticked.is_set()
    assert not rules.allowed(site.url("/no"), "test-bot")
