"""A single-partition crawl's commit cost as its shards grow: publishing at every commit vs now.

Why: a commit writes the pages waiting in the frontier into a new shard; until now it also
republished the manifest, which lists every shard, so each commit cost O(shards) and a crawl's
commits together O(shards^2). Now a commit writes its shard and records it (``Committer.flush(None)``),
and the listing is published at most once per ``commit_interval`` (30 s) and at the end.

Each size is a crawl state holding S recorded shards (64 row groups each, as a 256 MiB shard of 4 MiB
row groups has) and one commit's worth of pending pages (``commit_every`` = 1,000 rows of ~3 KB of
text). Measured, as medians of ``--calls`` repetitions, in CPU time of the committing thread (so the
other jobs of a shared machine do not blur it):

- ``before``: a commit as it was (write the shard, record it, publish the manifest of S shards);
- ``now``: a commit now (write the shard, record it);
- ``publish``: the manifest of S shards alone, which now happens at most once per 30 s.

    .venv-bench/bin/python benchmarks/crawl_commits.py [--sizes 100,1000,10000] [--calls 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from crawlers.commits import Committer  # noqa: E402
from crawlers.frontier import RESULT_COLUMNS, Frontier, ResultLog  # noqa: E402

PAGES = 1000
ROW_GROUPS = 64
STATS = {"crawl": {"documents": 0, "outcomes": {"ok": 0}, "parked_hosts": {}}}


def recorded_shards(db: ResultLog, count: int) -> None:
    """``count`` shards as a crawl records them (their files are not needed to publish a manifest)."""
    groups = [{"rows": 2000, "offset": 4 + i * 4_194_304, "length": 4_194_304} for i in range(ROW_GROUPS)]
    infos = [{"path": f"crawl-old{i:07d}-00000.parquet", "rows": 2000 * ROW_GROUPS, "bytes": 268_435_456,
              "checksum": "xxh3_128:" + f"{i:032x}", "row_groups": groups, "footer_offset": 268_435_000,
              "footer_length": 400} for i in range(count)]
    db.record_shards(infos, [], None)


def pending_pages(db: ResultLog, first: int) -> None:
    """One commit's worth of pages waiting in the frontier."""
    text = "A sentence of an article about something that matters to someone. " * 45
    rows = [(first + i, f"{first + i:032x}", text, f"https://example.com/{first + i}", f"https://example.com/{first + i}",
             200, 1_700_000_000_000, "example.com", "en", f"{i:032x}", 1, "utf-8", None) for i in range(PAGES)]
    with db.transaction():
        db.db.executemany(f"INSERT INTO results(url_rowid, {', '.join(RESULT_COLUMNS)}, warc) "
                          f"VALUES ({', '.join('?' * (len(RESULT_COLUMNS) + 2))})", rows)


def cpu_ms(call: Callable[[], object]) -> float:
    started = time.thread_time()
    call()
    return (time.thread_time() - started) * 1000


def measure(size: int, calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        (out / ".crawl").mkdir(parents=True)
        state = str(out / ".crawl" / "frontier.sqlite")
        Frontier(state).close()
        results = ResultLog(state)
        recorded_shards(results, size)
        committer = Committer(str(out), results, shard_bytes=256 << 20, row_group_bytes=4 << 20, warc=False)
        times: dict[str, list[float]] = {"before": [], "now": [], "publish": []}
        for call in range(calls):
            pending_pages(results, 2 * call * PAGES)
            times["before"].append(cpu_ms(lambda: committer.flush(STATS)))
            pending_pages(results, (2 * call + 1) * PAGES)
            times["now"].append(cpu_ms(lambda: committer.flush(None)))
            times["publish"].append(cpu_ms(lambda: committer.publish(STATS)))
        results.close()
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="recorded shards (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=5, help="commits measured per size (default: %(default)s)")
    args = parser.parse_args()
    print(f"| shards recorded | commit of {PAGES:,} pages before (with the manifest), CPU | commit now, CPU | "
          "ratio | the manifest alone (now at most every 30 s), CPU |")
    print("|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        m = measure(size, args.calls)
        print(f"| {size:,} | {m['before']:.0f} ms | {m['now']:.0f} ms | {m['before'] / m['now']:.1f}x | "
              f"{m['publish']:.0f} ms |", flush=True)
        print(json.dumps({"shards": size, **m}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
