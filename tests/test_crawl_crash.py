"""SIGKILL at random moments, then resume: nothing lost, nothing committed fetched twice."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from test_crawl_support import ServerThread, Site, documents, serve

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]
PAGES = 60
KILLS = 4

RUNNER = """
import json, sys
from gristmill.crawlers import crawl
seeds, out, host_map = json.loads(sys.argv[1])
crawl(seeds, out, allow_networks=["127.0.0.0/8"], host_map=host_map, min_delay=0.0, extract=False,
      per_host_concurrency=3, adaptive=False, commit_every=5, commit_interval=0.3, progress_interval=60.0)
"""


@pytest.fixture
def servers() -> Iterator[ServerThread]:
    yield from serve()


def _done_urls(out: Path) -> set[str]:
    """URLs the frontier says are finished: their results are durable and must never be fetched again."""
    path = out / ".crawl" / "frontier.sqlite"
    if not path.exists():
        return set()
    with sqlite3.connect(path) as db:
        try:
            return {url for (url,) in db.execute("SELECT url FROM urls WHERE state = 1")}
        except sqlite3.OperationalError:  # killed before the schema was created
            return set()


def test_sigkill_at_random_moments_loses_nothing_and_refetches_nothing_committed(servers: ServerThread,
                                                                              tmp_path: Path) -> None:
    site = Site("127.0.0.2", "crash.test")

    async def page(request: web.Request) -> web.StreamResponse:
        number = int(request.path.strip("/p") or 0)
        await asyncio.sleep(0.03)
        links = "".join(f'<a href="/p{(number * 7 + k) % PAGES}">link</a>' for k in (1, 2, 3))
        return web.Response(text=f"<html><body><p>Page {number} of the crash test site.</p>{links}</body></html>",
                            content_type="text/html")

    site.default = page
    site.page("/robots.txt", "User-agent: *\nAllow: /\n", content_type="text/plain")
    servers.start(site)
    out = tmp_path / "out"
    argument = json.dumps([[site.url("/p0")], str(out), {site.name: site.ip}])
    command = [sys.executable, "-c", RUNNER, argument]
    rng = random.Random()
    frozen: dict[str, int] = {}  # URL -> server hits when the frontier first reported it finished
    interrupted = 0
    for _ in range(KILLS):
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # A random moment once the crawler is under way: after a random number of new requests, plus
        # a random fraction of a request (start-up time on a loaded machine varies too much for a clock).
        target = len(site.hits) + rng.randint(3, 15)
        deadline = time.monotonic() + 30
        while len(site.hits) < target and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.15))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait(30)
        done = _done_urls(out)
        interrupted += 0 < len(done) < PAGES
        counts = site.paths()
        for url in done:
            frozen.setdefault(url, counts["/" + url.split("/", 3)[3]])
    assert interrupted >= 2  # killed mid-crawl several times, with part of the work finished
    final = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)
    assert final.returncode == 0, final.stderr[-2000:]
    counts = site.paths()
    for url, count in frozen.items():
        assert counts["/" + url.split("/", 3)[3]] == count, f"{url} was fetched again after it was done"
    rows = documents(out)
    reachable = {site.url(f"/p{i}") for i in range(PAGES)}
    assert {row["final_url"] for row in rows} == reachable  # nothing lost
    assert len(rows) == len(reachable)  # and no page committed twice


def test_sigterm_stops_gracefully_and_commits(servers: ServerThread, tmp_path: Path) -> None:
    site = Site("127.0.0.2", "slow.test")

    async def page(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.05)
        number = int(request.path.strip("/p") or 0)
        return web.Response(text=f'<p>Page {number}</p><a href="/p{number + 1}">next</a>', content_type="text/html")

    site.default = page
    site.page("/robots.txt", "", status=404, content_type="text/plain")
    servers.start(site)
    out = tmp_path / "out"
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(site.url("/p0") + "\n", encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "-m", "gristmill.pipeline.cli", "crawl", str(seeds), "-o", str(out), "--delay", "0", "--no-extract",
         "--allow-network", "127.0.0.0/8", "--resolve", f"{site.name}={site.ip}", "--quiet", "--json", "--max-depth", "1000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(site.hits) < 6 and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == 0, stderr
    report = json.loads(stdout)
    rows = documents(out)  # committed on the way out
    assert len(rows) == report["documents"] >= 5 and report["queued"] >= 1  # stopped mid-crawl, link waiting
    assert _done_urls(out) == {row["final_url"] for row in rows}
