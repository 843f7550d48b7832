"""One giant near-duplicate cluster through ``gristmill dedup``: does every task stay within its budget?

A boilerplate page (250 words) in N near copies, each with one word of its own, and an exact copy (up
to case and spacing) of every tenth: one cluster of 1.1 N documents whose LSH buckets hold all of it
in every band. The job runs with ``--keep-work``; the completion records then say how many rows each
task read. Checked: every connected-components task (contract, resolve, settle) read at most twice
``cc_rows_per_task`` rows; no clusters reducer read more than ``cc_rows_per_task`` rows (it gets one
row per (split, cluster), never the members); kept + exact + near + rejected = input.

    .venv/bin/python benchmarks/hot_cluster.py --members 200000 --budget 16384

tests/test_pipeline_hot_cluster.py runs the same check with 20,000 members in the suite.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

WORDS = 250


def hot_texts(members: int, seed: int = 11) -> list[str]:
    """The page in ``members`` near copies (word ``i % WORDS`` of copy i is its own), plus an exact copy of
    every tenth up to case and spacing."""
    rng = random.Random(seed)
    page = [f"w{rng.randrange(20_000)}" for _ in range(WORDS)]
    texts = []
    for i in range(members):
        words = list(page)
        words[i % WORDS] = f"copy{i}"
        texts.append(" ".join(words))
        if i % 10 == 0:
            texts.append("  " + texts[-1].upper())
    return texts


def write_jsonl(folder: Path, texts: list[str], files: int) -> None:
    """``texts`` over ``files`` JSONL files with ids ``d<number>``, in order."""
    folder.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(texts) // files)
    for f in range(files):
        lines = (json.dumps({"id": f"d{i}", "text": texts[i]})
                 for i in range(f * per_file, min(len(texts), (f + 1) * per_file)))
        (folder / f"part-{f:03d}.jsonl").write_text("\n".join(lines) + "\n")


def task_rows(work: Path) -> dict[str, int]:
    """The most rows a task of each kind read, from the completion records of a kept work folder."""
    kinds = {"cc contract": "cc/done/r*-contract", "cc resolve": "cc/done/r*-resolve",
             "cc settle": "cc/done/settle", "clusters reduce": "clusters/done"}
    return {kind: max((json.loads(path.read_text())["rows"] for path in work.glob(f"{pattern}/*.json")), default=0)
            for kind, pattern in kinds.items()}


def check(stats: dict[str, Any], rows: dict[str, int], budget: int) -> None:
    """The budget per task, and the accounting identity."""
    docs = stats["documents"]
    assert docs["input"] == docs["kept"] + docs["exact_duplicate"] + docs["near_duplicate"] + docs["rejected"], docs
    for kind, most in rows.items():
        limit = budget if kind == "clusters reduce" else 2 * budget
        assert most <= limit, f"a {kind} task read {most} rows, over {limit}"
    assert max(stats["components"]["largest"]) <= 2 * budget


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=200_000)
    parser.add_argument("--budget", type=int, default=16_384, help="cc_rows_per_task")
    parser.add_argument("--split-bytes", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import ray

    from gristmill.pipeline.job import DedupConfig, run_dedup

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        started = time.time()
        texts = hot_texts(args.members)
        write_jsonl(root / "in", texts, 16)
        print(f"{len(texts)} documents, {sum(map(len, texts)) / 1e6:.0f} MB, written in {time.time() - started:.0f} s")
        ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        started = time.time()
        stats = run_dedup(DedupConfig(inputs=[str(root / "in")], output=str(root / "out"), keep_work=True,
                                      split_bytes=args.split_bytes, cc_rows_per_task=args.budget))
        seconds = time.time() - started
        rows = task_rows(root / "out" / "_work")
        print(json.dumps({"seconds": round(seconds, 1), "documents": stats["documents"],
                          "cluster_sizes": stats["cluster_sizes"], "components": stats["components"],
                          "most rows a task read": rows, "budget": args.budget}, indent=1))
        check(stats, rows, args.budget)
        print("every task within its budget; the accounting adds up")


if __name__ == "__main__":
    main()
