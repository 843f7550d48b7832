"""The loader against an object store with real latency: gristmill vs mosaicml-streaming, litdata, pyarrow.

moto's S3 server (a process of its own) behind the shaping proxy of ``shaped_store.py`` (another process):
every tool reads the same corpus, converted to its own format before timing, from the same shaped
endpoint, with shuffle on, 32 documents a batch as Python strings, 0 and 2 DataLoader workers, at
several link settings. Every trial is a fresh process with an empty local cache; tools alternate
within each repeat so background load hits them alike.

    .venv-bench/bin/python benchmarks/loader_speed.py prepare --data bench-data/loader-remote --mb 200
    .venv-bench/bin/python benchmarks/loader_remote.py run --data bench-data/loader-remote --repeats 3

Beside the tools, in the same run: ``raw-reads`` reads every row group's byte range through the same
link with 64 reads in flight and decodes nothing (what the store and this machine can deliver), and
``gristmill-local`` reads the corpus from local disk (what this machine's CPU can decode). The link's
capacity is ``min(total cap, connections x per-connection cap)``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import loader_speed  # noqa: E402  (the local benchmark: its trial loop and competitors' helpers)
from loader_speed import BATCH, _identity, _import_streaming, _texts_collate  # noqa: E402

from gristmill.pipeline.report.progress import progress_bar  # noqa: E402

BUCKET = "bench"
FOLDERS = {"gristmill": "gristmill", "mosaic": "mds", "litdata": "litdata"}  # what each tool reads
SETTINGS = {"20ms-100MBps": {"latency": 0.02, "conn_mbps": 100.0}, "100ms-40MBps": {"latency": 0.1, "conn_mbps": 40.0}}
TOOLS = ["gristmill", "gristmill-4-reads", "mosaic", "litdata", "pyarrow-s3fs", "raw-reads", "gristmill-local"]
CEILINGS = {"raw-reads", "gristmill-local"}  # reference points, not competitors
ABLATIONS = {"gristmill-4-reads"}  # gristmill as it was: at most 4 reads in flight


def endpoint() -> str:
    return os.environ["AWS_ENDPOINT_URL"]


def s3_options() -> dict[str, Any]:
    return {"client_kwargs": {"endpoint_url": endpoint()}, "skip_instance_cache": True}


# -- the tools against the shaped store (one trial = one fresh process) ------------------------------
class _PyArrowS3:
    """Plain pyarrow over s3fs: shuffled row groups read into Python strings, 32 at a time.

    Each process (a DataLoader worker too) opens its own s3fs and files: s3fs refuses to run in a child
    forked after it started. Files are opened with ``cache_type="none"`` so a row group costs the ranged
    reads pyarrow asks for; s3fs's default (a 50 MiB read-ahead block) would read most of a shard for
    every 4 MiB row group.
    """

    def __init__(self, files: list[str], seed: int) -> None:
        import pyarrow.parquet as pq
        import s3fs

        fs = s3fs.S3FileSystem(**s3_options())
        self.groups = [(path, group) for path in files
                       for group in range(pq.ParquetFile(fs.open(path, cache_type="none")).num_row_groups)]
        random.Random(seed).shuffle(self.groups)

    def __iter__(self) -> Iterator[list[str]]:
        import pyarrow.parquet as pq
        import s3fs

        fs = s3fs.S3FileSystem(**s3_options())
        info = loader_speed._worker_info()
        mine = self.groups if info is None else self.groups[info.id::info.num_workers]
        handles: dict[str, Any] = {}
        for path, group in mine:
            if path not in handles:
                handles[path] = pq.ParquetFile(fs.open(path, cache_type="none"))
            texts = handles[path].read_row_group(group, columns=["text"]).column("text").to_pylist()
            random.Random(group).shuffle(texts)
            for start in range(0, len(texts), BATCH):
                yield texts[start:start + BATCH]


def make_loader(tool: str, data: str, workers: int) -> tuple[Iterable[Any], Any]:
    """The tool's loader over the shaped store (``data`` is the local prepared folder) and a texts getter."""
    from torch.utils.data import DataLoader, IterableDataset

    if tool.startswith("gristmill"):
        from gristmill.loaders import StreamingLoader
        from gristmill.loaders.torch_dataset import StreamingDataLoader, StreamingDataset

        local = tool == "gristmill-local"
        url = os.path.join(data, "gristmill") if local else f"s3://{BUCKET}/gristmill"
        args: dict[str, Any] = {"batch_size": BATCH, "columns": ["text"], "world_size": 1, "rank": 0}
        if not local:
            args["storage_options"] = s3_options()
        if tool == "gristmill-4-reads":
            args["max_reads"] = 4
        if workers == 0:
            loader: Iterable[Any] = StreamingLoader(url, **args)
        else:
            loader = StreamingDataLoader(StreamingDataset(url, **args), num_workers=workers)
        return loader, lambda b: b["text"]
    if tool == "pyarrow-s3fs":
        import s3fs

        files = sorted(s3fs.S3FileSystem(**s3_options()).glob(f"{BUCKET}/gristmill/*.parquet"))

        class Dataset(_PyArrowS3, IterableDataset):
            pass

        return DataLoader(Dataset(files, seed=0), batch_size=None, num_workers=workers), _identity
    if tool == "mosaic":
        streaming = _import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        dataset = streaming.StreamingDataset(remote=f"s3://{BUCKET}/mds", local=_fresh_cache(), shuffle=True,
                                             shuffle_seed=0, batch_size=BATCH)
        return DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=_texts_collate), _identity
    if tool == "litdata":
        import litdata
        from litdata.streaming import downloader

        # litdata downloads chunks with obstore, whose HTTP client refuses a plain-http endpoint unless told
        # allow_http, which litdata never passes (a "builder error"): the one option this benchmark adds.
        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = "true"

        dataset = litdata.StreamingDataset(f"s3://{BUCKET}/litdata", shuffle=True, seed=0, cache_dir=_fresh_cache(),
                                           storage_options={"endpoint_url": endpoint()})
        loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers,
                                             collate_fn=_texts_collate)
        return loader, _identity
    if tool == "raw-reads":
        return _RawReads(), lambda b: []
    raise ValueError(f"unknown tool {tool!r}")


