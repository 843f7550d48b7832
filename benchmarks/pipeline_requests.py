"""Requests per stage of ``gristmill dedup`` on an object store, and its time at 0 and 30 ms per request.

The job (``gristmill.pipeline.job.run_dedup``, on a private local Ray with two CPUs) reads generated JSONL from
moto's S3 server behind ``benchmarks/shaped_store.py`` (``record=True``) and writes its corpus and
work folder there. Every request the store answers is logged as (kind, path); a request belongs to
the stage that was running when it was made (the job reports each stage as it ends), so a stage's
count is everything it caused: its reads of earlier stages' outputs, its writes and its records.
``plan`` is what comes before the first stage (input listing, folder claims), ``commit`` what comes
after the last (manifest, rejects, removing the work folder).

Printed per (size, partition budget): requests per stage by kind beside the model of
``docs/BENCHMARKS.md`` (``model``: the O(S + P) count the design promises, from the splits S and the
partitions the job chose), the input bytes downloaded and the bytes through the store, then the wall
time of the same job at 0 and 30 ms per request beside the same job on local disk (medians of
``--runs``, with the seconds per stage of the last run) and the floor the store itself sets: its
MB/s for a PUT and a GET of 32 MB at 0 ms, times the bytes the job moved.

    .venv/bin/python benchmarks/pipeline_requests.py --sizes 1,34,100 --runs 1
    .venv/bin/python benchmarks/pipeline_requests.py --sizes 1,34 --no-times   # counts only
    .venv/bin/python benchmarks/pipeline_requests.py --sizes 100 --budgets default --cached-clients

Input: documents of 80-400 random words from a 20,000-word vocabulary; a third of them copy an
earlier one (half exactly, half with 1-3 % of words changed), so every stage has work. Seeded: the
same sizes give the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from shaped_store import ShapedStore  # noqa: E402

KINDS = ("GET", "PUT", "COPY", "LIST", "HEAD", "DELETE", "POST")
MIB = 1024 * 1024
BUDGETS = {"default": {}, "4MiB/256KiB": {"split_bytes": 4 * MIB, "partition_bytes": 256 * 1024}}


def generate(path: Path, megabytes: float, seed: int = 7) -> int:
    """JSONL of about ``megabytes`` MB with exact and near copies; returns the document count."""
    rnd = random.Random(seed)
    vocabulary = [f"w{rnd.getrandbits(40):x}" for _ in range(20_000)]
    target, written, docs = int(megabytes * 1e6), 0, []
    with path.open("w") as out:
        while written < target:
            if docs and rnd.random() < 1 / 3:
                words = list(rnd.choice(docs))
                if rnd.random() < 0.5:
                    for _ in range(max(1, len(words) * rnd.randint(1, 3) // 100)):
                        words[rnd.randrange(len(words))] = rnd.choice(vocabulary)
            else:
                words = rnd.choices(vocabulary, k=rnd.randint(80, 400))
                if len(docs) < 5000:
                    docs.append(words)
                else:
                    docs[rnd.randrange(len(docs))] = words
            line = json.dumps({"id": f"d{len(docs)}-{written}", "text": " ".join(words)}) + "\n"
            out.write(line)
            written += len(line)
    return sum(1 for _ in path.open())


class StageMarks:
    """A progress display (``run_dedup(progress=...)``) noting where in the store's log each stage
    began and the last one ended: ``per_stage()`` adds the requests up by stage and kind."""

    def __init__(self, store: ShapedStore | None) -> None:
        self.store = store
        self.marks: list[tuple[str, int]] = [("plan", self._now())]
        self.times: list[float] = [time.perf_counter()]

    def _now(self) -> int:
        return len(self.store.log) if self.store is not None else 0

    def begin(self, stage: str, total_bytes: int | None = None) -> None:
        self.marks.append((stage, self._now()))
        self.times.append(time.perf_counter())

    def task_done(self, result: dict[str, Any]) -> None:
        pass

    def end(self, stage: str, resumed: bool = False) -> None:
        if stage == "stats":
            self.marks.append(("commit", self._now()))
            self.times.append(time.perf_counter())

    def seconds(self) -> dict[str, float]:
        """Wall seconds per stage (the last, ``commit``, until now)."""
        ends = self.times[1:] + [time.perf_counter()]
        return {stage: round(end - begin, 1) for (stage, _), begin, end in zip(self.marks, self.times, ends, strict=True)}

    def per_stage(self) -> dict[str, Counter]:
        if self.store is None:
            return {}
        ends = [begin for _, begin in self.marks[1:]] + [len(self.store.log)]
        return {stage: Counter(kind for kind, _ in self.store.log[begin:end])
                for (stage, begin), end in zip(self.marks, ends, strict=True)}


def run_job(inputs: str, output: str, options: dict[str, Any], budget: dict[str, int],
            store: ShapedStore | None = None) -> tuple[float, StageMarks, dict[str, Any]]:
    """One job; the wall time, its stage marks (requests per stage by kind with a store, seconds per
    stage) and the job's stats."""
    from gristmill.pipeline.job import DedupConfig, run_dedup

    config = DedupConfig(inputs=[inputs], output=output, storage_options=options, **budget)
    marks = StageMarks(store)
    began = time.perf_counter()
    stats = run_dedup(config, progress=marks)
    return time.perf_counter() - began, marks, stats


