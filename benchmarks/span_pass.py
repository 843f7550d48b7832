"""The CPU cost of the span pass alone, per GB: ``document_spans`` (split, normalise, hash) and
``cut_batch`` (the write stage's cutting), side by side with the plain per-span Python of
``tests/span_reference.py``, on the corpus of ``benchmarks/span_dedup.py``, in batches of about 4 MB
(the job's read batches). No Ray, no Parquet: what ``--spans`` adds per byte, without the job's fixed
cost. Run:

    .venv/bin/python benchmarks/span_pass.py --mb 20 --runs 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from span_dedup import build_corpus  # noqa: E402
from span_reference import reference_cut, reference_spans  # noqa: E402

from gristmill.dedup.spans import SpanMode, cut_batch, document_spans  # noqa: E402

BATCH_CHARS = 4_000_000


def batches(path: Path) -> list[list[str]]:
    """The corpus's texts in batches of about BATCH_CHARS characters."""
    out: list[list[str]] = [[]]
    size = 0
    for line in open(path):
        out[-1].append(json.loads(line)["text"])
        size += len(out[-1][-1])
        if size > BATCH_CHARS:
            out.append([])
            size = 0
    return [b for b in out if b]


def cpu(work: Callable[[], object], runs: int) -> float:
    """The median CPU seconds of ``runs`` runs of ``work`` (after one run that compiles and warms)."""
    work()
    times = []
    for _ in range(runs):
        started = time.process_time()
        work()
        times.append(time.process_time() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=20, help="corpus size in MB (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per measure; medians (default: %(default)s)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/span-dedup-bench"))
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus = args.work / f"corpus-{args.mb:g}mb.jsonl"
    if not corpus.exists():
        build_corpus(corpus, args.mb)
    texts = batches(corpus)
    columns = [pa.array(b) for b in texts]
    gb = corpus.stat().st_size / 1e9
    lines = sum(t.count("\n") + 1 for b in texts for t in b)
    print(f"corpus: {sum(map(len, texts)):,} documents, {gb * 1e3:.1f} MB, {lines:,} lines; CPU-s per GB, "
          f"medians of {args.runs} runs")
    print(f"{'mode':<12} {'step':<16} {'compiled':>9} {'plain':>9} {'ratio':>7} {'compiled us/line':>17}")
    for name in ("line", "paragraph", "sentences:3"):
        for step, fast, plain in measure(SpanMode.parse(name), texts, columns, args.runs):
            print(f"{name:<12} {step:<16} {fast / gb:>9.1f} {plain / gb:>9.1f} {plain / fast:>6.1f}x "
                  f"{fast / lines * 1e6:>17.2f}")


def measure(mode: SpanMode, texts: list[list[str]], columns: list[pa.Array], runs: int) -> list[tuple[str, float, float]]:
    """(step, compiled CPU-s, plain CPU-s) for finding the spans and for cutting every other one."""
    spans = (cpu(lambda: [document_spans(c, mode) for c in columns], runs),
             cpu(lambda: [reference_spans(b, mode) for b in texts], 1))
    found = [document_spans(c, mode) for c in columns]
    every_other = [tuple(a[::2] for a in (f.doc, f.start, f.end)) for f in found]
    per_doc: list[list[list[tuple[int, int]]]] = [[[] for _ in b] for b in texts]
    for held, (d, s, e) in zip(per_doc, every_other, strict=True):
        for i, start, end in zip(d.tolist(), s.tolist(), e.tolist(), strict=True):
            held[i].append((start, end))
    cuts = (cpu(lambda: [cut_batch(c, *cut) for c, cut in zip(columns, every_other, strict=True)], runs),
            cpu(lambda: [[reference_cut(t, c) for t, c in zip(b, held, strict=True)]
                         for b, held in zip(texts, per_doc, strict=True)], 1))
    return [("document_spans", *spans), ("cut_batch", *cuts)]

if __name__ == "__main__":
    main()
