"""Load on the dedup service (``gristmill serve``) from another process, beside in-process datasketch.

Documents: every ``/usr/share/doc/*/copyright`` file (hundreds of licence texts, many near-identical)
then the Python 3.11 documentation sources, all cut into pieces of at most 4,000 characters (real
text on every Debian machine with ``python3.11-doc``). Two passes over the same documents, in order:

1. ``check+add``: a fresh, empty index; each document is checked and inserted when new (what a crawler
   does). 2. ``check``: the same documents again, now all known (pure lookups).

Rows: the service over HTTP on 127.0.0.1 at batch sizes 1 and 64 (a bounded closed loop: ``--clients``
requests in flight), the same service object in-process without HTTP (to show the transport's share),
and datasketch's ``MinHashLSH`` in a plain query/insert loop (``MinHash.update_batch`` over the same
word 5-gram shingles). Every configuration runs ``--runs`` times; the medians are reported.

``--base N`` first fills every system with N synthetic documents (200 random words from a 50,000-word
vocabulary, unlike each other and the real ones): the service loads them as a corpus index written in
the batch job's layout (``--index``); datasketch gets the same signatures inserted as ``MinHash``
objects. "start s" is the time to get there (service over HTTP: process start to listening).

    .venv/bin/python benchmarks/service_load.py --runs 3
    .venv/bin/python benchmarks/service_load.py --runs 3 --base 100000
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
def start_service(state: str, index: str | None) -> tuple[subprocess.Popen, str]:
    extra = ["--index", index] if index else []
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", "--port", "0", "--state", state, *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on " in line:
            return proc, line.split("listening on ", 1)[1].strip()
    raise SystemExit("gristmill serve did not start")


async def http_pass(url: str, docs: list[tuple[str, str]], batch: int, clients: int, add: bool) -> dict:
    import aiohttp

    queue: asyncio.Queue = asyncio.Queue()
    for i in range(0, len(docs), batch):
        queue.put_nowait(docs[i : i + batch])
    latencies: list[float] = []
    duplicates = 0

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


def run_http(docs: list[tuple[str, str]], batch: int, clients: int, base: str | None) -> dict:
    with tempfile.TemporaryDirectory() as state:
        started = time.perf_counter()
        proc, url = start_service(state, base)
        start_s = time.perf_counter() - started
        try:
            asyncio.run(http_pass(url, docs[:64], batch, clients, add=False))  # warm-up: connections, caches
            return {"start_s": start_s,
                    "check+add": asyncio.run(http_pass(url, docs, batch, clients, add=True)),
                    "check": asyncio.run(http_pass(url, docs, batch, clients, add=False))}
        finally:
            proc.terminate()
            proc.wait(timeout=30)


# -- the same service in-process ---------------------------------------------------------------
def run_in_process(docs: list[tuple[str, str]], batch: int, base: str | None) -> dict:
    from pipeline.format.signature_index import load_index, params_for
    from pipeline.service.server import DedupService, Doc

    with tempfile.TemporaryDirectory() as state:
        started = time.perf_counter()
        params, table = load_index(base) if base else (params_for(0.8, 128, 5), None)
        service = DedupService(params, os.path.join(state, "inserts.log"), table)
        out: dict = {"start_s": time.perf_counter() - started}

        async def one_pass(add: bool) -> dict:
            latencies, duplicates = [], 0
            started = time.perf_counter()
            for i in range(0, len(docs), batch):
                item = [Doc(t, d) for d, t in docs[i : i + batch]]
                t0 = time.perf_counter()
                results = await service.handle(item, add)
                latencies.append(time.perf_counter() - t0)
                duplicates += sum(not r["new"] for r in results)
            return {"docs_per_s": len(docs) / (time.perf_counter() - started), "latencies": latencies,
                    "duplicates": duplicates}

        out["check+add"] = asyncio.run(one_pass(True))
        out["check"] = asyncio.run(one_pass(False))
        service.log.close()
    return out


# -- datasketch --------------------------------------------------------------------------------
def run_datasketch(docs: list[tuple[str, str]], base: str | None) -> dict:
    import re

    from datasketch import MinHash, MinHashLSH

    word = re.compile(r"\w+")
    started = time.perf_counter()
    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    if base:
        from pipeline.format.signature_index import load_index

        _, table = load_index(base)
        with lsh.insertion_session() as session:
            for doc_id, signature in zip(table.ids, table.signatures):
                values = signature & np.uint64(0xFFFFFFFF)  # the default scheme's 32-bit value range
                session.insert(doc_id, MinHash(num_perm=128, hashvalues=values, scheme="affine32"))
    start_s = time.perf_counter() - started

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
            if lsh.query(m):
                duplicates += 1
            elif add:
                lsh.insert(doc_id, m)
            latencies.append(time.perf_counter() - t0)
        return {"docs_per_s": len(docs) / (time.perf_counter() - started), "latencies": latencies,
                "duplicates": duplicates}

    return {"start_s": start_s, "check+add": one_pass(True), "check": one_pass(False)}


def build_base(count: int, folder: str) -> str:
    """A corpus index of ``count`` synthetic documents in the batch job's layout; returns its path."""
    from dedup.lsh import band_hashes
    from dedup.normalize import content_hashes
    from pipeline.format.signature_index import SignatureTable, params_for, write_index

    params = params_for(0.8, 128, 5)
    hasher = params.hasher()
    vocabulary = np.array([f"v{i}" for i in range(50_000)])
    words = np.random.default_rng(0).integers(0, len(vocabulary), size=(count, 200))
    texts = [" ".join(vocabulary[row]) for row in words]
    signatures = np.concatenate([hasher.signatures(texts[i : i + 10_000]) for i in range(0, count, 10_000)])
    table = SignatureTable(ids=[f"base-{i}" for i in range(count)], content_hashes=content_hashes(texts),
                           lengths=np.array([len(t) for t in texts]), signatures=signatures,
                           bands=band_hashes(signatures, params.bands, params.rows))
    path = os.path.join(folder, "base")
    write_index(path, params, table)
    return path