def store_mb_per_s(fs: Any, megabytes: int = 32, repeats: int = 3) -> float:
    """What the store moves at 0 ms: MB/s of a PUT and a GET of a ``megabytes`` object through the proxy
    (median of ``repeats``), the floor of any job whose bytes all pass through it."""
    body, rates = os.urandom(megabytes * MIB), []
    for _ in range(repeats):
        began = time.perf_counter()
        fs.pipe_file("bench/_probe", body)
        fs.cat_file("bench/_probe", start=0)
        rates.append(2 * len(body) / 1e6 / (time.perf_counter() - began))
    fs.rm("bench/_probe")
    return statistics.median(rates)


# Requests per stage on an object store: (per split, per partition, fixed), fitted on runs of 1x1,
# 2x4 and 8x16 splits x partitions (every shuffle at P partitions) and rounded up; docs/BENCHMARKS.md.
# Per task: its record (one GET) and its outputs (a PUT each); per shuffle: one listing per 1,000
# senders and one GET per sender file, whatever P; per stage: its record, the timings. The plan
# also takes the output leases (a conditional PUT and its read-back each, docs/FORMAT.md).
MODEL = {"plan": (0, 0, 18), "read": (13, 0, 3), "exact": (5, 4, 4), "sign": (7, 1, 4), "against": (8, 4, 8),
         "buckets": (1, 3, 4), "verify": (1, 9, 6), "cc": (0, 1, 11), "clusters": (11, 8, 9),
         "write": (13, 2, 5), "stats": (1, 3, 3), "commit": (1, 0, 8)}
SLACK = 1.25  # the measured counts vary a little (connected components' rounds, edge batches)


def stage_requests(stage: str, splits: int, partitions: int) -> int:
    """The most requests ``stage`` may make at ``splits`` splits and ``partitions`` partitions per shuffle."""
    per_split, per_partition, fixed = MODEL[stage]
    return int(SLACK * (per_split * splits + per_partition * partitions + fixed)) + 2


