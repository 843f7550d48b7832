"""An incremental run (``gristmill dedup NEW --against OLD``) of a small new input against a larger
earlier corpus: CPU seconds, bytes read and work bytes written, for docs/BENCHMARKS.md.

What it shows: how much of OLD's signature index an incremental run reads and moves. A run that
re-reads and re-shuffles the whole earlier index pays for OLD on every small increment; one that
reads only the slices its own documents can match pays for NEW.

The data is generated (seeded): OLD is ``--old`` documents of 80-240 words drawn from a 30,000-word
vocabulary with Zipf popularity, in 16 files (so OLD's index is 16 files, one per split); NEW is ``--new`` documents, 80 % fresh, 10 % exact and 10 % near
copies (3 words changed) of OLD documents. The runner builds OLD once with ``gristmill dedup``, then
measures the incremental run as a fresh process with ``--keep-work`` (its whole process tree: driver,
Ray's daemons and workers; benchmarks/process_tree.py): CPU seconds, the bytes every process of the
tree read (``read_chars``, imports and Ray's own traffic included, so compare runs, not absolutes),
the bytes and files it left under ``NEW_CORPUS/_work``, and the earlier-index figures the job reports
(``stats.against``, when the job records them). Run it in .venv-bench (psutil):

    .venv-bench/bin/python benchmarks/pipeline_incremental.py --old 100000 --new 1000
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

from process_tree import REPO, gristmill_command, measure

DATA = REPO / "bench-data" / "incremental"
OLD_FILES = 16


def _vocabulary(rng: random.Random, size: int = 30_000) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return ["".join(rng.choice(letters) for _ in range(rng.randint(3, 10))) for _ in range(size)]


def _text(rng: random.Random, words: list[str], cumulative: list[float]) -> str:
    return " ".join(rng.choices(words, cum_weights=cumulative, k=rng.randint(80, 240)))


def _near(rng: random.Random, text: str, words: list[str]) -> str:
    tokens = text.split()
    for _ in range(3):
        tokens[rng.randrange(len(tokens))] = rng.choice(words)
    return " ".join(tokens)


def generate(folder: Path, old: int, new: int, seed: int) -> None:
    """``old/part-NNN.jsonl`` and ``new.jsonl`` in ``folder`` (skipped when they exist for these sizes)."""
    done = folder / "generated.json"
    wanted = {"old": old, "new": new, "seed": seed, "old_files": OLD_FILES}
    if done.exists() and json.loads(done.read_text()) == wanted:
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    words = _vocabulary(rng)
    weights = list(itertools.accumulate(1.0 / (rank + 1) for rank in range(len(words))))
    old_texts = [_text(rng, words, weights) for _ in range(old)]
    shutil.rmtree(folder / "old", ignore_errors=True)
    (folder / "old").mkdir()
    for part in range(OLD_FILES):  # OLD as a crawl would leave it: many files, many splits
        with open(folder / "old" / f"part-{part:03d}.jsonl", "w") as out:
            for i in range(part, old, OLD_FILES):
                out.write(json.dumps({"id": f"old{i}", "text": old_texts[i]}) + "\n")
    with open(folder / "new.jsonl", "w") as out:
        for i in range(new):
            kind = rng.random()
            if kind < 0.1:
                text = rng.choice(old_texts)
            elif kind < 0.2:
                text = _near(rng, rng.choice(old_texts), words)
            else:
                text = _text(rng, words, weights)
            out.write(json.dumps({"id": f"new{i}", "text": text}) + "\n")
    done.write_text(json.dumps(wanted))


def _run(command: list[str], log: Path) -> dict[str, Any]:
    """Run ``command``; its tree's CPU seconds, bytes read and wall seconds."""
    measured = measure(command, log)
    return {"cpu_s": round(measured["cpu"], 2), "wall_s": round(measured["wall"], 2),
            "read_chars": measured["read_chars"]}


def _folder_bytes(folder: Path) -> tuple[int, int]:
    """(bytes, files) under ``folder``."""
    sizes = [path.stat().st_size for path in folder.rglob("*") if path.is_file()]
    return sum(sizes), len(sizes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--old", type=int, default=100_000, help="documents in the earlier corpus")
    parser.add_argument("--new", type=int, default=1_000, help="documents in the new input")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--label", default="run", help="names the result file (e.g. before, after)")
    parser.add_argument("--alone", action="store_true", help="run NEW without --against: the floor to compare with")
    args = parser.parse_args()
    generate(args.data, args.old, args.new, args.seed)
    gristmill = gristmill_command()
    old_corpus, new_corpus = args.data / "old-corpus", args.data / "new-corpus"
    shutil.rmtree(new_corpus, ignore_errors=True)
    if not (old_corpus / "_manifest.json").exists():
        shutil.rmtree(old_corpus, ignore_errors=True)
        _run([gristmill, "dedup", str(args.data / "old"), "-o", str(old_corpus), "--split-bytes", str(8 * 10**6)],
             args.data / "old.log")
    against = [] if args.alone else ["--against", str(old_corpus)]
    measured = _run([gristmill, "dedup", str(args.data / "new.jsonl"), "-o", str(new_corpus), *against, "--keep-work"],
                    args.data / f"{args.label}.log")
    stats = json.loads(subprocess.run([gristmill, "stats", str(new_corpus), "--json"], capture_output=True,
                                      text=True, check=True).stdout)
    index_bytes, index_files = _folder_bytes(old_corpus / "_index")
    work_bytes, work_files = _folder_bytes(new_corpus / "_work")
    result = {"label": args.label, "old_documents": args.old, "new_documents": args.new, **measured,
              "earlier_index_bytes": index_bytes, "earlier_index_files": index_files, "work_bytes": work_bytes,
              "work_files": work_files, "documents": stats["documents"], "against": stats.get("against"),
              "stage_seconds": stats["stage_seconds"]}
    (args.data / f"result-{args.label}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