class _RawReads:
    """Every row group's bytes through the link, 64 reads in flight, nothing decoded: the store's ceiling."""

    def __iter__(self) -> Iterator[bytes]:
        import s3fs

        from gristmill.pipeline.format import Corpus

        corpus = Corpus.open(f"s3://{BUCKET}/gristmill", s3_options())
        fs = s3fs.S3FileSystem(**s3_options())
        ranges = [(corpus.shard_path(s), rg.offset, rg.offset + rg.length) for s in corpus.shards
                  for rg in s.row_groups]
        with ThreadPoolExecutor(64) as pool:
            yield from pool.map(lambda r: fs.cat_file(r[0], start=r[1], end=r[2]), ranges)


def _fresh_cache() -> str:
    """An empty local cache folder for one trial (removed when the trial's process ends)."""
    folder = tempfile.mkdtemp(prefix="loader-remote-cache-")
    import atexit

    atexit.register(shutil.rmtree, folder, True)
    return os.path.join(folder, "cache")


def import_tool(tool: str) -> None:
    import torch.utils.data  # noqa: F401

    modules = {"mosaic": [], "litdata": ["litdata"], "pyarrow-s3fs": ["pyarrow.parquet", "s3fs"],
               "raw-reads": ["s3fs"]}.get(tool, ["loaders", "gristmill.loaders.torch_dataset", "s3fs"])
    if tool == "mosaic":
        _import_streaming()
    for module in modules:
        __import__(module)


def trial(tool: str, data: str, workers: int) -> dict[str, Any]:
    """loader_speed's trial loop (clock, CPU, peak memory, first batch) with this benchmark's tools."""
    loader_speed.make_loader = make_loader
    loader_speed.import_tool = import_tool
    return loader_speed.trial(tool, data, workers)


