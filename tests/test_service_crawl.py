"""``gristmill crawl --dedup-service``: a real crawl of a loopback site against a real ``gristmill serve``."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from aiohttp import web
from test_service import start_server, text, variant

from gristmill.pipeline.cli import main
from gristmill.pipeline.format import Corpus
from gristmill.pipeline.service.client import DedupClient

PAGES = {
    "/a": text(500),
    "/b": variant(text(500), 2),  # near copy of /a
    "/c": text(500),  # exact copy of /a
    "/d": text(501),  # the service has it before the crawl starts
    "/e": text(502),
}


def _html(body: str, links: list[str] = ()) -> str:  # type: ignore[assignment]
    anchors = "".join(f'<a href="{link}"></a>' for link in links)
    return f"<html><head><title>t</title></head><body><p>{body}</p>{anchors}</body></html>"


@pytest.fixture()
def site() -> Iterator[str]:
    """A five-page site plus an index page on 127.0.0.1, served from a thread."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    pages = {"/": _html("the index page", list(PAGES)), **{path: _html(body) for path, body in PAGES.items()}}

    async def page(request: web.Request) -> web.Response:
        return web.Response(text=pages[request.path], content_type="text/html")

    for path in pages:
        app.router.add_get(path, page)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


@pytest.mark.timeout(120)
def test_crawl_skips_what_the_service_already_has(site: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    server = start_server(tmp_path / "state")
    try:
        DedupClient(server.url).add([("known-d", PAGES["/d"])])
        seeds = tmp_path / "seeds.txt"
        seeds.write_text(f"{site}/\n")
        out = tmp_path / "corpus"
        status = main(["crawl", str(seeds), "-o", str(out), "--no-extract", "--no-robots", "--delay", "0",
                       "--allow-network", "127.0.0.0/8", "--quiet", "--json", "--dedup-service", server.url])
        assert status == 0
        summary = json.loads(capsys.readouterr().out)
        stats = DedupClient(server.url).stats()
    finally:
        server.stop()

    # /a, /b, /c are one document three times; /d was known: three pages skipped, three stored
    assert summary["dedup_service"] == {"checked": 6, "duplicates": 3}
    assert summary["outcomes"]["duplicate"] == 3 and summary["documents"] == 3
    stored = sorted(urlsplit(u).path for u in Corpus.open(str(out)).to_table(["url"])["url"].to_pylist())
    assert len(stored) == 3 and stored[0] == "/" and stored[2] == "/e" and stored[1] in ("/a", "/b", "/c")
    # the service now holds what the crawl stored, so a second crawler would skip those too
    assert stats["added"] == 1 + 3 and stats["exact_duplicates"] + stats["near_duplicates"] == 3


@pytest.mark.timeout(120)
def test_crawl_stores_pages_when_the_service_is_down(site: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(f"{site}/\n")
    status = main(["crawl", str(seeds), "-o", str(tmp_path / "corpus"), "--no-extract", "--no-robots",
                   "--delay", "0", "--allow-network", "127.0.0.0/8", "--quiet", "--json", "--dedup-service", dead])
    assert status == 0
    summary = json.loads(capsys.readouterr().out)
    # the service is advisory: every page is stored (the exact copy too), and each failure is counted
    assert summary["documents"] == 6 and summary["dedup_service"] == {"errors": 6}
    assert any(dead in error for error in summary["errors"])