def job_partitions(stats: dict[str, Any], budget: dict[str, int]) -> int:
    """The largest partition count of the job's shuffles, as the driver chose it."""
    from gristmill.pipeline.job.config import DedupConfig, index_params
    from gristmill.pipeline.job.partitions import partitions_for

    config = DedupConfig(inputs=[], output="", **budget)
    parts = partitions_for(stats["documents"]["input"], index_params(config), config.num_partitions,
                           config.partition_bytes)
    return max(parts.exact, parts.buckets, parts.verify, parts.clusters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,34", help="MB of JSONL, comma-separated")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--latency-ms", type=float, default=30.0)
    parser.add_argument("--no-times", action="store_true", help="counts only (no 30 ms and local runs)")
    parser.add_argument("--cached-clients", action="store_true",
                        help="let s3fs keep one client per process (its default) rather than build one per open")
    parser.add_argument("--budgets", default=",".join(BUDGETS))
    args = parser.parse_args()

    import ray
    import s3fs
    from moto.server import ThreadedMotoServer

    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    scratch = Path(tempfile.mkdtemp(prefix="gristmill-requests-"))
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        with ShapedStore(f"http://{host}:{port}", record=True) as store:
            # skip_instance_cache: every open builds a botocore client (0.13 CPU s each here), as a
            # process that opens each URL once does; --cached-clients: one per process, s3fs's default
            options = {"client_kwargs": {"endpoint_url": store.endpoint}, "skip_instance_cache": not args.cached_clients}
            fs = s3fs.S3FileSystem(**options)
            fs.mkdir("bench")
            for size in [float(s) for s in args.sizes.split(",")]:
                local_input = scratch / f"in-{size:g}.jsonl"
                docs = generate(local_input, size)
                fs.put(str(local_input), f"bench/in-{size:g}/part.jsonl")
                for budget_name in args.budgets.split(","):
                    budget = BUDGETS[budget_name]
                    report(store, fs, options, size, docs, local_input, budget_name, budget, scratch, args)
    finally:
        ray.shutdown()
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def report(store: ShapedStore, fs: Any, options: dict[str, Any], size: float, docs: int, local_input: Path,
           budget_name: str, budget: dict[str, int], scratch: Path, args: argparse.Namespace) -> None:
    """Count one (size, budget) on the store, then time it at 0 and ``--latency-ms`` beside local disk."""
    from gristmill.pipeline.job.stats import stats_partitions

    inputs = f"s3://bench/in-{size:g}/part.jsonl"
    output = f"s3://bench/out-{size:g}-{budget_name.replace('/', '-')}"
    store.shape(latency=0.0)
    store.reset_stats()
    _, marks, stats = run_job(inputs, output, options, budget, store)
    per_stage, traffic = marks.per_stage(), store.stats()
    total: Counter = Counter()
    splits, partitions = stats["splits"], job_partitions(stats, budget)
    stats_parts = stats_partitions(stats["documents"]["input"], 0)  # the rejected among the input already
    print(f"\n## {size:g} MB ({docs} documents), budget {budget_name}: {splits} splits, up to {partitions} "
          f"partitions a shuffle, {stats_parts} statistics reducers")
    print(f"{'stage':10s} " + " ".join(f"{k:>7s}" for k in KINDS) + f" {'total':>7s} {'model':>7s}")
    for stage, counts in per_stage.items():
        total.update(counts)
        print(f"{stage:10s} " + " ".join(f"{counts[k]:7d}" for k in KINDS)
              + f" {sum(counts.values()):7d} "
              f"{stage_requests(stage, splits, stats_parts if stage == 'stats' else partitions):7d}")
    print(f"{'all':10s} " + " ".join(f"{total[k]:7d}" for k in KINDS) + f" {sum(total.values()):7d}")
    input_size = local_input.stat().st_size
    read = sum(n for path, n in traffic["sent_by_path"].items() if path.startswith(f"/bench/in-{size:g}/"))
    moved = traffic["bytes_sent"] + traffic["bytes_received"]
    print(f"input downloaded: {read / 1e6:.1f} MB of {input_size / 1e6:.1f} MB ({read / input_size:.2f}x); "
          f"through the store: {traffic['bytes_sent'] / 1e6:.0f} MB sent, {traffic['bytes_received'] / 1e6:.0f} MB "
          "received")
    fs.rm(output, recursive=True)
    if args.no_times:
        return
    rate = store_mb_per_s(fs)
    print(f"store at 0 ms: {rate:.0f} MB/s (PUT + GET of 32 MB): the job's {moved / 1e6:.0f} MB take "
          f"{moved / 1e6 / rate:.1f} s through it whatever the latency")
    times: dict[str, list[float]] = defaultdict(list)
    stages: dict[str, dict[str, float]] = {}  # the last run's seconds per stage, by setting
    for _ in range(args.runs):
        for label, latency in (("0 ms", 0.0), (f"{args.latency_ms:g} ms", args.latency_ms / 1000)):
            store.shape(latency=latency)
            wall, marks, _ = run_job(inputs, output, options, budget)
            times[label].append(wall)
            stages[label] = marks.seconds()
            fs.rm(output, recursive=True)
        out = scratch / "out"
        wall, marks, _ = run_job(str(local_input), str(out), {}, budget)
        times["local"].append(wall)
        stages["local"] = marks.seconds()
        shutil.rmtree(out, ignore_errors=True)
    store.shape(latency=0.0)
    local = statistics.median(times["local"])
    print("wall s: " + ", ".join(f"{label} {statistics.median(v):.1f} ({statistics.median(v) / local:.2f}x local)"
                                 for label, v in times.items()))
    for label, seconds in stages.items():
        print(f"  {label:6s} s per stage: " + ", ".join(f"{stage} {s:.1f}" for stage, s in seconds.items()))


if __name__ == "__main__":
    main()
