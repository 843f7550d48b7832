"""End to end: the same real text through ``gristmill dedup`` and through datatrove's local MinHash pipeline.

Input: real source and documentation files from this machine (several Python versions' sources under
/root/.pyenv, whose copies across versions are natural near-duplicates, then /usr/share/doc,
/usr/include, /usr/lib/python3*, the project's own virtualenv), packed into JSONL shards of
``{"id": path, "text": contents}`` under bench-data/pipeline_e2e/. The driver runs in .venv-bench
(psutil, datatrove); gristmill itself runs from .venv-plain, gristmill as ``pip install 'gristmill[all]'``
installs it, without the ``cluster`` extra (``make bench-env`` builds both; the ``cluster`` extra's ``ray[default]``
makes Ray's dashboard agents heavier: 0.98 against 0.85 GiB PSS and 13.0 against 10.8 CPU seconds
on the 120 MB slice, measured once each). Both tools read the same shards
with the same MinHash settings (5-word shingles, 14 bands x 8 rows = 112 permutations, datatrove's
defaults) and 2 workers. Each run is a fresh process (Ray start-up included for gristmill);
reported: wall time, MB/s, CPU seconds of the whole process tree, peak memory of that tree sampled
every 0.2 s as the sum of PSS (shared pages, such as Ray's object store or pages inherited across
fork, split among the processes that map them) and as the sum of RSS (shared pages counted once per
process), and the agreement of the two removed sets. The process breakdown at the PSS peak is
written beside each tool's log. Medians over ``--runs``; the machine is shared, so expect noise.

    .venv-bench/bin/python benchmarks/pipeline_e2e.py --bytes 1100000000 --runs 3
    .venv-bench/bin/python benchmarks/pipeline_e2e.py --bytes 120000000 --runs 3 --tools gristmill,datatrove
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_tree import REPO, measure  # noqa: E402

DATA = REPO / "bench-data" / "pipeline_e2e"
SOURCES = [
    ("/root/.pyenv/versions/*/**/*", (".py", ".c", ".h", ".rst", ".txt")),
    ("/usr/share/doc/**/*", ("copyright", ".txt", ".md", ".rst", ".html")),
    ("/usr/include/**/*", (".h",)),
    ("/usr/lib/python3*/**/*", (".py", ".txt")),
    (str(REPO / ".venv" / "lib") + "/**/*", (".py", ".pyi", ".h", ".txt", ".rst", ".md")),
]
SHARD_BYTES = 32 * 1024 * 1024
MAX_FILE_BYTES = 1024 * 1024
NUM_PERM, BANDS, ROWS, NGRAM = 112, 14, 8, 5


def prepare(target_bytes: int) -> Path:
    """JSONL shards of real files up to ``target_bytes`` of text; reused when already there."""
    folder = DATA / f"input-{target_bytes}"
    done = folder / "prepared.json"
    if done.exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    total, files, shard, handle, shard_bytes = 0, 0, 0, None, 0
    seen: set[str] = set()
    for pattern, suffixes in SOURCES:
        for path in sorted(glob.iglob(pattern, recursive=True), key=_version_free):
            if total >= target_bytes:
                break
            if not path.endswith(suffixes) or path in seen or not os.path.isfile(path):
                continue
            seen.add(path)
            try:
                if os.path.getsize(path) > MAX_FILE_BYTES:
                    continue
                text = Path(path).read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if not text.strip():
                continue
            if handle is None or shard_bytes >= SHARD_BYTES:
                if handle:
                    handle.close()
                handle = open(folder / f"shard-{shard:04d}.jsonl", "w", encoding="utf-8")
                shard, shard_bytes = shard + 1, 0
            line = json.dumps({"id": path, "text": text}, ensure_ascii=False) + "\n"
            handle.write(line)
            size = len(text.encode("utf-8"))
            shard_bytes += size
            total += size
            files += 1
    if handle:
        handle.close()
    done.write_text(json.dumps({"text_bytes": total, "documents": files, "shards": shard}))
    return folder


def _version_free(path: str) -> tuple[str, str]:
    """Sort key that puts the same file of different Python versions side by side (near-duplicates),
    so that a small slice holds them as a large one does."""
    key = re.sub(r"/versions/[^/]+/", "/versions/*/", path)
    return re.sub(r"python\d\.\d+", "pythonX", key), path


def run_gristmill(inputs: Path, work: Path) -> dict[str, Any]:
    out, removed = work / "corpus", work / "removed"
    python = REPO / ".venv-plain" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{python} is missing: run `make bench-env`")
    command = [str(python), "-m", "gristmill.pipeline.cli", "dedup", str(inputs), "-o", str(out),
               "--removed", str(removed), "--num-perm", str(NUM_PERM), "--bands", str(BANDS), "--rows", str(ROWS),
               "--ngram", str(NGRAM)]
    measured = measure(command, work / "gristmill.log")
    sys.path.insert(0, str(REPO))
    from gristmill.pipeline.format import Corpus

    corpus = Corpus.open(str(removed))
    ids = set(corpus.to_table(["id"])["id"].to_pylist())
    stats = Corpus.open(str(out)).stats
    return {**measured, "removed": ids, "stage_seconds": stats["stage_seconds"], "documents": stats["documents"]}


def run_datatrove(inputs: Path, work: Path) -> dict[str, Any]:
    command = [str(REPO / ".venv-bench" / "bin" / "python"), __file__, "--datatrove-job", str(inputs), str(work)]
    measured = measure(command, work / "datatrove.log")
    ids = set()
    for path in glob.glob(str(work / "removed" / "*.jsonl*")):
        import gzip

        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            ids.update(json.loads(line)["id"] for line in handle)
    return {**measured, "removed": ids}


def _encode_strings_for_xxhash() -> None:
    """datatrove 0.10.1 hands str to xxhash, which xxhash 4 refuses; encode first (its fastest hash,
    as intended). The pools below fork, so the workers inherit this."""
    import datatrove.utils.hashes.xxhash as shim
    import xxhash

    shim.xxhash32 = lambda data: xxhash.xxh32_intdigest(data.encode() if isinstance(data, str) else data)
    shim.xxhash64 = lambda data: xxhash.xxh64_intdigest(data.encode() if isinstance(data, str) else data)


def datatrove_job(inputs: str, work: str) -> None:
    """datatrove's four MinHash stages on LocalPipelineExecutor with 2 workers (runs in .venv-bench)."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import MinhashDedupCluster, MinhashDedupFilter, MinhashDedupSignature
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    _encode_strings_for_xxhash()
    config = MinhashConfig(hash_config=HashConfig(precision=64), num_buckets=BANDS, hashes_per_bucket=ROWS,
                           n_grams=NGRAM)
    tasks = len(glob.glob(os.path.join(inputs, "*.jsonl")))
    logs = os.path.join(work, "logs")

    def reader() -> JsonlReader:
        return JsonlReader(inputs, glob_pattern="*.jsonl", text_key="text", id_key="id")

    stage1 = LocalPipelineExecutor(pipeline=[reader(), MinhashDedupSignature(
        output_folder=f"{work}/signatures", config=config)], tasks=tasks, workers=2, logging_dir=f"{logs}/1", start_method="fork")
    stage2 = LocalPipelineExecutor(pipeline=[MinhashDedupBuckets(
        input_folder=f"{work}/signatures", output_folder=f"{work}/buckets", config=config)],
        tasks=config.num_buckets, workers=2, logging_dir=f"{logs}/2", depends=stage1, start_method="fork")
    stage3 = LocalPipelineExecutor(pipeline=[MinhashDedupCluster(
        input_folder=f"{work}/buckets", output_folder=f"{work}/remove_ids", config=config)],
        tasks=1, logging_dir=f"{logs}/3", depends=stage2, start_method="fork")
    stage4 = LocalPipelineExecutor(pipeline=[reader(), MinhashDedupFilter(
        input_folder=f"{work}/remove_ids", exclusion_writer=JsonlWriter(f"{work}/removed", compression=None)),
        JsonlWriter(f"{work}/kept")], tasks=tasks, workers=2, logging_dir=f"{logs}/4", depends=stage3,
        start_method="fork")
    stage4.run()


