"""A crawl partition's per-commit cost and frontier memory at 0.25 M, 1 M and 4 M URLs.

Why: what a commit computes on the event loop must not grow with the crawl. Each size is a frontier
of N URLs over 1,000 hosts, a quarter of them finished with assorted outcomes (built with bulk SQL,
the crawler's own schema). A fresh process then opens it as a crawl resuming (frontier, host
scheduler with every queued host loaded) and measures, as medians of several calls:

- ``before``: the outcome count every commit ran until now (a GROUP BY over every URL);
- ``after``: the statistics a commit gathers now (``Crawler._stats()``: the counter table, the parked
  hosts), and the queued count the progress line reads;
- the process's RSS once the crawl is open (the frontier's memory at that size).

    .venv-bench/bin/python benchmarks/crawl_growth.py [--sizes 250000,1000000,4000000] [--calls 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOSTS = 1000
OUTCOMES = ["ok", "ok", "ok", "http 404", "robots: disallowed by robots.txt", "redirect", "empty: no main text",
            "failed: http 503 (after 4 attempts)"]

MEASURE = """
import json, statistics, sys, time, psutil
from crawlers.crawler import Crawler, CrawlConfig
out, calls = sys.argv[1], int(sys.argv[2])
crawler = Crawler([], out, CrawlConfig())
crawler._load_hosts()
def median_ms(call):
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000
db = crawler.frontier.db
before = median_ms(lambda: db.execute("SELECT COALESCE(outcome, 'queued'), COUNT(*) FROM urls GROUP BY 1").fetchall())
after = median_ms(crawler._stats)
queued = median_ms(crawler.frontier.queued_count)
print(json.dumps({"before_ms": before, "after_ms": after, "queued_ms": queued,
                  "rss_mb": psutil.Process().memory_info().rss / 2**20, "stats": crawler._stats()}))
"""


def build(out: Path, urls: int, seed: int = 3) -> None:
    """A frontier of ``urls`` URLs over 1,000 hosts, a quarter finished, in the crawler's schema."""
    from crawlers.frontier import Frontier

    state = out / ".crawl"
    state.mkdir(parents=True)
    Frontier(str(state / "frontier.sqlite")).close()  # the schema
    rng = random.Random(seed)
    db = sqlite3.connect(state / "frontier.sqlite", isolation_level=None)
    db.execute("PRAGMA synchronous=OFF")
    db.execute("BEGIN")
    db.executemany("INSERT INTO hosts(id, origin) VALUES (?, ?)",
                   ((h + 1, f"http://host{h}.example.com") for h in range(HOSTS)))

    def rows():
        for i in range(urls):
            finished = rng.random() < 0.25
            yield (f"http://host{i % HOSTS}.example.com/section/{i // 7000}/article-{i}.html", i % HOSTS + 1,
                   1, 0, 1 if finished else 0, rng.choice(OUTCOMES) if finished else None)

    db.executemany("INSERT INTO urls(url, host, depth, kind, state, outcome) VALUES (?, ?, ?, ?, ?, ?)", rows())
    db.execute("UPDATE hosts SET admitted = (SELECT COUNT(*) FROM urls WHERE urls.host = hosts.id)")
    db.execute("COMMIT")
    db.close()
    Frontier(str(state / "frontier.sqlite")).close()  # fills the outcome counters, as a crawl keeps them


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="250000,1000000,4000000")
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    print("| URLs in the frontier | commit stats before (GROUP BY) | commit stats now | queued count now | "
          "RSS of the open crawl |")
    print("|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder) / "out"
            build(out, size)
            result = subprocess.run([sys.executable, "-c", MEASURE, str(out), str(args.calls)], cwd=ROOT,
                                    capture_output=True, text=True, check=False,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-3000:])
        measured = json.loads(result.stdout.strip().splitlines()[-1])
        print(f"| {size:,} | {measured['before_ms']:.0f} ms | {measured['after_ms']:.2f} ms | "
              f"{measured['queued_ms']:.2f} ms | {measured['rss_mb']:.0f} MB |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