# -- the store: moto and the proxy, each a process of its own ---------------------------------------
def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(url: str) -> None:
    for _ in range(300):
        try:
            urllib.request.urlopen(url, timeout=2).read()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def _control(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(endpoint() + path, method="POST" if body is not None else "GET",
                                     data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def start_store() -> list[subprocess.Popen]:
    """moto, then the proxy in front of it; sets AWS_ENDPOINT_URL (and S3_ENDPOINT_URL) to the proxy."""
    moto_port = _free_port()
    moto = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(moto_port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(f"http://127.0.0.1:{moto_port}/moto-api/")
    port_file = os.path.join(tempfile.mkdtemp(prefix="loader-remote-"), "port")
    proxy = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "shaped_store.py"),
                              "--upstream", f"http://127.0.0.1:{moto_port}", "--port-file", port_file])
    for _ in range(300):
        if os.path.exists(port_file) and open(port_file).read():
            break
        time.sleep(0.1)
    url = f"http://127.0.0.1:{open(port_file).read()}"
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": url, "S3_ENDPOINT_URL": url})
    return [proxy, moto]


def upload(data: str) -> dict[str, int]:
    """Each tool's prepared folder into the bucket (unshaped), each object read once to warm the proxy."""
    import s3fs

    fs = s3fs.S3FileSystem(**s3_options())
    fs.mkdir(BUCKET)
    sizes = {}
    for tool, folder in FOLDERS.items():
        fs.put(os.path.join(data, folder), f"{BUCKET}/{folder}", recursive=True)
        files = fs.find(f"{BUCKET}/{folder}")
        for path in files:
            fs.cat_file(path)
        sizes[tool] = sum(fs.size(path) for path in files)
    return sizes


