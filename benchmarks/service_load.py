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

``--shards 2`` rows run the same front with two shard actors on a local Ray.

``--durable`` measures instead ``--shards 2`` with each shard's state on a store against a local state
folder (fsync): moto behind benchmarks/shaped_store.py at ``--latency`` (20 ms) per request, the
state in ``s3://.../state`` (every add acknowledged only once its log segment is on the store), beside
the same front with local state folders, at batch sizes 1 and 64; the ratio is durable / local.

``--sizes N,...`` measures memory instead: a synthetic corpus index of N documents (random
signatures), loaded by ``gristmill serve --index`` in its own process; load time, resident and peak
anonymous bytes per document (the memory-mapped rows file not counted), bytes per document added
through ``/add``, and the restart from the snapshot. ``--landed CHECKOUT`` runs an earlier version
side by side at the smallest size.

    .venv-bench/bin/python benchmarks/service_load.py --runs 3
    .venv-bench/bin/python benchmarks/service_load.py --runs 3 --base 100000
    .venv-bench/bin/python benchmarks/service_load.py --sizes 1000000 --runs 2 --landed /tmp/landed
    .venv-bench/bin/python benchmarks/service_load.py --durable --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
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
def launch(state: str, index: str | None, *extra: str, checkout: Path = REPO) -> subprocess.Popen:
    """``gristmill serve`` from ``checkout`` (this one, or ``--landed``'s) on a free port."""
    args = [*extra, "--index", index] if index else list(extra)
    env = {**os.environ, "PYTHONPATH": str(checkout), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    os.makedirs(state, exist_ok=True)
    with open(os.path.join(state, "stderr.txt"), "wb") as stderr:  # the server ignores other files in its folder
        return subprocess.Popen([sys.executable, "-m", "gristmill.pipeline.cli", "serve", "--port", "0", "--state", state, *args],
                                cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)


def listening(proc: subprocess.Popen) -> str:
    """The URL the server prints once it listens."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on " in line:
            return line.split("listening on ", 1)[1].strip()
    state = proc.args[proc.args.index("--state") + 1]
    with open(os.path.join(state, "stderr.txt"), encoding="utf-8", errors="replace") as handle:
        raise SystemExit(f"gristmill serve did not start: {handle.read()[-3000:]}")


def start_service(state: str, index: str | None, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = launch(state, index, *extra)
    return proc, listening(proc)


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


def run_http(docs: list[tuple[str, str]], batch: int, clients: int, base: str | None, shards: int = 1,
             state_dir: str | None = None) -> dict:
    """Both passes against a fresh service; ``state_dir`` (a store URL) instead of the temporary folder."""
    with tempfile.TemporaryDirectory() as state:
        started = time.perf_counter()
        extra = ("--state-dir", state_dir) if state_dir else ()
        proc, url = start_service(state, base, "--shards", str(shards), *extra)
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
    from gristmill.pipeline.format.signature_index import params_for
    from gristmill.pipeline.service.columns import return_freed_memory
    from gristmill.pipeline.service.core import DedupService, Doc

    return_freed_memory()  # as `gristmill serve` does
    with tempfile.TemporaryDirectory() as state:
        started = time.perf_counter()
        service = DedupService(state, None if base else params_for(0.8, 128, 5), index_url=base)
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
        service.close()
    return out


# -- datasketch --------------------------------------------------------------------------------
def run_datasketch(docs: list[tuple[str, str]], base: str | None) -> dict:
    import re

    from datasketch import MinHash, MinHashLSH

    word = re.compile(r"\w+")
    started = time.perf_counter()
    lsh = MinHashLSH(threshold=0.8, num_perm=128)
    if base:
        from gristmill.pipeline.format.signature_index import load_index

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
    from gristmill.dedup.lsh import band_hashes
    from gristmill.dedup.normalize import content_hashes
    from gristmill.pipeline.format.signature_index import SignatureTable, params_for, write_index

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


# -- resident memory and load time at scale ------------------------------------------------------
def build_synthetic(count: int, path: str, chunk: int = 250_000) -> None:
    """A corpus index of ``count`` documents with random signatures (no text: only sizes are measured),
    written in files of ``chunk`` documents as the batch job writes them."""
    from gristmill.dedup.lsh import band_hashes
    from gristmill.pipeline.format.signature_index import SignatureTable, params_for, write_index

    def hash_hex(words: np.ndarray) -> list[str]:
        raw = words.astype(">u8").tobytes().hex()
        return [raw[i : i + 32] for i in range(0, len(raw), 32)]

    params = params_for(0.8, 128, 5)
    rng = np.random.default_rng(0)

    def tables():
        for start in range(0, count, chunk):
            n = min(chunk, count - start)
            signatures = rng.integers(0, 2**63, size=(n, params.num_perm), dtype=np.uint64)
            yield SignatureTable(ids=[f"doc-{i:010d}" for i in range(start, start + n)],
                                 content_hashes=hash_hex(rng.integers(0, 2**63, size=(n, 2), dtype=np.uint64)),
                                 lengths=rng.integers(100, 10_000, size=n), signatures=signatures,
                                 bands=band_hashes(signatures, params.bands, params.rows))

    write_index(path, params, tables() if chunk < count else next(tables()))  # one table: what older versions take


def anonymous_bytes(pid: int) -> int:
    """Resident anonymous memory (heap, arrays; not memory-mapped files) of a process."""
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon for {pid}")


def start_sampled(state: str, index: str | None, checkout: Path) -> tuple[subprocess.Popen, str, float, int]:
    """Start a server, sampling its anonymous memory until it listens: (process, URL, seconds, peak bytes)."""
    import threading

    started = time.perf_counter()
    proc = launch(state, index, checkout=checkout)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            try:
                peak[0] = max(peak[0], anonymous_bytes(proc.pid))
            except (OSError, RuntimeError):
                return
            time.sleep(0.02)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        url = listening(proc)
    finally:
        seconds = time.perf_counter() - started
        done.set()
        thread.join()
    return proc, url, seconds, max(peak[0], anonymous_bytes(proc.pid))


def add_synthetic(url: str, count: int, first: int) -> None:
    """``count`` new documents (60 random words each) through ``/add`` in batches of 256."""
    import urllib.request

    rng = np.random.default_rng(first)
    for start in range(first, first + count, 256):
        words = rng.integers(0, 1 << 40, size=(min(256, first + count - start), 60))
        body = json.dumps({"documents": [{"id": f"add-{start + i}", "text": " ".join(f"w{w}" for w in row)}
                                         for i, row in enumerate(words)]}).encode()
        request = urllib.request.Request(f"{url}/add", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()


def wait_for_snapshot(state: str, proc: subprocess.Popen, timeout: float = 3600) -> None:
    deadline = time.time() + timeout
    while not any(n.startswith("snapshot.") and not n.endswith(".tmp") for n in os.listdir(state)):
        if time.time() > deadline or proc.poll() is not None:
            raise SystemExit(f"no snapshot in {state}")
        time.sleep(0.5)


def measure_size(count: int, index: str, scratch: str, checkout: Path, adds: int) -> dict:
    """Load time, resident and peak anonymous bytes per document of ``gristmill serve --index``, the
    resident bytes per document added through ``/add``, and (with snapshots) the restart from one."""
    out: dict = {}
    with tempfile.TemporaryDirectory(dir=scratch) as state:
        proc, _, _, _ = start_sampled(state + "/empty", None, checkout)
        empty = anonymous_bytes(proc.pid)
        proc.terminate()
        proc.wait(timeout=60)
        proc, url, out["load_s"], peak = start_sampled(state + "/s", index, checkout)
        try:
            out["resident_b_per_doc"] = (anonymous_bytes(proc.pid) - empty) / count
            out["peak_b_per_doc"] = (peak - empty) / count
            snapshotting = os.path.exists(os.path.join(state, "s", "rows.u64"))
            if snapshotting:
                wait_for_snapshot(state + "/s", proc)
            add_synthetic(url, adds, first=0)  # past what the load freed and the allocator still holds
            before = anonymous_bytes(proc.pid)
            add_synthetic(url, adds, first=adds)
            out["add_b_per_doc"] = (anonymous_bytes(proc.pid) - before) / adds
        finally:
            proc.terminate()
            proc.wait(timeout=600)
        if snapshotting:  # the restart loads the snapshot (and replays the adds' log)
            proc, _, out["restart_s"], peak = start_sampled(state + "/s", index, checkout)
            out["restart_resident_b_per_doc"] = (anonymous_bytes(proc.pid) - empty) / (count + 2 * adds)
            proc.terminate()
            proc.wait(timeout=600)
    return out


def sizes_table(sizes: list[int], runs: int, adds: int, landed: Path | None) -> None:
    """Print the memory table: this checkout (and ``landed``, at the smallest size) at every size."""
    print("| version | documents | load s | resident B/doc | peak B/doc (loading) | B/doc added by /add "
          "| restart from snapshot s | resident B/doc after restart |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(dir=os.environ.get("SERVICE_SCRATCH")) as scratch:
        for count in sizes:
            index = os.path.join(scratch, f"index-{count}")
            started = time.perf_counter()
            # written by the oldest version measured, so that every version reads it
            code = (f"import sys, service_load; sys.path.insert(0, {str(landed or REPO)!r}); "
                    f"service_load.build_synthetic({count}, {index!r}, {count if landed else 250_000})")
            subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO / "benchmarks")
            print(f"built {count:,} documents in {time.perf_counter() - started:.0f} s", file=sys.stderr)
            versions = [("this checkout", REPO)]
            if landed is not None and count == min(sizes):
                versions.insert(0, (f"landed ({landed.name})", landed))
            for name, checkout in versions:
                rows = [measure_size(count, index, scratch, checkout, adds) for _ in range(runs)]
                med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
                restart = (f"{med['restart_s']:.1f} | {med['restart_resident_b_per_doc']:,.0f}" if "restart_s" in med
                           else "- (no snapshot) | -")
                print(f"| {name} | {count:,} | {med['load_s']:.1f} | {med['resident_b_per_doc']:,.0f} | "
                      f"{med['peak_b_per_doc']:,.0f} | {med['add_b_per_doc']:,.0f} | {restart} |", flush=True)
            shutil.rmtree(index)


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


def durable_table(docs: list[tuple[str, str]], runs: int, clients: int, latency: float) -> None:
    """``--shards 2`` with the state on a shaped store against local state folders, side by side."""
    import uuid

    import s3fs
    from moto.server import ThreadedMotoServer

    sys.path.insert(0, str(REPO / "benchmarks"))
    from shaped_store import Shape, ShapedStore

    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    try:
        with ShapedStore(f"http://{host}:{port}", Shape(latency=latency)) as store:
            os.environ["AWS_ENDPOINT_URL"] = store.endpoint  # the front and the shards (Ray workers) inherit it
            fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": store.endpoint}, skip_instance_cache=True)

            def on_store(batch: int) -> dict:
                bucket = f"bench-{uuid.uuid4().hex[:8]}"
                fs.mkdir(bucket)
                return run_http(docs, batch, clients, None, shards=2, state_dir=f"s3://{bucket}/state")

            print("| --shards 2, state | batch | mode | docs/s | durable / local | p50 ms / request | p99 ms / request |")
            print("|---|---|---|---:|---:|---:|---:|")
            for batch in (1, 64):
                local = summarise([run_http(docs, batch, clients, None, shards=2) for _ in range(runs)])
                durable = summarise([on_store(batch) for _ in range(runs)])
                for name, row in (("local folders (fsync)", local),
                                  (f"s3 via shaped store ({latency * 1000:g} ms)", durable)):
                    for mode in ("check+add", "check"):
                        r = row[mode]
                        ratio = r["docs_per_s"] / local[mode]["docs_per_s"]
                        print(f"| {name} | {batch} | {mode} | {r['docs_per_s']:,.0f} | {ratio:.2f} | {r['p50_ms']:.1f} "
                              f"| {r['p99_ms']:.1f} |", flush=True)
            print(json.dumps(store.stats()["kinds"]), file=sys.stderr)
    finally:
        moto.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=3000, help="documents per pass (default %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per configuration (default %(default)s)")
    parser.add_argument("--clients", type=int, default=4, help="HTTP requests in flight (default %(default)s)")
    parser.add_argument("--base", type=int, default=0, help="synthetic documents loaded first (default 0)")
    parser.add_argument("--sizes", help="instead: memory and load time at these index sizes (comma-separated)")
    parser.add_argument("--adds", type=int, default=50_000,
                        help="with --sizes: documents added through /add twice, memory measured over the second")
    parser.add_argument("--landed", type=Path, metavar="CHECKOUT",
                        help="with --sizes: also measure this checkout of an earlier gristmill (smallest size only)")
    parser.add_argument("--durable", action="store_true",
                        help="instead: --shards 2 with the state on a shaped store against local state folders")
    parser.add_argument("--latency", type=float, default=0.02,
                        help="with --durable: the store's seconds per request (default %(default)s)")
    args = parser.parse_args()
    if args.durable:
        durable_table(load_documents(args.docs), args.runs, args.clients, args.latency)
        return
    if args.sizes:
        sizes_table([int(n) for n in args.sizes.split(",")], args.runs, args.adds, args.landed)
        return
    docs = load_documents(args.docs)
    print(f"{len(docs)} documents, {sum(len(t) for _, t in docs) / 1e6:.1f} M characters; base {args.base}; "
          f"{args.runs} runs each; {os.cpu_count()} CPUs (shared)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as scratch:
        base = build_base(args.base, scratch) if args.base else None
        configs: list[tuple[str, str, Callable[[], dict]]] = [
            ("gristmill serve, HTTP", "1", lambda: run_http(docs, 1, args.clients, base)),
            ("gristmill serve, HTTP", "64", lambda: run_http(docs, 64, args.clients, base)),
            ("gristmill serve --shards 2, HTTP", "1", lambda: run_http(docs, 1, args.clients, base, shards=2)),
            ("gristmill serve --shards 2, HTTP", "64", lambda: run_http(docs, 64, args.clients, base, shards=2)),
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