def summarise(runs: list[dict]) -> dict:
    """Medians over runs of start time, throughput and each run's p50 / p99."""
    out: dict = {"start_s": statistics.median(r["start_s"] for r in runs)}
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=3000, help="documents per pass (default %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration (default %(default)s)")
    parser.add_argument("--clients", type=int, default=4, help="HTTP requests in flight (default %(default)s)")
    parser.add_argument("--base", type=int, default=0, help="synthetic documents loaded first (default 0)")
    args = parser.parse_args()
    docs = load_documents(args.docs)
    print(f"{len(docs)} documents, {sum(len(t) for _, t in docs) / 1e6:.1f} M characters; base {args.base}; "
          f"{args.runs} runs each; {os.cpu_count()} CPUs (shared)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as scratch:
        base = build_base(args.base, scratch) if args.base else None
        configs: list[tuple[str, str, Callable[[], dict]]] = [
            ("gristmill serve, HTTP", "1", lambda: run_http(docs, 1, args.clients, base)),
            ("gristmill serve, HTTP", "64", lambda: run_http(docs, 64, args.clients, base)),
            ("gristmill DedupService, in-process", "1", lambda: run_in_process(docs, 1, base)),
            ("gristmill DedupService, in-process", "64", lambda: run_in_process(docs, 64, base)),
            ("datasketch MinHashLSH, in-process", "1 (loop)", lambda: run_datasketch(docs, base)),
        ]
        results = []
        for name, batch, function in configs:
            runs = [function() for _ in range(args.runs)]
            results.append({"system": name, "batch": batch, **summarise(runs)})
            print(f"done: {name} batch {batch}", file=sys.stderr)

    baseline = {mode: results[-1][mode]["docs_per_s"] for mode in ("check+add", "check")}
    print("| system | batch | start s | mode | docs/s | vs datasketch | p50 ms / request | p99 ms / request "
          "| duplicates found |")
    print("|---|---|---:|---|---:|---:|---:|---:|---:|")
    for row in results:
        for mode in ("check+add", "check"):
            r = row[mode]
            print(f"| {row['system']} | {row['batch']} | {row['start_s']:.1f} | {mode} | {r['docs_per_s']:,.0f} | "
                  f"{r['docs_per_s'] / baseline[mode]:.2f}x | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
                  f"| {r['duplicates']} |")
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    main()
