"""Raw text -> MinHash signatures on one core: gristmill vs datasketch vs rensa, same documents.

Every tool gets the same documents and the same shingles (word 5-grams of ``gristmill.dedup.normalize(text)``,
128 permutations). gristmill takes raw text and does everything itself; the competitors get the
Python shingling users would write (counted in their end-to-end time, and also reported on its own).
The process is pinned to one CPU so multi-threaded libraries cannot use more than one core. Runs are
interleaved round-robin and the median of ``--repeats`` runs is reported, both as throughput per
CPU-second of this process (what one core delivers; robust to other processes competing for the CPU)
and per wall-clock second. The machine is shared, so wall-clock numbers move between runs.

    .venv-bench/bin/python benchmarks/minhash_speed.py --docs 2000 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

for _var in ("RAYON_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

SOURCE_ROOTS = ("/usr/lib/python3.11", "/usr/lib/python3", "/root/.pyenv/versions/3.11.7/lib/python3.11")


def load_sources(count: int, min_bytes: int = 6000, max_bytes: int = 12000) -> list[str]:
    """Real Python source files of about 9 kB, distinct by content, in a stable order."""
    seen: set[str] = set()
    texts = []
    for root in SOURCE_ROOTS:
        for path in sorted(Path(root).rglob("*.py")):
            try:
                size = path.stat().st_size
                if not min_bytes <= size <= max_bytes:
                    continue
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if text not in seen:
                seen.add(text)
                texts.append(text)
            if len(texts) == count:
                return texts
    return texts


def word_shingles(text: str, ngram: int) -> list[str]:
    """The shingles gristmill hashes, built the way a datasketch/rensa user would in Python."""
    from gristmill import dedup

    tokens = dedup.normalize(text).split()
    span = min(ngram, len(tokens))
    return list({" ".join(tokens[i : i + span]) for i in range(len(tokens) - span + 1)})


def compile_times() -> tuple[float, float]:
    """CPU seconds of the first call in a fresh process: empty numba cache, then the filled cache."""
    code = (
        "import time, dedup; t = time.process_time(); "
        "gristmill.dedup.MinHasher().signatures(['a b c']); print(time.process_time() - t)"
    )
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        run = [sys.executable, "-c", code]
        cold = float(subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout)
        warm = float(subprocess.run(run, env=env, capture_output=True, text=True, check=True).stdout)
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-perm", type=int, default=128)
    parser.add_argument("--ngram", type=int, default=5)
    parser.add_argument("--cpu", type=int, default=0, help="the CPU to pin this process to")
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.cpu})

    import datasketch
    import rensa

    from gristmill import dedup

    texts = load_sources(args.docs)
    megabytes = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    print(f"{len(texts)} documents, {megabytes:.1f} MB, mean {megabytes * 1e6 / len(texts) / 1e3:.1f} kB")
    cold, warm = compile_times()
    print(
        f"gristmill first call in a fresh process: {cold:.2f} CPU-s compiling, {warm:.2f} CPU-s from numba's cache"
    )

    hasher = dedup.MinHasher(num_perm=args.num_perm, ngram=args.ngram, shingle="word")
    hasher.signatures(texts[:2])  # compiled (or loaded) before timing

    def gristmill() -> np.ndarray:
        return hasher.signatures(texts)

    def shingling() -> list[list[str]]:
        return [word_shingles(t, args.ngram) for t in texts]

    def datasketch_path() -> list[np.ndarray]:
        out = []
        for text in texts:
            m = datasketch.MinHash(num_perm=args.num_perm, seed=1)
            m.update_batch([s.encode("utf-8") for s in word_shingles(text, args.ngram)])
            out.append(m.hashvalues)
        return out

    def rensa_path() -> list[list[int]]:
        out = []
        for text in texts:
            m = rensa.RMinHash(num_perm=args.num_perm, seed=1)
            m.update(word_shingles(text, args.ngram))
            out.append(m.digest())
        return out

    def rensa_matrix_path() -> object:
        return rensa.RMinHash.digest_matrix_from_token_sets(shingling(), args.num_perm, 1)

    tools: dict[str, Callable[[], object]] = {
        "gristmill MinHasher (raw text in)": gristmill,
        "datasketch MinHash.update_batch + Python shingling": datasketch_path,
        "rensa RMinHash.update + Python shingling": rensa_path,
        "rensa digest_matrix_from_token_sets + Python shingling": rensa_matrix_path,
        "(Python shingling alone, shared by the competitors)": shingling,
    }
    wall: dict[str, list[float]] = {name: [] for name in tools}
    cpu: dict[str, list[float]] = {name: [] for name in tools}
    for _ in range(args.repeats):
        for name, tool in tools.items():
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            tool()
            cpu[name].append(time.process_time() - start_cpu)
            wall[name].append(time.perf_counter() - start_wall)

    ours = statistics.median(cpu["gristmill MinHasher (raw text in)"])
    print(
        f"\n| pipeline (1 core, {args.num_perm} perms, word {args.ngram}-grams) "
        "| MB per CPU-s | docs per CPU-s | MB/s wall | gristmill is x faster (CPU) |"
    )
    print("|---|---:|---:|---:|---:|")
    for name in tools:
        median_cpu, median_wall = statistics.median(cpu[name]), statistics.median(wall[name])
        print(
            f"| {name} | {megabytes / median_cpu:.1f} | {len(texts) / median_cpu:.0f} "
            f"| {megabytes / median_wall:.1f} | {median_cpu / ours:.1f} |"
        )


if __name__ == "__main__":
    main()
