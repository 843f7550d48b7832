"""Fetched pages put straight into a crawl's frontier, as the crawler stores them: for tests of what
happens after the fetch (commits, checkpoints, fencing) that need no web server."""

from __future__ import annotations

from gristmill.crawlers.frontier import Frontier


def store_pages(frontier: Frontier, first: int, count: int) -> None:
    """``count`` fetched pages (``http://a.test/<n>`` from ``first`` on) waiting in the frontier for a commit."""
    with frontier.transaction():
        for number in range(first, first + count):
            url = f"http://a.test/{number}"
            request = frontier.add(url, "http://a.test", 0)
            assert request is not None
            frontier.store_result(request, {
                "id": f"{number:032x}", "text": f"page {number}", "url": url, "final_url": url, "status": 200,
                "fetch_time": 1_700_000_000_000, "domain": "a.test", "language": "en",
                "content_hash": f"{number:032x}", "depth": 0, "encoding": "utf-8"})
            frontier.finish(request, "ok")
