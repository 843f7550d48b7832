"""Peak memory and time of ``gristmill clusters`` (the list of the largest clusters, and ``--show ID``)
against the number of removed documents, before and after it streamed.

The corpora are synthetic, as ``gristmill dedup --removed`` lays them out: clusters whose sizes follow
a power law (Zipf a=2), each a kept representative plus removed members (a third exact copies, the
rest near copies with similarities in [0.8, 1)), as many kept singletons as removed documents,
5,000 domains, ~120-byte texts. ``--before`` and ``--after`` are two gristmill source trees (e.g.
``git archive`` of the commit before the streaming one, and of it); each command is a fresh process,
its peak RSS sampled (benchmarks/process_tree.py). Medians over ``--runs``, runs alternating.

    .venv-bench/bin/python benchmarks/clusters_memory.py generate --sizes 90000,300000,1000000
    .venv-bench/bin/python benchmarks/clusters_memory.py run --sizes 90000,300000,1000000 \\
        --before /tmp/before --after /tmp/after --runs 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_tree import LOOPBACK_RAY, REPO, TreeMemory  # noqa: E402

DATA = REPO / "bench-data" / "clusters"
WORDS = np.array("mill leat wheel flour grain stone river water miller sack door hive bees roof winter".split())


def _texts(rng: np.random.Generator, count: int) -> pa.Array:
    words = WORDS[rng.integers(0, WORDS.size, (count, 20))]
    return pa.array([" ".join(row) for row in words.tolist()], pa.string())


def generate(removed_count: int, seed: int = 0) -> Path:
    """A kept corpus and its removed corpus with ``removed_count`` removed documents; returns the kept one."""
    sys.path.insert(0, str(REPO))
    from gristmill.pipeline.format import CORPUS_SCHEMA, JOB_FINGERPRINT_KEY, REMOVED_SCHEMA, ShardWriter

    rng = np.random.default_rng(seed)
    sizes = np.minimum(rng.zipf(2.0, removed_count), 10_000)  # removed members per cluster
    sizes = sizes[np.cumsum(sizes) <= removed_count]
    sizes = np.append(sizes, removed_count - sizes.sum()) if sizes.sum() < removed_count else sizes
    clusters = sizes.size
    root = DATA / f"removed-{removed_count}"
    kept_url, removed_url = str(root / "corpus"), str(root / "removed")
    reps = np.array([f"r{i:09d}" for i in range(clusters)])
    cluster_of = np.repeat(np.arange(clusters), sizes)
    extra = {JOB_FINGERPRINT_KEY: f"bench-{removed_count}"}
    domains = np.array([f"site{i}.example" for i in range(5000)])
    with ShardWriter(removed_url, REMOVED_SCHEMA) as gone:
        for start in range(0, removed_count, 100_000):
            part = cluster_of[start:start + 100_000]
            n = part.size
            exact = rng.random(n) < 1 / 3
            domain = domains[rng.integers(0, 5000, n)]
            gone.write(pa.table({
                "id": [f"m{i:09d}" for i in range(start, start + n)], "text": _texts(rng, n),
                "source": [f"http://{d}/{i}" for d, i in zip(domain.tolist(), range(start, start + n), strict=True)],
                "domain": domain, "language": ["en"] * n, "fetch_time": pa.nulls(n, pa.timestamp("ms", tz="UTC")),
                "content_hash": pa.nulls(n, pa.string()), "cluster_id": reps[part],
                "cluster_size": (sizes[part] + 1).astype(np.int32), "is_representative": np.zeros(n, bool),
                "removed_as": np.where(exact, "exact_duplicate", "near_duplicate"), "duplicate_of": reps[part],
                "similarity": np.where(exact, 1.0, rng.uniform(0.8, 1.0, n)),
            }, schema=REMOVED_SCHEMA))
        gone.commit(extra=extra)
    singles = removed_count
    with ShardWriter(kept_url, CORPUS_SCHEMA) as kept:
        for start in range(0, clusters + singles, 100_000):
            index = np.arange(start, min(start + 100_000, clusters + singles))
            n, is_rep = index.size, index < clusters
            ids = np.where(is_rep, reps[np.minimum(index, clusters - 1)], np.char.add("s", index.astype(str)))
            domain = domains[rng.integers(0, 5000, n)]
            kept.write(pa.table({
                "id": ids, "text": _texts(rng, n), "source": [f"http://{d}/k{i}" for d, i in zip(
                    domain.tolist(), index.tolist(), strict=True)], "domain": domain, "language": ["en"] * n,
                "fetch_time": pa.nulls(n, pa.timestamp("ms", tz="UTC")), "content_hash": pa.nulls(n, pa.string()),
                "cluster_id": ids, "cluster_size": np.where(is_rep, sizes[np.minimum(index, clusters - 1)] + 1,
                                                            1).astype(np.int32),
                "is_representative": np.ones(n, bool)}, schema=CORPUS_SCHEMA))
        kept.commit(stats={"documents": {"input": clusters + singles + removed_count}},
                    extra={**extra, "job": {"removed": removed_url}})
    return Path(kept_url)


def measure(tree: Path, arguments: list[str]) -> dict[str, float]:
    """One ``clusters`` command with the gristmill of ``tree``: wall seconds and peak RSS (MiB)."""
    command = [str(REPO / ".venv" / "bin" / "python"), "-m", "gristmill.pipeline.cli", "clusters", *arguments]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": str(tree), **LOOPBACK_RAY})
    memory = TreeMemory(process.pid, interval=0.05)
    _, err = process.communicate()
    wall = time.perf_counter() - started
    measured = memory.stop()
    if process.returncode != 0:
        raise RuntimeError(f"{command} failed: {err.decode()[-1500:]}")
    return {"wall": wall, "rss_mib": measured["peak"] / 2**20}


def run(args: argparse.Namespace) -> None:
    print("| removed documents | command | before: peak RSS MiB | after: peak RSS MiB | before: wall s | "
          "after: wall s | wall after / before |\n|---:|---|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        kept = DATA / f"removed-{size}" / "corpus"
        for label, arguments in (("list --top 20", [str(kept), "--top", "20", "--json"]),
                                 ("--show ID", [str(kept), "--show", "r000000000", "--width", "120"])):
            results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
            for run_index in range(args.runs):
                for name in (("before", "after") if run_index % 2 == 0 else ("after", "before")):
                    results[name].append(measure(getattr(args, name), arguments))

            medians = {(name, key): statistics.median(r[key] for r in runs)
                       for name, runs in results.items() for key in ("rss_mib", "wall")}
            print(f"| {size:,} | {label} | {medians['before', 'rss_mib']:.0f} | {medians['after', 'rss_mib']:.0f} | "
                  f"{medians['before', 'wall']:.2f} | {medians['after', 'wall']:.2f} | "
                  f"{medians['after', 'wall'] / medians['before', 'wall']:.2f} |", flush=True)
    print(f"\n{args.runs} runs each, alternating; 1-min load at the end: {os.getloadavg()[0]:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("generate", "run"):
        command = sub.add_parser(name)
        command.add_argument("--sizes", type=lambda text: [int(v) for v in text.split(",")],
                             default=[90_000, 300_000, 1_000_000], help="removed documents (default: 90k, 300k, 1M)")
        if name == "run":
            command.add_argument("--before", type=Path, required=True, help="gristmill source tree before streaming")
            command.add_argument("--after", type=Path, required=True, help="gristmill source tree after it")
            command.add_argument("--runs", type=int, default=3, help="runs of each (default: %(default)s)")
    args = parser.parse_args()
    if args.command == "generate":
        for size in args.sizes:
            print(generate(size))
    else:
        run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
