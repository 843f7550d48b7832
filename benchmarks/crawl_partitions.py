"""Crawl speed with K = 1, 2 (...) partitions on the loopback benchmark site served as several hosts.

Why several hosts: a partition owns whole hosts, so one host can only ever use one partition. The
site of ``crawl_speed.py`` (pre-rendered articles, ten links each) is served on ``--hosts`` ports of
127.0.0.1 by a server in its own process; every crawl runs in a fresh interpreter, K values
alternating, robots.txt obeyed, no delays, extraction off or on, the same total ``--concurrency``
(split over the partitions). Reported: medians of pages/s over the whole process's wall time
(interpreter start, imports and the partitions' start-up included, for every K), the ratio to K = 1,
the cores the crawl actually got (its CPU seconds over its wall time: on a shared machine, what the
other jobs left it), and the CPU seconds per page of the crawl (all its processes) and of the
servers (the site; with the state on S3 also moto and its proxy, which on a cluster run elsewhere
but here take the same cores), read from /proc: with C cores, K partitions cannot go faster than
C / (crawl + servers' CPU per page), the ceiling printed beside each row. Then what keeps K partitions
from K times one partition's speed, from the stored pages themselves: the largest partition's share
of the pages (each partition is one event loop, so the crawl cannot beat K = 1's pages/s over that
share: the "ceiling from the split"), the part of the wall time the last partition ran alone (from
the partitions' last fetch times), and the start-up (from the process's start to the first page
stored by the partition that stored its first page last).

The row "2 x 1 apart" is the ceiling measured on the same cores in the same run: two one-partition
crawls at once, each of half the hosts into its own output with half the connections; K = 2 with
nothing shared (no coordinator, no exchange, no common end), so what two crawler processes get out of
this machine. K = 2 can approach it, not beat it.

With ``--store-latency S`` every K also crawls with its state on S3 (moto behind
``shaped_store.py`` answering after S seconds, in processes of their own): each partition's frontier
lives in a scratch folder and is checkpointed to the store at every commit (``--commit-every``), as
on a cluster whose nodes share no disk; the last lines give its pages/s as a share of local state's,
over the whole run and from the first page stored to the last (a long crawl's pace: start-up and the
last commit left out).

    .venv-bench/bin/python benchmarks/crawl_partitions.py [--hosts 8] [--pages 1000] [--runs 3] [--ks 1,2] [--apart 2]
        [--store-latency 0.02] [--commit-every 1000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from crawl_speed import ROOT, render_site  # noqa: E402
from loader_remote import BUCKET, _control, s3_options, start_store  # noqa: E402
from process_tree import TreeMemory  # noqa: E402

CRAWL = """
import json, sys
import pyarrow.parquet as pq
from gristmill.crawlers import crawl
from gristmill.pipeline.format import Corpus
if __name__ == "__main__":
    seeds, out, partitions, extract, concurrency, state, commit_every = json.loads(sys.argv[1])
    summary = crawl(seeds, out, allow_networks=["127.0.0.0/8"], concurrency=concurrency, per_host_concurrency=4,
                    min_delay=0.0, adaptive=False, extract=extract, partitions=partitions, progress_interval=3600,
                    state_dir=state, commit_every=commit_every)
    pages, first, last = {}, {}, {}  # per partition (shard names start crawl-pN; one partition: crawl-)
    for shard in Corpus.open(out).manifest.shards:
        part = shard.path.split("-")[1] if partitions > 1 else "p0"
        times = pq.read_table(f"{out}/{shard.path}", columns=["fetch_time"]).column("fetch_time").cast("int64")
        values = times.to_pylist()
        pages[part] = pages.get(part, 0) + len(values)
        first[part] = min(first.get(part, min(values)), min(values))
        last[part] = max(last.get(part, max(values)), max(values))
    print(json.dumps({"pages": summary.documents, "elapsed": summary.elapsed_s,
                      "largest_share": max(pages.values()) / sum(pages.values()),
                      "alone_s": (max(last.values()) - min(last.values())) / 1000,
                      "first_page_at": max(first.values()) / 1000, "last_page_at": max(last.values()) / 1000,
                      "first_any_at": min(first.values()) / 1000}))
