"""Planning an epoch of a corpus of millions of row groups: time and memory per process.

Before its first batch every rank and DataLoader worker opens the corpus and plans its epoch: the
block order (a seeded permutation of every block), where each block's rows fall in the epoch, and
its own stream. Synthetic corpora of 10 k to 1 M row groups (62 a shard, as at 10 TB with 256 MB
shards and 4 MB row groups) are written as manifests only, once as format version 2 (row groups in
the block table) and once as version 1 (row groups inline in manifest.json, as before). Each
measurement is a fresh process: ``StreamingLoader(url, rank=3, world_size=64)`` plus ``len(loader)``,
which opens the corpus and plans the epoch; reported are the seconds and the peak RSS it added
over the process after its imports.

    .venv-bench/bin/python benchmarks/loader_planning.py --data bench-data/planning --repeats 5

Beside them, with ``--competitors``: litdata and mosaicml-streaming loading an ``index.json`` of as
many chunks/shards (their unit of download, as a row group is ours; the same rows in each) and
planning their epoch, from indexes written in their own formats (``write_index``, the entries their
writers produce; no data files are read by any tool). litdata plans rank 3 of 64 as gristmill does;
mosaicml-streaming's local leader computes the sample ids of every rank (one int64 per sample), so it
is measured with one rank, and only up to 10 M samples (100 k shards would need gigabytes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GROUPS_PER_SHARD = 62
WORLD, RANK = 64, 3


def write_corpus(folder: str, blocks: int, version: int) -> None:
    """A corpus of ``blocks`` row groups, manifest only (no shard data is read when planning)."""
    from gristmill.pipeline.format import (
        CORPUS_SCHEMA,
        MANIFEST_NAME,
        BlockTable,
        RowGroups,
        ShardInfo,
        write_manifest,
    )

    rng = np.random.default_rng(blocks)
    shards = -(-blocks // GROUPS_PER_SHARD)
    shard = np.arange(blocks, dtype=np.int64) // GROUPS_PER_SHARD
    group = np.arange(blocks, dtype=np.int64) % GROUPS_PER_SHARD
    rows = rng.integers(500, 1500, blocks).astype(np.int64)
    length = rng.integers(3 << 20, 5 << 20, blocks).astype(np.int64)
    ends = np.cumsum(length)
    firsts = np.searchsorted(shard, np.arange(shards + 1))
    offset = 4 + ends - length - np.repeat(ends[firsts[:-1]] - length[firsts[:-1]], np.diff(firsts))
    table = BlockTable(shard, group, rows, offset, length)
    infos = []
    for index in range(shards):
        view = RowGroups(table, int(firsts[index]), int(firsts[index + 1]))
        data_end = int(view.offset[-1] + view.length[-1])
        infos.append(ShardInfo(path=f"part-synthetic-{index:06d}.parquet", rows=int(view.rows.sum()),
                               bytes=data_end + 40_000, checksum=f"xxh3_128:{index:032x}", row_groups=view,
                               footer_offset=data_end, footer_length=40_000))
    os.makedirs(folder, exist_ok=True)
    manifest = write_manifest(folder, infos, CORPUS_SCHEMA)
    if version == 1:
        text = json.loads(manifest.to_json())
        os.remove(os.path.join(folder, text.pop("blocks")["path"]))
        text["format_version"] = 1
        text["shards"] = [s.to_dict() for s in infos]
        with open(os.path.join(folder, MANIFEST_NAME), "w") as handle:
            json.dump(text, handle, indent=1)


def memory_kb(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (peak RSS) of this process, from /proc."""
    with open("/proc/self/status") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith(field + ":"))


def start_peak() -> int:
    """Reset the peak-RSS mark to the current RSS (Linux ``clear_refs``); returns that RSS in kB."""
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return memory_kb("VmRSS")


def timed(work: Callable[[], object]) -> dict[str, float]:
    """Seconds and peak RSS that ``work`` adds in this process (imports done before)."""
    before = start_peak()
    started = time.perf_counter()
    work()
    seconds = time.perf_counter() - started
    peak = memory_kb("VmHWM")
    return {"seconds": seconds, "added_mb": (peak - before) / 1024, "peak_mb": peak / 1024}


def measure(url: str) -> dict[str, float]:
    """Open and plan an epoch in this (fresh) process, as a rank does before its first batch."""
    from gristmill.loaders import StreamingLoader

    return timed(lambda: len(StreamingLoader(url, rank=RANK, world_size=WORLD, batch_size=32, shuffle=True)))


