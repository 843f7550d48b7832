"""Load on the dedup service (``gristmill serve``) from another process, beside in-process datasketch.

Documents: every ``/usr/share/doc/*/copyright`` file (hundreds of licence texts, many near-identical)
then the Python 3.11 documentation sources, all cut into pieces of at most 4,000 characters (real
text on every Debian machine with ``python3.11-doc``). Two passes over the same documents in the same order:

1. ``check+add``: a fresh, empty index; each document is checked and inserted when new (what a crawler
   does). 2. ``check``: the same documents again, now all known (pure lookups).

Rows: the service over HTTP on 127.0.0.1 at batch sizes 1 and 64 (a bounded closed loop: ``--clients``
requests in flight), the same service object in-process without HTTP (to show the transport's share),
and datasketch's ``MinHashLSH`` in a plain query/insert loop (``MinHash.update_batch`` over the same
word 5-gram shingles). Every configuration runs ``--runs`` times; the medians are reported.

    .venv/bin/python benchmarks/service_load.py --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def load_documents(limit: int, piece_chars: int = 4000) -> list[tuple[str, str]]:
    """(id, text) pairs from the Debian documentation on this machine, in a fixed order."""
    docs: list[tuple[str, str]] = []
    paths = sorted(glob.glob("/usr/share/doc/*/copyright"))
    paths += sorted(glob.glob("/usr/share/doc/python3.11/html/_sources/**/*.txt", recursive=True))
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        for start in range(0, len(text), piece_chars):
            docs.append((f"{path}#{start}", text[start : start + piece_chars]))
    if len(docs) < 1000:
        raise SystemExit("need the python3.11-doc Debian package (make system-deps) for enough documents")
    return docs[:limit]


def percentiles(latencies: list[float]) -> tuple[float, float]:
    values = np.asarray(latencies) * 1000
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


# -- the service over HTTP ---------------------------------------------------------------------
def start_service(state: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", "serve", "--port", "0", "--state", state],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on " in line:
            return proc, line.split("listening on ", 1)[1].strip()
    raise SystemExit("gristmill serve did not start")


async def http_pass(url: str, docs: list[tuple[str, str]], batch: int, clients: int, add: bool) -> dict:
    import aiohttp

    batches = [docs[i : i + batch] for i in range(0, len(docs), batch)]
    latencies: list[float] = []
    duplicates = 0
    queue: asyncio.Queue = asyncio.Queue()
    for item in batches:
        queue.put_nowait(item)

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal duplicates
        while not queue.empty():
            item = queue.get_nowait()
            body = {"documents": [{"id": i, "text": t} for i, t in item], "add": add}
            started = time.perf_counter()
            async with session.post(f"{url}/check", json=body) as response:
                answer = await response.json()
            latencies.append(time.perf_counter() - started)
            duplicates += sum(not r["new"] for r in answer["results"])

    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return {"docs_per_s": len(docs) / elapsed, "latencies": latencies, "duplicates": duplicates}


def run_http(docs: list[tuple[str, str]], batch: int, clients: int) -> dict[str, dict]:
    with tempfile.TemporaryDirectory() as state:
        proc, url = start_service(state)
        try:
            asyncio.run(
                http_pass(url, docs[:64], batch, clients, add=False)
            )  # warm-up: connections, JIT cache
            return {
                "check+add": asyncio.run(http_pass(url, docs, batch, clients, add=True)),
                "check": asyncio.run(http_pass(url, docs, batch, clients, add=False)),
            }
        finally:
            proc.terminate()
            proc.wait(timeout=30)


# -- the same service in-process ---------------------------------------------------------------
def run_in_process(docs: list[tuple[str, str]], batch: int) -> dict[str, dict]:
    from pipeline.service import DedupService, Doc
    from pipeline.service_index import params_for

    out = {}
    with tempfile.TemporaryDirectory() as state:
        service = DedupService(params_for(0.8, 128, 5), os.path.join(state, "inserts.log"))

        async def one_pass(add: bool) -> dict:
            latencies, duplicates = [], 0
            started = time.perf_counter()
            for i in range(0, len(docs), batch):
                item = [Doc(t, d) for d, t in docs[i : i + batch]]
                t0 = time.perf_counter()
                results = await service.handle(item, add)
                latencies.append(time.perf_counter() - t0)
                duplicates += sum(not r["new"] for r in results)
            return {
                "docs_per_s": len(docs) / (time.perf_counter() - started),
                "latencies": latencies,
                "duplicates": duplicates,
            }

        out["check+add"] = asyncio.run(one_pass(True))
        out["check"] = asyncio.run(one_pass(False))
        service.log.close()
    return out


# -- datasketch --------------------------------------------------------------------------------
def run_datasketch(docs: list[tuple[str, str]]) -> dict[str, dict]:
    import re

    from datasketch import MinHash, MinHashLSH

    word = re.compile(r"\w+")
    lsh = MinHashLSH(threshold=0.8, num_perm=128)

    def minhash(text: str) -> MinHash:
        tokens = word.findall(text.lower())
        shingles = {" ".join(tokens[i : i + 5]).encode() for i in range(max(1, len(tokens) - 4))}
        m = MinHash(num_perm=128)
        m.update_batch(list(shingles))
        return m

    def one_pass(add: bool) -> dict:
        latencies, duplicates = [], 0
        started = time.perf_counter()
        for doc_id, text in docs:
            t0 = time.perf_counter()
            m = minhash(text)
            found = lsh.query(m)
            if found:
                duplicates += 1
            elif add:
                lsh.insert(doc_id, m)
            latencies.append(time.perf_counter() - t0)
        return {
            "docs_per_s": len(docs) / (time.perf_counter() - started),
            "latencies": latencies,
            "duplicates": duplicates,
        }

    return {"check+add": one_pass(True), "check": one_pass(False)}


def summarise(runs: list[dict[str, dict]]) -> dict[str, dict]:
    """Medians over runs of throughput and of each run's p50 / p99."""
    out = {}
    for mode in ("check+add", "check"):
        p = [percentiles(r[mode]["latencies"]) for r in runs]
        out[mode] = {
            "docs_per_s": statistics.median(r[mode]["docs_per_s"] for r in runs),
            "p50_ms": statistics.median(x[0] for x in p),
            "p99_ms": statistics.median(x[1] for x in p),
            "duplicates": runs[0][mode]["duplicates"],
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=3000, help="documents per pass (default %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration (default %(default)s)")
    parser.add_argument(
        "--clients", type=int, default=4, help="HTTP requests in flight (default %(default)s)"
    )
    args = parser.parse_args()
    docs = load_documents(args.docs)
    print(
        f"{len(docs)} documents, {sum(len(t) for _, t in docs) / 1e6:.1f} M characters; "
        f"{args.runs} runs each; {os.cpu_count()} CPUs (shared)",
        file=sys.stderr,
    )

    configs: list[tuple[str, str, Callable[[], dict[str, dict]]]] = [
        ("gristmill serve, HTTP", "1", lambda: run_http(docs, 1, args.clients)),
        ("gristmill serve, HTTP", "64", lambda: run_http(docs, 64, args.clients)),
        ("gristmill DedupService, in-process", "1", lambda: run_in_process(docs, 1)),
        ("gristmill DedupService, in-process", "64", lambda: run_in_process(docs, 64)),
        ("datasketch MinHashLSH, in-process", "1 (loop)", lambda: run_datasketch(docs)),
    ]
    results = []
    for name, batch, function in configs:
        runs = [function() for _ in range(args.runs)]
        results.append({"system": name, "batch": batch, **summarise(runs)})
        print(f"done: {name} batch {batch}", file=sys.stderr)

    baseline = {mode: results[-1][mode]["docs_per_s"] for mode in ("check+add", "check")}
    print(
        "| system | batch | mode | docs/s | vs datasketch | p50 ms / request | p99 ms / request | duplicates found |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for row in results:
        for mode in ("check+add", "check"):
            r = row[mode]
            print(
                f"| {row['system']} | {row['batch']} | {mode} | {r['docs_per_s']:,.0f} | "
                f"{r['docs_per_s'] / baseline[mode]:.2f}x | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['duplicates']} |"
            )
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    main()
