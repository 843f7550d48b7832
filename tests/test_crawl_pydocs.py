"""A real site: the Python 3.11 documentation (Debian ``python3.11-doc``) served on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lxml.html
import pytest
from aiohttp import web
from test_crawl_support import ServerThread, Site, crawl_sites, documents, outcomes, serve

from gristmill.crawlers.urls import normalize_url

DOCS = Path("/usr/share/doc/python3.11/html")
pytestmark = [
    pytest.mark.timeout(150),
    pytest.mark.skipif(not (DOCS / "index.html").is_file(),
                       reason="needs Debian package python3.11-doc (make system-deps installs it)"),
]


@pytest.fixture
def servers() -> Iterator[ServerThread]:
    yield from serve()


def _linked_from_index(base: str) -> set[str]:
    """Every same-site page the index links to, read straight from the file (not by the crawler)."""
    tree = lxml.html.parse(str(DOCS / "index.html")).getroot()
    linked = set()
    for href in tree.xpath("//a/@href"):
        url = normalize_url(href, base + "/index.html")
        if url.startswith(base + "/") and (DOCS / url[len(base) + 1:]).is_file():
            linked.add(url)
    return linked


def test_crawl_reaches_every_page_linked_from_the_python_docs_index(servers: ServerThread, tmp_path: Path) -> None:
    site = Site("127.0.0.2", "docs.test")

    async def serve_file(request: web.Request) -> web.StreamResponse:
        target = (DOCS / request.path.lstrip("/")).resolve()
        if not target.is_file() or DOCS not in target.parents:  # no escaping the docs folder
            return web.Response(status=404, text="not found")
        return web.FileResponse(target)

    site.default = serve_file
    servers.start(site)
    expected = _linked_from_index(site.base)
    assert len(expected) >= 20  # the index links the tutorial, library reference, FAQs, ...
    summary = crawl_sites(tmp_path, [site.url("/index.html")], [site], extract=True, extract_workers=2,
                          max_depth=1, concurrency=16, per_host_concurrency=8)
    seen = outcomes(tmp_path)
    missing = sorted(url for url in expected if seen.get(url) not in ("ok", "empty: no main text"))
    assert not missing, missing
    assert all(site.paths()[path] == 1 for path in site.paths())  # nothing fetched twice
    rows = {row["final_url"]: row for row in documents(tmp_path)}
    assert expected <= set(rows) | {u for u, o in seen.items() if o.startswith("empty")}
    tutorial = rows[site.url("/tutorial/index.html")]
    assert tutorial["language"] == "en" and "Python" in tutorial["text"]
    assert summary.documents == len(rows)
