"""Loader speed: gristmill vs mosaicml-streaming, litdata (optimize and Parquet) and plain pyarrow.

The same real text (Python sources and docs found on this machine) is read with shuffle on, 32
documents a batch, as Python strings, with 0 and 2 DataLoader workers. Every measurement runs in a
fresh process; the tools alternate within each repeat so that background load hits them alike.

    .venv-bench/bin/python benchmarks/loader_speed.py prepare --data bench-data/loader --mb 300
    .venv-bench/bin/python benchmarks/loader_speed.py run --data bench-data/loader --repeats 3

Reported per tool and worker count (median of the repeats): MB/s of text (= byte tokens/s), CPU
seconds per million byte tokens (this process plus its workers), time to first batch, peak memory
(summed RSS of the process and its workers, sampled every 20 ms), and the one-off conversion time.
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gristmill.pipeline.report.progress import progress_bar

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH = 32
SOURCES = ["/root/.pyenv/versions/*/lib/**/*.py", "/root/.pyenv/versions/*/lib/**/*.txt",
           "/root/.pyenv/versions/*/lib/**/*.rst", "/usr/share/doc/**/*.txt", "/usr/share/doc/**/*.rst",
           "/usr/share/doc/**/*.py"]


# -- preparation -------------------------------------------------------------------------------------
def collect_texts(limit_bytes: int) -> Iterator[tuple[str, str]]:
    """Real text files, in a fixed order, until ``limit_bytes`` of UTF-8 text."""
    paths = sorted({p for pattern in SOURCES for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)})
    total = 0
    for path in paths:
        try:
            with open(path, "rb") as handle:
                text = handle.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        if not text.strip():
            continue
        yield path, text
        total += len(text.encode("utf-8"))
        if total >= limit_bytes:
            return


def timed(label: str, action: Callable[[], Any], times: dict[str, float]) -> None:
    began = time.perf_counter()
    action()
    times[label] = time.perf_counter() - began
    print(f"  {label}: {times[label]:.1f} s", flush=True)


def prepare(data: str, megabytes: int, copies: int = 1) -> None:
    """Every tool's format of the same documents; ``copies`` > 1 repeats them (new ids), for corpora
    larger than this machine's text: a loader's speed does not depend on the documents being distinct."""
    from gristmill.pipeline.format import ShardWriter

    if os.path.exists(data):
        shutil.rmtree(data)
    os.makedirs(data)
    texts = list(collect_texts(megabytes * 1_000_000))
    docs = [(f"{path}#{copy}" if copy else path, text) for copy in range(copies) for path, text in texts]
    text_bytes = sum(len(t.encode("utf-8")) for _, t in docs)
    print(f"{len(docs)} documents, {text_bytes / 1e6:.0f} MB of text", flush=True)
    times: dict[str, float] = {}

    def gristmill() -> None:
        writer = ShardWriter(os.path.join(data, "gristmill"), shard_bytes=64 * 1024**2)
        for start in range(0, len(docs), 1000):
            writer.write([{"id": p, "text": t} for p, t in docs[start:start + 1000]])
        writer.commit()

    def mds() -> None:
        from streaming import MDSWriter

        with MDSWriter(out=os.path.join(data, "mds"), columns={"text": "str"}, compression="zstd",
                       size_limit=1 << 26) as writer:
            for _, text in docs:
                writer.write({"text": text})

    def litdata_optimize() -> None:
        import litdata

        chunks = [[t for _, t in docs[i:i + 500]] for i in range(0, len(docs), 500)]
        litdata.optimize(fn=_litdata_items, inputs=chunks, output_dir=os.path.join(data, "litdata"),
                         chunk_bytes="64MB", compression="zstd", num_workers=2, mode="overwrite")

    def litdata_parquet() -> None:
        from litdata import index_parquet_dataset

        folder = os.path.join(data, "parquet")
        os.makedirs(folder)
        for path in glob.glob(os.path.join(data, "gristmill", "*.parquet")):
            os.link(path, os.path.join(folder, os.path.basename(path)))
        index_parquet_dataset(folder)

    timed("gristmill", gristmill, times)
    timed("mds", mds, times)
    timed("litdata-optimize", litdata_optimize, times)
    timed("litdata-parquet", litdata_parquet, times)
    with open(os.path.join(data, "prepare.json"), "w") as handle:
        json.dump({"documents": len(docs), "text_bytes": text_bytes, "conversion_seconds": times}, handle)


def _litdata_items(texts: list[str]) -> Iterator[dict[str, str]]:
    for text in texts:
        yield {"text": text}


# -- one trial: one tool, one worker count, one fresh process ---------------------------------------
def _identity(batch: Any) -> Any:
    return batch


def _texts_collate(samples: list[Any]) -> list[str]:
    return [s["text"] if isinstance(s, dict) else s for s in samples]


class _PyArrowRowGroups:
    """Plain pyarrow: shuffled row groups read into Python strings, 32 at a time (split across workers)."""

    def __init__(self, files: list[str], seed: int) -> None:
        import pyarrow.parquet as pq

        self.files = files
        self.groups = [(f, g) for f in files for g in range(pq.ParquetFile(f).num_row_groups)]
        random.Random(seed).shuffle(self.groups)

    def __iter__(self) -> Iterator[list[str]]:
        import pyarrow.parquet as pq

        info = _worker_info()
        mine = self.groups if info is None else self.groups[info.id::info.num_workers]
        handles: dict[str, Any] = {}
        for path, group in mine:
            handle = handles.setdefault(path, pq.ParquetFile(path))
            texts = handle.read_row_group(group, columns=["text"]).column("text").to_pylist()
            random.Random(group).shuffle(texts)
            for start in range(0, len(texts), BATCH):
                yield texts[start:start + BATCH]


class _PyArrowAllCores(_PyArrowRowGroups):
    """The same reading with every core decoding row groups (a few ahead) while this thread makes strings.

    Not a loader (no shuffle buffer, no resume, no bound on what a row group decodes to): the ceiling
    for any reader that decodes blocks on background threads and makes strings in one consuming thread.
    """

    def __iter__(self) -> Iterator[list[str]]:
        import pyarrow.parquet as pq

        metadata = {path: pq.ParquetFile(path).metadata for path in self.files}
        threads = os.cpu_count() or 1

        def decode(path: str, group: int) -> Any:
            return pq.ParquetFile(path, metadata=metadata[path]).read_row_group(group, columns=["text"],
                                                                                use_threads=False)

        with ThreadPoolExecutor(threads) as pool:
            waiting = iter(self.groups)
            ahead = deque((g, pool.submit(decode, *g)) for g in itertools.islice(waiting, 2 * threads))
            while ahead:
                (_, group), done = ahead.popleft()
                texts = done.result().column("text").to_pylist()
                following = next(waiting, None)
                if following is not None:
                    ahead.append((following, pool.submit(decode, *following)))
                random.Random(group).shuffle(texts)
                for start in range(0, len(texts), BATCH):
                    yield texts[start:start + BATCH]


def _worker_info() -> Any:
    from torch.utils.data import get_worker_info

    return get_worker_info()


def _import_streaming() -> Any:
    """mosaicml-streaming imports torchvision, which a CPU-only torch may lack: stand in for it then."""
    try:
        import streaming
    except ImportError:
        import types

        for name in ("torchvision", "torchvision.datasets", "torchvision.transforms",
                     "torchvision.transforms.functional"):
            sys.modules[name] = types.ModuleType(name)
        sys.modules["torchvision.datasets"].VisionDataset = object  # type: ignore[attr-defined]
        sys.modules["torchvision.transforms.functional"].to_tensor = None  # type: ignore[attr-defined]
        import streaming
    return streaming


def make_loader(tool: str, data: str, workers: int) -> tuple[Iterable[Any], Callable[[Any], list[str]]]:
    """The tool's loader over the prepared data and a function giving a batch's texts."""
    from torch.utils.data import DataLoader, IterableDataset

    if tool in ("gristmill", "gristmill-tokens"):
        from gristmill.loaders import StreamingLoader
        from gristmill.loaders.torch_dataset import StreamingDataLoader, StreamingDataset

        url = os.path.join(data, "gristmill")
        args: dict[str, Any] = {"batch_size": BATCH, "columns": ["text"], "world_size": 1, "rank": 0}
        if tool == "gristmill-tokens":
            args.update(batch_size=8, seq_len=4096)
        if workers == 0:
            loader: Iterable[Any] = StreamingLoader(url, **args)
        else:
            loader = StreamingDataLoader(StreamingDataset(url, **args), num_workers=workers)
        if tool == "gristmill-tokens":
            return loader, lambda b: b["tokens"]
        return loader, lambda b: b["text"]
    if tool == "pyarrow":
        files = sorted(glob.glob(os.path.join(data, "gristmill", "*.parquet")))

        class Dataset(_PyArrowRowGroups, IterableDataset):
            pass

        return DataLoader(Dataset(files, seed=0), batch_size=None, num_workers=workers), _identity
    if tool == "pyarrow-all-cores":
        files = sorted(glob.glob(os.path.join(data, "gristmill", "*.parquet")))
        return _PyArrowAllCores(files, seed=0), _identity
    if tool == "mosaic":
        streaming = _import_streaming()
        from streaming.base.util import clean_stale_shared_memory

        clean_stale_shared_memory()
        dataset = streaming.StreamingDataset(local=os.path.join(data, "mds"), shuffle=True, shuffle_seed=0,
                                             batch_size=BATCH)
        return DataLoader(dataset, batch_size=BATCH, num_workers=workers, collate_fn=_texts_collate), _identity
    if tool in ("litdata-optimize", "litdata-parquet"):
        import litdata

        if tool == "litdata-optimize":
            dataset = litdata.StreamingDataset(os.path.join(data, "litdata"), shuffle=True, seed=0)
        else:
            from litdata.streaming.item_loader import ParquetLoader

            dataset = litdata.StreamingDataset(os.path.join(data, "parquet"), shuffle=True, seed=0,
                                               item_loader=ParquetLoader())
        # litdata refuses fork for its Parquet loader (Polars deadlocks after fork): spawn, as it asks
        context = {"multiprocessing_context": "spawn"} if workers and tool == "litdata-parquet" else {}
        loader = litdata.StreamingDataLoader(dataset, batch_size=BATCH, num_workers=workers,
                                             collate_fn=_texts_collate, **context)
        return loader, _identity
    raise ValueError(f"unknown tool {tool!r}")


def _peak_memory(stop: threading.Event, peak: list[int]) -> None:
    import psutil

    me = psutil.Process()
    while not stop.wait(0.02):
        try:
            total = me.memory_info().rss + sum(c.memory_info().rss for c in me.children(recursive=True))
        except psutil.Error:
            continue
        peak[0] = max(peak[0], total)


def import_tool(tool: str) -> None:
    """Import what a tool needs before the clock starts: time to first batch excludes import time."""
    import torch.utils.data  # noqa: F401

    if tool == "mosaic":
        _import_streaming()
    modules = {"gristmill": ["loaders", "gristmill.loaders.torch_dataset"], "gristmill-tokens": ["loaders", "gristmill.loaders.torch_dataset"],
               "pyarrow": ["pyarrow.parquet"], "pyarrow-all-cores": ["pyarrow.parquet"], "mosaic": [], "litdata-optimize": ["litdata"],
               "litdata-parquet": ["litdata", "litdata.streaming.item_loader", "polars"]}[tool]
    for module in modules:
        __import__(module)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def trial(tool: str, data: str, workers: int) -> dict[str, Any]:
    import_tool(tool)
    cpu_before = _cpu_seconds()
    stop, peak = threading.Event(), [0]
    sampler = threading.Thread(target=_peak_memory, args=(stop, peak), daemon=True)
    sampler.start()
    began = time.perf_counter()
    loader, texts_of = make_loader(tool, data, workers)
    first = None
    docs = chars = tokens = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - began
        texts = texts_of(batch)
        if tool == "gristmill-tokens":
            tokens += int(texts.numel() if hasattr(texts, "numel") else texts.size)
        else:
            docs += len(texts)
            chars += sum(map(len, texts))
    seconds = time.perf_counter() - began
    stop.set()
    del loader
    cpu = _cpu_seconds() - cpu_before  # workers are reaped by now (no persistent workers), so they count
    return {"tool": tool, "workers": workers, "seconds": seconds, "first_batch": first, "docs": docs,
            "chars": chars, "tokens": tokens, "cpu": cpu, "peak_bytes": peak[0]}


# -- the comparison ----------------------------------------------------------------------------------
TOOLS = ["gristmill", "pyarrow", "mosaic", "litdata-optimize", "litdata-parquet", "gristmill-tokens",
         "pyarrow-all-cores"]
CEILINGS = {"pyarrow-all-cores"}  # reference points, not competitors: no ratio is taken against them


def run(data: str, repeats: int, workers: list[int], tools: list[str], out: str) -> None:
    with open(os.path.join(data, "prepare.json")) as handle:
        prepared = json.load(handle)
    results: list[dict[str, Any]] = []
    trials = [(r, t, w) for r, t, w in itertools.product(range(repeats), tools, workers)
              if not (t in CEILINGS and w)]  # with workers, all cores already decode
    with progress_bar(total=len(trials), unit="trial", desc="loader benchmark") as bar:
        for repeat, tool, count in trials:
            bar.set_postfix_str(f"{tool}, {count} workers")
            command = [sys.executable, os.path.abspath(__file__), "trial", "--data", data, "--tool", tool,
                       "--workers", str(count)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
            bar.update(1)
            if done.returncode != 0:
                bar.write(f"{tool} workers={count} failed:\n{done.stderr[-3000:]}")
                continue
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["repeat"] = repeat
            results.append(result)
            bar.write(json.dumps(result))
    with open(out, "w") as handle:
        json.dump({"prepared": prepared, "results": results}, handle, indent=1)
    print(table(prepared, results))


def table(prepared: dict[str, Any], results: list[dict[str, Any]]) -> str:
    text_mb = prepared["text_bytes"] / 1e6
    conversions = prepared["conversion_seconds"]
    rows = ["| tool | workers | MB/s text (= byte tok/s ×1e6) | vs best other | CPU s / M tokens | first batch s "
            "| peak memory MB | conversion s | runs |", "|---|---|---|---|---|---|---|---|---|"]
    summary: dict[tuple[str, int], dict[str, float]] = {}
    for key in sorted({(r["tool"], r["workers"]) for r in results}, key=lambda k: (k[1], TOOLS.index(k[0]))):
        runs = [r for r in results if (r["tool"], r["workers"]) == key]
        median = statistics.median
        tokens = runs[0]["tokens"] or prepared["text_bytes"]
        summary[key] = {
            "mbps": median(text_mb / r["seconds"] for r in runs) if not runs[0]["tokens"] else
            median(r["tokens"] / 1e6 / r["seconds"] for r in runs),
            "cpu": median(r["cpu"] / (tokens / 1e6) for r in runs),
            "first": median(r["first_batch"] for r in runs),
            "peak": median(r["peak_bytes"] for r in runs) / 1e6,
            "runs": len(runs),
        }
    for (tool, workers), s in summary.items():
        others = [v["mbps"] for (t, w), v in summary.items()
                  if w == workers and not t.startswith("gristmill") and t not in CEILINGS]
        ratio = f"{s['mbps'] / max(others):.2f}×" if others and tool.startswith("gristmill") else ""
        conversion = conversions.get("gristmill" if tool.startswith("gristmill") else tool)
        unit = {"gristmill-tokens": " (packed tokens, M tok/s)", "pyarrow-all-cores": " (ceiling, not a loader)"}.get(tool, "")
        converted = f"{conversion:.1f}" if conversion is not None else "–"
        rows.append(f"| {tool}{unit} | {workers} | {s['mbps']:.0f} | {ratio} | {s['cpu']:.4f} | {s['first']:.3f} | "
                    f"{s['peak']:.0f} | {converted} | {s['runs']} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--data", default="bench-data/loader")
    p.add_argument("--mb", type=int, default=300, help="MB of distinct text to collect")
    p.add_argument("--copies", type=int, default=1, help="repeat the collected documents this many times")
    r = sub.add_parser("run")
    r.add_argument("--data", default="bench-data/loader")
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    r.add_argument("--tools", nargs="+", default=TOOLS, choices=TOOLS)
    r.add_argument("--out", default="bench-data/loader/results.json")
    t = sub.add_parser("trial")
    t.add_argument("--data", required=True)
    t.add_argument("--tool", required=True, choices=TOOLS)
    t.add_argument("--workers", type=int, required=True)
    t.add_argument("--table", action="store_true")
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.data, args.mb, args.copies)
    elif args.command == "run":
        run(args.data, args.repeats, args.workers, args.tools, args.out)
    else:
        print(json.dumps(trial(args.tool, args.data, args.workers)))


if __name__ == "__main__":
    main()