def _run_trial(command: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    """The trial's process, or None when it hung: then its whole process group (workers too) is killed."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            return None
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def run(data: str, repeats: int, workers: list[int], tools: list[str], settings: list[str],
        total_mbps: float | None, out: str, trial_timeout: float) -> None:
    with open(os.path.join(data, "prepare.json")) as handle:
        prepared = json.load(handle)
    processes = start_store()
    results: list[dict[str, Any]] = []
    failures: list[dict[str, Any]] = []
    try:
        prepared["stored_bytes"] = upload(data)
        trials = [(s, r, t, w) for s, r, t, w in itertools.product(settings, range(repeats), tools, workers)
                  if not (t in CEILINGS and w)]
        with progress_bar(total=len(trials), unit="trial", desc="remote loader benchmark") as bar:
            for setting, repeat, tool, count in trials:
                bar.set_postfix_str(f"{setting} {tool}, {count} workers")
                if any((f["tool"], f["workers"]) == (tool, count) for f in failures):
                    bar.update(1)  # a tool that failed (or hung) once is not run again at that worker count
                    continue
                _control("/__shape__", dict(SETTINGS[setting], total_mbps=total_mbps))
                _control("/__stats__", {})  # reset
                command = [sys.executable, os.path.abspath(__file__), "trial", "--data", data, "--tool", tool,
                           "--workers", str(count)]
                done = _run_trial(command, trial_timeout)
                if done is None:
                    bar.update(1)
                    bar.write(f"{tool} workers={count} {setting}: no end within {trial_timeout} s, stopped")
                    failures.append({"tool": tool, "workers": count, "setting": setting, "error": "timeout"})
                    continue
                bar.update(1)
                if done.returncode != 0:
                    bar.write(f"{tool} workers={count} {setting} failed:\n{done.stderr[-3000:]}")
                    failures.append({"tool": tool, "workers": count, "setting": setting,
                                     "error": done.stderr.strip().splitlines()[-1][:300] if done.stderr else ""})
                    continue
                result = json.loads(done.stdout.strip().splitlines()[-1])
                result.update(repeat=repeat, setting=setting, store=_control("/__stats__"))
                results.append(result)
                bar.write(json.dumps(result))
    finally:
        for process in processes:
            process.terminate()
            process.wait()
    with open(out, "w") as handle:
        json.dump({"prepared": prepared, "settings": SETTINGS, "total_mbps": total_mbps, "results": results,
                   "failures": failures}, handle, indent=1)
    print(table(prepared, results, total_mbps))
    for failure in failures:
        print(f"failed: {failure}")


def table(prepared: dict[str, Any], results: list[dict[str, Any]], total_mbps: float | None) -> str:
    """Medians per setting, tool and workers: text MB/s, stored MB/s, against the best competitor."""
    text_mb = prepared["text_bytes"] / 1e6
    stored = prepared["stored_bytes"]
    median = statistics.median
    rows = ["| link | tool | workers | MB/s text | stored MB/s | vs best other | after first batch: MB/s text "
            "| vs best other | first batch s | connections | 503s | runs |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    summary: dict[tuple[str, str, int], dict[str, float]] = {}
    keys = sorted({(r["setting"], r["tool"], r["workers"]) for r in results},
                  key=lambda k: (list(SETTINGS).index(k[0]), k[2], TOOLS.index(k[1])))
    for key in keys:
        runs = [r for r in results if (r["setting"], r["tool"], r["workers"]) == key]
        tool = key[1]
        size = stored["gristmill"] if tool.startswith("gristmill") or tool in ("pyarrow-s3fs", "raw-reads") \
            else stored[tool]
        seconds = median(r["seconds"] for r in runs)
        # streaming alone: the epoch's text over its time after the first batch (opening excluded)
        steady = median(text_mb / max(r["seconds"] - (r["first_batch"] or 0), 1e-9) for r in runs)
        summary[key] = {"text": text_mb / seconds if tool != "raw-reads" else 0.0, "stored": size / 1e6 / seconds,
                        "steady": steady if tool != "raw-reads" else 0.0,
                        "first": median(r["first_batch"] or 0 for r in runs),
                        "connections": median(r["store"]["connections"] for r in runs),
                        "throttled": median(r["store"]["throttled"] for r in runs), "runs": len(runs)}
    for (setting, tool, workers), s in summary.items():
        def versus(figure: str, setting: str = setting, workers: int = workers, tool: str = tool) -> str:
            others = [v[figure] for (g, t, w), v in summary.items() if g == setting and w == workers
                      and not t.startswith("gristmill") and t not in CEILINGS]
            mine = summary[(setting, tool, workers)][figure]
            return f"{mine / max(others):.2f}×" if others and tool.startswith("gristmill") and tool not in CEILINGS \
                else ""

        label = {"raw-reads": "raw-reads (link ceiling: bytes only)",
                 "gristmill-local": "gristmill-local (CPU ceiling: local disk)",
                 "gristmill-4-reads": "gristmill, max_reads=4 (as before)"}.get(tool, tool)
        text = f"{s['text']:.0f}" if tool != "raw-reads" else "–"
        steady = f"{s['steady']:.0f}" if tool != "raw-reads" else "–"
        rows.append(f"| {setting} | {label} | {workers} | {text} | {s['stored']:.0f} | {versus('text')} | {steady} "
                    f"| {versus('steady')} | {s['first']:.3f} | {s['connections']:.0f} | {s['throttled']:.0f} "
                    f"| {s['runs']} |")
    cap = f"{total_mbps:.0f} MB/s in all" if total_mbps else "no total cap"
    rows.append(f"\nstored bytes: {', '.join(f'{k} {v / 1e6:.0f} MB' for k, v in stored.items())}; "
                f"text {text_mb:.0f} MB; link: {cap}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--data", default="bench-data/loader-remote")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    r.add_argument("--tools", nargs="+", default=TOOLS, choices=TOOLS)
    r.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    r.add_argument("--total-mbps", type=float, default=None, help="a cap on all connections together")
    r.add_argument("--out", default="bench-data/loader-remote/results.json")
    r.add_argument("--trial-timeout", type=float, default=300, help="seconds before a hung trial is stopped")
    t = sub.add_parser("trial")
    t.add_argument("--data", required=True)
    t.add_argument("--tool", required=True, choices=TOOLS)
    t.add_argument("--workers", type=int, required=True)
    args = parser.parse_args()
    if args.command == "run":
        run(args.data, args.repeats, args.workers, args.tools, args.settings, args.total_mbps, args.out,
            args.trial_timeout)
    else:
        print(json.dumps(trial(args.tool, args.data, args.workers)))


if __name__ == "__main__":
    main()
