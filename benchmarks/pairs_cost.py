"""What keeping the candidate pairs table (``_pairs/``, for ``clusters --what-if``) costs a dedup run:
bytes per input document and CPU seconds, before and after, on the same input in one run.

``--before`` and ``--after`` are two source trees of gristmill that differ only in the pairs table
(e.g. ``git archive`` of the commit before it, and the same with the pairs commit's files). Each run
is a fresh ``python -m gristmill.pipeline.cli dedup INPUT -o OUT`` process whose whole tree (driver, Ray's
daemons and workers) is measured (benchmarks/process_tree.py); runs alternate before/after so load
drifts hit both. Medians over ``--runs``; the 1-minute load average is recorded beside each run.

    .venv-bench/bin/python benchmarks/pairs_cost.py --before /tmp/before --after /tmp/after \\
        --input bench-data/scale/gen-1GB-seed0/input --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_tree import LOOPBACK_RAY, REPO, TreeMemory  # noqa: E402


def run_once(tree: Path, input_dir: str, out: Path) -> dict[str, Any]:
    """One dedup run with the gristmill of ``tree``; its tree's CPU and wall, and what the pairs table holds."""
    command = [str(REPO / ".venv" / "bin" / "python"), "-m", "gristmill.pipeline.cli", "dedup", input_dir, "-o", str(out)]
    load = os.getloadavg()[0]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": str(tree), **LOOPBACK_RAY})
    memory = TreeMemory(process.pid)
    _, err = process.communicate()
    wall = time.perf_counter() - started
    measured = memory.stop()
    if process.returncode != 0:
        raise RuntimeError(f"dedup failed in {tree}: {err.decode()[-2000:]}")
    manifest = json.loads((out / "_manifest.json").read_text())
    pairs = manifest["extra"].get("pairs") or {"files": [], "rows": 0}
    pair_bytes = sum((out / name).stat().st_size for name in pairs["files"])
    stats = manifest["stats"]
    return {"wall": wall, "cpu": measured["cpu"], "load": load, "documents": stats["documents"]["input"],
            "verify_s": stats["stage_seconds"].get("verify", 0.0), "pair_rows": pairs["rows"],
            "pair_bytes": pair_bytes, "corpus_bytes": sum(s["bytes"] for s in manifest["shards"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree without the pairs table")
    parser.add_argument("--after", type=Path, required=True, help="source tree with it")
    parser.add_argument("--input", default="bench-data/scale/gen-1GB-seed0/input", help="dedup input (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each (default: %(default)s)")
    args = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    scratch = Path(tempfile.mkdtemp(prefix="pairs-cost-"))
    try:
        for run in range(args.runs):
            for name in (("before", "after") if run % 2 == 0 else ("after", "before")):
                out = scratch / f"{name}-{run}"
                results[name].append(run_once(getattr(args, name), str(REPO / args.input), out))
                shutil.rmtree(out)
                print(name, results[name][-1], file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    docs = results["after"][0]["documents"]
    print("| | before | after | after / before |\n|---|---:|---:|---:|")
    for key, label in (("cpu", "CPU s (process tree)"), ("wall", "wall s"), ("verify_s", "verify stage s")):
        print(f"| {label} | {median('before', key):.1f} | {median('after', key):.1f} | "
              f"{median('after', key) / max(median('before', key), 1e-9):.3f} |")
    print(f"| pairs table bytes per input document | 0 | {median('after', 'pair_bytes') / docs:.2f} | |")
    print(f"| pairs table rows | 0 | {median('after', 'pair_rows'):,.0f} | |")
    print(f"| pairs table / kept shards bytes | | {median('after', 'pair_bytes') / median('after', 'corpus_bytes'):.5f} | |")
    print(f"\n{docs:,} input documents; {args.runs} runs each, alternating; 1-min load per run: "
          + ", ".join(f"{r['load']:.1f}" for name in ("before", "after") for r in results[name]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