def _table(results: dict[str, list[dict[str, Any]]], text_bytes: int, documents: int) -> str:
    lines = [f"input: {text_bytes / 1e6:.0f} MB of text, {documents:,} documents",
             "",
             "| tool | runs | median wall s | MB/s | CPU s | peak PSS GiB | peak RSS GiB | removed docs | "
             "1-min load before runs |",
             "|---|---|---|---|---|---|---|---|---|"]
    medians, cpus = {}, {}
    for tool, runs in results.items():
        wall = statistics.median(r["wall"] for r in runs)
        peak = statistics.median(r["peak"] for r in runs)
        pss = statistics.median(r["peak_pss"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        medians[tool], cpus[tool] = wall, cpu
        loads = ", ".join(f"{r['load']:.1f}" for r in runs)
        lines.append(f"| {tool} | {len(runs)} | {wall:.1f} | {text_bytes / 1e6 / wall:.2f} | {cpu:.0f} | "
                     f"{pss / 2**30:.2f} | {peak / 2**30:.2f} | {len(runs[-1]['removed']):,} | {loads} |")
    if len(medians) == 2:
        lines.append("")
        lines.append(f"speed ratio gristmill / datatrove: {medians['datatrove'] / medians['gristmill']:.1f}x wall, "
                     f"{cpus['datatrove'] / cpus['gristmill']:.1f}x CPU seconds")
        g, d = results["gristmill"][-1]["removed"], results["datatrove"][-1]["removed"]
        both = len(g & d)
        lines.append(f"removed-set agreement: {both:,} in both, {len(g - d):,} only gristmill, {len(d - g):,} only "
                     f"datatrove (Jaccard {both / max(1, len(g | d)):.3f})")
    if "gristmill" in results:
        lines.append("")
        lines.append("gristmill stage seconds (last run): " + json.dumps(results["gristmill"][-1]["stage_seconds"]))
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--datatrove-job":
        datatrove_job(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bytes", type=int, default=1_100_000_000, help="text bytes of input (default 1.1 GB)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tools", default="gristmill,datatrove")
    args = parser.parse_args()
    inputs = prepare(args.bytes)
    info = json.loads((inputs / "prepared.json").read_text())
    results: dict[str, list[dict[str, Any]]] = {}
    tools = args.tools.split(",")
    runners = {"gristmill": run_gristmill, "datatrove": run_datatrove}
    for run in range(args.runs):
        for tool in tools:  # interleaved, so load from other users hits both alike
            work = DATA / f"work-{tool}-{args.bytes}"
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True)
            load = os.getloadavg()[0]
            result = runners[tool](inputs, work)
            result["load"] = load
            results.setdefault(tool, []).append(result)
            print(f"run {run + 1} {tool}: {result['wall']:.1f} s, {result['cpu']:.0f} CPU s, peak PSS "
                  f"{result['peak_pss'] / 2**30:.2f} GiB (RSS {result['peak'] / 2**30:.2f}), "
                  f"{len(result['removed']):,} removed", flush=True)
    report = _table(results, info["text_bytes"], info["documents"])
    print(report)
    (DATA / f"result-{args.bytes}-{'-'.join(tools)}.md").write_text(report + "\n")


if __name__ == "__main__":
    main()