"""


def serve(pages: int, hosts: int, ports_out: multiprocessing.connection.Connection) -> None:
    """The same site on ``hosts`` ports (its own process, so it never competes for a crawler's GIL)."""
    import asyncio

    from aiohttp import web

    site = render_site(pages)

    async def handler(request: web.Request) -> web.Response:
        body = site.get(request.path)
        if body is None:
            return web.Response(status=404)
        if request.path.endswith(".txt"):
            return web.Response(body=body, content_type="text/plain")
        return web.Response(body=body, content_type="text/html", charset="utf-8")

    async def main() -> None:
        app = web.Application()
        app.router.add_route("GET", "/{tail:.*}", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ports = []
        for _ in range(hosts):
            tcp = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
            await tcp.start()
            ports.append(tcp._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        ports_out.send(ports)
        await asyncio.Event().wait()

    asyncio.run(main())


def crawl_once(groups: list[list[str]], partitions: int, extract: bool, concurrency: int, state: str | None = None,
               commit_every: int = 1000) -> dict[str, float]:
    """One crawl per group of seeds, all at once, each in a fresh interpreter with its own output (and
    its state under ``state`` when given: a store URL); their pages, elapsed seconds and CPU seconds
    (all their processes) together."""
    runs = []
    with tempfile.TemporaryDirectory() as out, tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as code:
        code.write(CRAWL)
        code.close()
        try:
            started, started_at = time.perf_counter(), time.time()
            for number, seeds in enumerate(groups):
                where = None if state is None else f"{state}/{uuid.uuid4().hex}"
                arguments = json.dumps([seeds, f"{out}/{number}", partitions, extract, concurrency // len(groups),
                                        where, commit_every])
                process = subprocess.Popen([sys.executable, code.name, arguments], cwd=ROOT, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
                runs.append((process, TreeMemory(process.pid)))
            outputs = [process.communicate() for process, _tree in runs]
            wall = time.perf_counter() - started
            cpu = sum(tree.stop()["cpu"] for _process, tree in runs)
        finally:
            os.unlink(code.name)
    results = []
    for (process, _tree), (stdout, stderr) in zip(runs, outputs):
        if process.returncode != 0:
            raise RuntimeError(f"crawl failed:\n{stderr[-3000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    pages = sum(r["pages"] for r in results)
    lasts = [r["last_page_at"] for r in results]
    return {"pages": pages, "wall": wall, "cpu": cpu,
            "largest_share": max(r["largest_share"] * r["pages"] for r in results) / pages,
            "alone_s": max(max(r["alone_s"] for r in results), max(lasts) - min(lasts)),
            # start-up: from the start to the first page stored by the last partition to store one
            "startup_s": max(r["first_page_at"] for r in results) - started_at,
            # the crawl's own pace: from the first page stored to the last (no start-up, no final commit)
            "crawling_s": max(lasts) - min(r["first_any_at"] for r in results)}


def cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=8, help="hosts of the site (default: %(default)s)")
    parser.add_argument("--pages", type=int, default=1000, help="pages per host (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="crawls per K (default: %(default)s)")
    parser.add_argument("--ks", default="1,2", help="partition counts (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=64, help="connections in all (default: %(default)s)")
    parser.add_argument("--extraction", choices=("off", "on", "both"), default="off",
                        help="(default: %(default)s)")
    parser.add_argument("--store-latency", type=float, default=None, metavar="SECONDS",
                        help="also crawl each K with its state on S3 (moto behind benchmarks/shaped_store.py with this "
                             "latency, e.g. 0.02): frontiers checkpointed there at every commit (default: not)")
    parser.add_argument("--commit-every", type=int, default=1000, help="pages per commit (default: %(default)s)")
    parser.add_argument("--apart", type=int, default=2,
                        help="also N one-partition crawls of 1/N of the hosts each, at once (0: not; default: "
                             "%(default)s)")
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=serve, args=(args.pages, args.hosts, send), daemon=True)
    server.start()
    seeds = [f"http://127.0.0.1:{port}/p0.html" for port in receive.recv()]
    # (label, seed groups crawled at once, partitions of each, state URL or None)
    setups = [(str(k), [seeds], k, None) for k in ks]

    def label_of(k: int) -> str:
        return f"{k}, state on S3 ({args.store_latency * 1000:.0f} ms)"
    store = []
    if args.store_latency is not None:
        store = start_store()
        import s3fs

        s3fs.S3FileSystem(**s3_options()).mkdir(BUCKET)
        _control("/__shape__", {"latency": args.store_latency})
        setups += [(label_of(k), [seeds], k, f"s3://{BUCKET}/state") for k in ks]
    if args.apart > 1:
        setups.append((f"{args.apart} x 1 apart", [seeds[i::args.apart] for i in range(args.apart)], 1, None))
    cores = len(os.sched_getaffinity(0))

    print(f"site: {args.pages} pages x {args.hosts} hosts on 127.0.0.1; total concurrency {args.concurrency}; "
          f"{args.runs} runs each, alternating; {cores} cores; load average before {os.getloadavg()[0]:.1f}\n")
    print("| extraction | K | pages/s (median) | x K=1 | cores the crawl got | crawl CPU /page | servers' CPU /page | "
          "ceiling pages/s on all cores | largest partition's share | last partition alone | start-up | "
          "ceiling from the split | pages |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for extract in {"off": (False,), "on": (True,), "both": (False, True)}[args.extraction]:
            runs: dict[str, list[dict[str, float]]] = {label: [] for label, _groups, _k, _state in setups}
            for _ in range(args.runs):
                for label, groups, k, state in setups:
                    servers_before = sum(cpu_seconds(p.pid) for p in (server, *store))
                    result = crawl_once(groups, k, extract, args.concurrency, state, args.commit_every)
                    result["server_cpu"] = sum(cpu_seconds(p.pid) for p in (server, *store)) - servers_before
                    runs[label].append(result)
            base = statistics.median(r["pages"] / r["wall"] for r in runs[setups[0][0]])
            ceilings: dict[str, float] = {}
            for label, _groups, _k, _state in setups:
                rate = statistics.median(r["pages"] / r["wall"] for r in runs[label])
                crawl_cpu = statistics.median(r["cpu"] / r["pages"] for r in runs[label])
                server_cpu = statistics.median(r["server_cpu"] / r["pages"] for r in runs[label])
                pages = int(statistics.median(r["pages"] for r in runs[label]))
                used = statistics.median(r["cpu"] / r["wall"] for r in runs[label])
                share = statistics.median(r["largest_share"] for r in runs[label])
                alone = statistics.median(r["alone_s"] / r["wall"] for r in runs[label])
                startup = statistics.median(r["startup_s"] for r in runs[label])
                ceiling = ceilings[label] = cores / (crawl_cpu + server_cpu)
                print(f"| {'on' if extract else 'off'} | {label} | {rate:.0f} | {rate / base:.2f}x | {used:.2f} | "
                      f"{crawl_cpu * 1000:.2f} ms | {server_cpu * 1000:.2f} ms | {ceiling:.0f} ({ceiling / base:.2f}x) | "
                      f"{share:.0%} | {alone:.0%} of the wall time | {startup:.1f} s | "
                      f"{base / share:.0f} ({1 / share:.2f}x) | {pages} |", flush=True)
            for k in ks if store else ():
                local = statistics.median(r["pages"] / r["wall"] for r in runs[str(k)])
                remote = statistics.median(r["pages"] / r["wall"] for r in runs[label_of(k)])
                steady = [statistics.median(r["pages"] / r["crawling_s"] for r in runs[label]) for label in
                          (label_of(k), str(k))]
                print(f"K = {k}: state on S3 / local state = {remote / local:.1%} of the pages/s "
                      f"({steady[0] / steady[1]:.1%} from first page to last); "
                      f"each against its ceiling on these cores: {remote / ceilings[label_of(k)]:.1%} "
                      f"/ {local / ceilings[str(k)]:.1%}", flush=True)
    finally:
        server.terminate()
        for process in store:
            process.terminate()
    print(f"\nload average after {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