def write_index(tool: str, folder: str, blocks: int) -> None:
    """An ``index.json`` in litdata's or mosaicml-streaming's format for ``blocks`` chunks/shards of
    the same row counts and sizes as the gristmill corpus of that size."""
    rng = np.random.default_rng(blocks)
    rows = rng.integers(500, 1500, blocks).tolist()
    length = rng.integers(3 << 20, 5 << 20, blocks).tolist()
    if tool == "litdata":
        spec = json.dumps([1, {"type": "builtins.dict", "context": json.dumps(["text"]),
                               "children_spec": [{"type": None, "context": None, "children_spec": []}]}])
        index = {"chunks": [{"chunk_bytes": n, "chunk_size": r, "dim": None, "filename": f"chunk-0-{i}.bin"}
                            for i, (r, n) in enumerate(zip(rows, length))],
                 "config": {"chunk_bytes": None, "chunk_size": 1000, "compression": None,
                            "compression_batch_size": None, "compression_level": None, "data_format": ["str"],
                            "data_spec": spec, "encryption": None, "ipc_compression": None,
                            "item_loader": "PyTreeLoader", "types": {"text": "str"}},
                 "updated_at": "0"}
    else:
        index = {"shards": [{"column_encodings": ["str"], "column_names": ["text"], "column_sizes": [None],
                             "compression": None, "format": "mds", "hashes": [],
                             "raw_data": {"basename": f"shard.{i:07d}.mds", "bytes": n, "hashes": {}},
                             "samples": r, "size_limit": 1 << 26, "version": 2, "zip_data": None}
                            for i, (r, n) in enumerate(zip(rows, length))], "version": 2}
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "index.json"), "w") as handle:
        json.dump(index, handle)


def measure_competitor(tool: str, folder: str) -> dict[str, float]:
    """Load the index and plan the epoch as the tool does before its first sample, in this process."""
    if tool == "litdata":
        from litdata import StreamingDataset
        from litdata.utilities.env import _DistributedEnv

        def plan() -> None:
            dataset = StreamingDataset(folder, shuffle=True, seed=0)
            dataset.distributed_env = _DistributedEnv(world_size=WORLD, global_rank=RANK, num_nodes=WORLD // 8)
            dataset.batch_size = 32
            cache = dataset._create_cache(worker_env=dataset.worker_env)
            dataset.shuffler = dataset._create_shuffler(cache)
            dataset.shuffler.get_chunks_and_intervals_per_workers(dataset.distributed_env, 1, 32, 1)
        return timed(plan)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    from streaming import StreamingDataset as MosaicDataset

    def plan_mosaic() -> None:
        dataset = MosaicDataset(local=folder, batch_size=32, shuffle=True, shuffle_seed=0, num_canonical_nodes=1,
                                shuffle_block_size=1 << 18)  # its defaults, set as its __iter__ would
        dataset._unique_worker_world = dataset._unique_rank_world.detect_workers()  # as its __iter__ starts
        dataset._parallel_worker_world = dataset._parallel_rank_world.detect_workers()
        dataset._get_work(0, 0)
    return timed(plan_mosaic)


def run_fresh(args: list[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="bench-data/planning")
    parser.add_argument("--blocks", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--competitors", action="store_true")
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--tool", default="gristmill", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.measure:
        if options.tool == "gristmill":
            print(json.dumps(measure(options.measure)))
        else:
            print(json.dumps(measure_competitor(options.tool, options.measure)))
        return
    tools = ["gristmill v2", "gristmill v1"] + (["litdata", "streaming"] if options.competitors else [])
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    for blocks in options.blocks:
        folders = {}
        for tool in tools:
            folder = os.path.join(options.data, f"{tool.replace(' ', '-')}-{blocks}")
            folders[tool] = folder
            if not os.path.exists(folder) and not (tool == "streaming" and blocks > 10_000):
                if tool.startswith("gristmill"):
                    write_corpus(folder, blocks, int(tool[-1]))
                else:
                    write_index(tool, folder, blocks)
        for _ in range(options.repeats):  # tools alternate, so background load hits them alike
            for tool in tools:
                if tool == "streaming" and blocks > 10_000:
                    continue
                name = "gristmill" if tool.startswith("gristmill") else tool
                results.setdefault((tool, blocks), []).append(
                    run_fresh(["--measure", folders[tool], "--tool", name]))
    print(f"\nplanning an epoch (rank {RANK} of {WORLD}), median of {options.repeats} fresh processes")
    print(f"{'tool':<14}{'row groups':>12}{'seconds':>10}{'added MB':>10}{'peak MB':>10}  vs gristmill v2")
    for (tool, blocks), runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        base = statistics.median(r["seconds"] for r in results[("gristmill v2", blocks)])
        print(f"{tool:<14}{blocks:>12,}{seconds:>10.3f}{statistics.median(r['added_mb'] for r in runs):>10.0f}"
              f"{statistics.median(r['peak_mb'] for r in runs):>10.0f}  {seconds / base:>6.1f}x")


if __name__ == "__main__":
    main()
