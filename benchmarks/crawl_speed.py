"""Crawl speed against Scrapy on the same loopback site, and memory of a one-million-URL frontier.

Why this shape: a crawler's own overhead (scheduling, parsing, bookkeeping, output) only shows when
the network is not the bottleneck, so both crawlers fetch the same pre-rendered site from a server in
its own process on 127.0.0.1, at the same concurrency, with robots.txt obeyed, no delays and no
auto-throttling, each run in a fresh interpreter, alternating. Reported: medians of several runs
and their ratio. "Extraction on" means main-text extraction and language id of every page through the
very same function, ``gristmill.crawlers.extract.process_document`` (trafilatura with gristmill's settings,
then py3langid): gristmill runs it in its worker process pool, Scrapy inline in its callback, which
is how a Scrapy user would call it.
Times are each crawler's own: gristmill's ``CrawlSummary.elapsed_s`` (from ``run()``, so starting the
extraction workers, a few seconds on a loaded machine, is included), Scrapy's stats from engine start
to finish (after its imports, trafilatura's included).

Memory: RSS of a fresh process after admitting one million URLs (1,000 hosts) to gristmill's frontier,
against Scrapy's default in-memory scheduler model (one ``Request`` per URL plus the dupe filter's
fingerprint set).

    .venv-bench/bin/python benchmarks/crawl_speed.py [--pages 5000] [--runs 3] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the crawler fetches pages from many hosts while keeping each host's limits and writes text into "
         "shards that the deduplication job reads later on a cluster of machines with plenty of memory "
         "politeness matters because servers belong to other people who pay for every request").split()


def render_site(pages: int, seed: int = 7) -> dict[str, bytes]:
    """A deterministic site: articles of ~1,000 words, a navigation bar and ten links each."""
    rng = random.Random(seed)
    site = {"/robots.txt": b"User-agent: *\nAllow: /\n"}
    nav = "".join(f'<li><a href="/p{i}.html">Section {i}</a></li>' for i in range(10))
    for i in range(pages):
        paragraphs = "".join("<p>" + " ".join(rng.choice(WORDS) for _ in range(100)).capitalize() + ".</p>"
                             for _ in range(10))
        links = "".join(f'<a href="/p{(i * 31 + k * 17 + 1) % pages}.html">related {k}</a> ' for k in range(10))
        site[f"/p{i}.html"] = (
            f"<!doctype html><html><head><meta charset='utf-8'><title>Article {i}</title></head><body>"
            f"<header><nav><ul>{nav}</ul></nav></header><main><article><h1>Article {i}</h1>{paragraphs}"
            f"</article><aside>{links}</aside></main><footer>Imprint - Privacy - Contact</footer></body></html>"
        ).encode()
    return site


def serve(pages: int, port_out: multiprocessing.connection.Connection) -> None:
    """The site server (its own process, so it never competes for the crawler's GIL)."""
    import asyncio

    from aiohttp import web

    site = render_site(pages)

    async def handler(request: web.Request) -> web.Response:
        body = site.get(request.path)
        if body is None:
            return web.Response(status=404)
        kind = "text/plain" if request.path.endswith(".txt") else "text/html; charset=utf-8"
        return web.Response(body=body, content_type=kind.split(";")[0], charset="utf-8" if "html" in kind else None)

    async def main() -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        tcp = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await tcp.start()
        port_out.send(tcp._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


# The guard matters: extraction workers start through multiprocessing, which imports the main script
# in each new process (without it, every worker would first run a crawl of its own).
GRISTMILL = """
import json, sys
from gristmill.crawlers import crawl
if __name__ == "__main__":
    start, out, extract, concurrency = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
    summary = crawl([start], out, allow_networks=["127.0.0.0/8"], concurrency=concurrency,
                    per_host_concurrency=concurrency, min_delay=0.0, adaptive=False, extract=extract,
                    progress_interval=3600)  # commits and extract_workers (one per CPU): the defaults
    print(json.dumps({"pages": summary.documents, "elapsed": summary.elapsed_s}))
"""

SCRAPY = """
import json, sys
import scrapy
from scrapy.crawler import CrawlerProcess
from scrapy.linkextractors import LinkExtractor
start, out, extract, concurrency = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
if extract:
    from gristmill.crawlers.extract import prepare_worker, process_document
    prepare_worker()  # trafilatura and the language model loaded before the clock starts, as in gristmill's workers

class Site(scrapy.Spider):
    name = "site"
    start_urls = [start]
    allowed_domains = ["127.0.0.1"]
    links = LinkExtractor()

    def parse(self, response):
        if extract:
            text, _language = process_document(response.text, response.url)
        else:
            text = " ".join(" ".join(response.xpath("//body//text()").getall()).split())
        yield {"url": response.url, "text": text}
        for link in self.links.extract_links(response):
            yield response.follow(link.url, self.parse)

process = CrawlerProcess(settings={
    "CONCURRENT_REQUESTS": concurrency, "CONCURRENT_REQUESTS_PER_DOMAIN": concurrency, "DOWNLOAD_DELAY": 0,
    "ROBOTSTXT_OBEY": True, "AUTOTHROTTLE_ENABLED": False, "LOG_LEVEL": "WARNING",
    "TELNETCONSOLE_ENABLED": False, "FEEDS": {out + "/items.jsonl": {"format": "jsonlines"}},
})
crawler = process.create_crawler(Site)
process.crawl(crawler)
process.start()
stats = crawler.stats.get_stats()
print(json.dumps({"pages": stats.get("item_scraped_count", 0),
                  "elapsed": (stats["finish_time"] - stats["start_time"]).total_seconds()}))
"""

FRONTIER_GRISTMILL = """
import json, sys, resource, psutil
from gristmill.crawlers.crawler import Crawler, CrawlConfig
count, out = int(sys.argv[1]), sys.argv[2]
process = psutil.Process()
before = process.memory_info().rss
crawler = Crawler([], out, CrawlConfig(follow="any"))
def urls(lo, hi):
    for i in range(lo, hi):
        yield f"http://host{i % 1000}.example.com/section/{i // 7000}/article-{i}.html"
for lo in range(0, count, 50_000):
    crawler.enqueue(urls(lo, min(count, lo + 50_000)))
assert crawler.frontier.queued_count() == count
print(json.dumps({"rss_mb": process.memory_info().rss / 2**20, "before_mb": before / 2**20,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

FRONTIER_SCRAPY = """
import json, sys, resource, psutil
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
count = int(sys.argv[1])
process = psutil.Process()
before = process.memory_info().rss
fingerprint = RequestFingerprinter().fingerprint
queue, seen = [], set()
for i in range(count):
    request = Request(f"http://host{i % 1000}.example.com/section/{i // 7000}/article-{i}.html")
    seen.add(fingerprint(request))
    queue.append(request)
print(json.dumps({"rss_mb": process.memory_info().rss / 2**20, "before_mb": before / 2**20,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_script(code: str, *args: str, timeout: float = 1800) -> dict[str, float]:
    """Run ``code`` in a fresh interpreter (from a file: Scrapy reads its spiders' source)."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(code)
    try:
        result = subprocess.run([sys.executable, handle.name, *args], cwd=ROOT, capture_output=True, text=True,
                                timeout=timeout, check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.unlink(handle.name)
    if result.returncode != 0:
        raise RuntimeError(f"benchmark subprocess failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def speed(args: argparse.Namespace) -> None:
    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=serve, args=(args.pages, send), daemon=True)
    server.start()
    port = receive.recv()
    start = f"http://127.0.0.1:{port}/p0.html"
    print(f"site: {args.pages} pages on 127.0.0.1:{port}; concurrency {args.concurrency}; {args.runs} runs each; "
          f"{os.cpu_count()} CPUs (shared machine: other jobs were running)\n")
    print("| extraction | gristmill pages/s (median) | Scrapy pages/s (median) | ratio | pages (g / s) |")
    print("|---|---|---|---|---|")
    try:
        for extract in {"off": (False,), "on": (True,), "both": (False, True)}[args.extraction]:
            rates: dict[str, list[float]] = {"gristmill": [], "scrapy": []}
            pages: dict[str, int] = {}
            for _ in range(args.runs):
                for name, code in (("gristmill", GRISTMILL), ("scrapy", SCRAPY)):
                    with tempfile.TemporaryDirectory() as out:
                        result = run_script(code, start, out, "1" if extract else "0", str(args.concurrency))
                    pages[name] = int(result["pages"])
                    rates[name].append(result["pages"] / result["elapsed"])
            g, s = statistics.median(rates["gristmill"]), statistics.median(rates["scrapy"])
            print(f"| {'on' if extract else 'off'} | {g:.0f} | {s:.0f} | {g / s:.2f}x | "
                  f"{pages['gristmill']} / {pages['scrapy']} |", flush=True)
    finally:
        server.terminate()


def memory(args: argparse.Namespace) -> None:
    print(f"\n| frontier of {args.frontier:,} URLs | RSS after (MB) | RSS before (MB) | peak RSS (MB) |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        ours = run_script(FRONTIER_GRISTMILL, str(args.frontier), out)
        seconds = time.perf_counter() - started
    print(f"| gristmill (SQLite frontier, {seconds:.0f} s to admit) | {ours['rss_mb']:.0f} | "
          f"{ours['before_mb']:.0f} | {ours['peak_mb']:.0f} |", flush=True)
    theirs = run_script(FRONTIER_SCRAPY, str(args.frontier))
    print(f"| Scrapy in-memory scheduler model | {theirs['rss_mb']:.0f} | {theirs['before_mb']:.0f} | "
          f"{theirs['peak_mb']:.0f} |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--frontier", type=int, default=1_000_000)
    parser.add_argument("--extraction", choices=("off", "on", "both"), default="both")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    if not args.skip_speed:
        speed(args)
    if not args.skip_memory:
        memory(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
