"""A crawl's commit and publication costs as its shards grow, and the share of its time publishing takes.

Why: a commit writes the pages waiting in the frontier into a new shard; until 8e18f8d it also
republished the manifest, which lists every shard, so each commit cost O(shards) and a crawl's
commits together O(shards^2). Since then a commit writes its shard and records it
(``Committer.flush(None)``), and the listing is published apart. That publication still costs
O(shards): on a fixed ``commit_interval`` (30 s) a billion-page crawl (a million shards of 1,000
pages) would spend its life publishing. Now it is published again only when
``gristmill.crawlers.commits.publish_due``: ``commit_interval`` after the last, and not before the last one
took / ``PUBLISH_SHARE`` (5 %).

Each size is a crawl state holding S recorded shards (``--row-groups`` each: 64 as a 256 MiB shard of
4 MiB row groups has; 1 as a commit of 1,000 pages of about 3 KB makes) and one commit's worth of
pending pages (``commit_every`` = 1,000 rows of ~3 KB of text). Medians of ``--calls`` repetitions:

- ``before``: a commit as it was (write the shard, record it, publish the manifest of S shards), CPU;
- ``now``: a commit now (write the shard, record it), CPU;
- ``publish``: the manifest of S shards alone (one crawler), CPU and wall time;
- ``coordinator``: a partitioned crawl's publication (a partition writes its segment, the coordinator
  reads it and writes the manifest), wall time;
- the share of the crawl's time the publication takes: every 30 s as before (100 % once it takes
  30 s or more: publications back to back), and under ``publish_due`` now, with the interval it
  leads to.

CPU is the committing thread's (so the other jobs of a shared machine do not blur it); the rule and
the shares use wall time, as a crawl does (an object store's PUTs are wall time, not CPU).

    .venv-bench/bin/python benchmarks/crawl_commits.py [--sizes 100,1000,10000] [--calls 5] [--row-groups 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gristmill.crawlers.commits import PUBLISH_SHARE, Committer, publish_segments  # noqa: E402
from gristmill.crawlers.frontier import RESULT_COLUMNS, Frontier, ResultLog  # noqa: E402
from gristmill.crawlers.partitions import read_json, write_json  # noqa: E402

PAGES = 1000
INTERVAL = 30.0  # commit_interval's default
STATS = {"crawl": {"documents": 0, "outcomes": {"ok": 0}, "parked_hosts": {}}}


def recorded_shards(db: ResultLog, count: int, row_groups: int) -> None:
    """``count`` shards as a crawl records them (their files are not needed to publish a manifest)."""
    groups = [{"rows": 2000, "offset": 4 + i * 4_194_304, "length": 4_194_304} for i in range(row_groups)]
    infos = [{"path": f"crawl-old{i:07d}-00000.parquet", "rows": 2000 * row_groups, "bytes": 4_194_304 * row_groups,
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


def timed(call: Callable[[], object]) -> tuple[float, float]:
    """CPU ms of the calling thread and wall ms of ``call``."""
    cpu, wall = time.thread_time(), time.perf_counter()
    call()
    return (time.thread_time() - cpu) * 1000, (time.perf_counter() - wall) * 1000


def measure(size: int, calls: int, row_groups: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "out"
        (out / ".crawl").mkdir(parents=True)
        state = str(out / ".crawl" / "frontier.sqlite")
        Frontier(state).close()
        results = ResultLog(state)
        recorded_shards(results, size, row_groups)
        committer = Committer(str(out), results, shard_bytes=256 << 20, row_group_bytes=4 << 20, warc=False)
        segment = str(out / ".crawl" / "segment.json")
        partition = Committer(str(out), results, shard_bytes=256 << 20, row_group_bytes=4 << 20, warc=False,
                              segment=partial(write_json, segment))
        times: dict[str, list[float]] = {"before": [], "now": [], "publish": [], "publish_wall": [], "coordinator": []}
        for call in range(calls):
            pending_pages(results, 2 * call * PAGES)
            times["before"].append(timed(lambda: committer.flush(STATS))[0])
            pending_pages(results, (2 * call + 1) * PAGES)
            times["now"].append(timed(lambda: committer.flush(None))[0])
            cpu, wall = timed(lambda: committer.publish(STATS))
            times["publish"].append(cpu)
            times["publish_wall"].append(wall)
            times["coordinator"].append(timed(lambda: partition.publish(STATS))[1] + timed(
                lambda: publish_segments(str(out), [read_json(segment)]))[1])  # type: ignore[list-item]
        results.close()
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,10000", help="recorded shards (default: %(default)s)")
    parser.add_argument("--calls", type=int, default=5, help="commits measured per size (default: %(default)s)")
    parser.add_argument("--row-groups", type=int, default=64, help="row groups per shard (default: %(default)s)")
    args = parser.parse_args()
    print(f"{args.row_groups} row groups per shard; medians of {args.calls} calls\n")
    print(f"| shards recorded | commit of {PAGES:,} pages before (with the manifest), CPU | commit now, CPU | "
          "the manifest alone, CPU | the manifest alone, wall | a partitioned crawl's publication, wall | "
          f"share of the crawl's time publishing every {INTERVAL:.0f} s (before) | share now | published every |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        m = measure(size, args.calls, args.row_groups)
        took = max(m["publish_wall"], m["coordinator"]) / 1000
        every = max(INTERVAL, took / PUBLISH_SHARE)
        print(f"| {size:,} | {m['before']:.0f} ms | {m['now']:.0f} ms | {m['publish']:.0f} ms | "
              f"{m['publish_wall']:.0f} ms | {m['coordinator']:.0f} ms | {min(1.0, took / INTERVAL):.1%} | "
              f"{took / every:.1%} | {every:.0f} s |", flush=True)
        print(json.dumps({"shards": size, "row_groups": args.row_groups, **m}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
