"""Growth of ``gristmill dedup`` with input size: CPU-s per GB, per-worker memory, work files, rounds.

A flat CPU-s per GB and a flat per-worker peak from 0.3 to 10 GB is what says the job will keep
scaling past one machine; a cost that grows with N (a reducer holding a hot cluster, a shuffle
writing splits x partitions files, more connected-components rounds) shows up here first.

Input: JSONL generated from real text on this machine (Python 3.11's documentation sources, Debian's
copyright files, the article-extraction benchmark's article bodies), cut into paragraphs, with the
duplicate structure of a web crawl:
- clusters whose sizes follow a power law (Zipf a=2.1, up to 500 members per GB, as the largest
  clusters of a real crawl grow with it): about 18 % of documents
  are exact copies of another and 18 % near copies (0.2-2 % of words replaced, deleted or inserted);
- one hot cluster: a single boilerplate page copied 10^4 times per GB (10^5 at 10 GB), 70 % with a
  site name and a word or two changed, 30 % verbatim;
- headers and footers drawn from 500 boilerplate paragraphs with Zipf popularity, so many unrelated
  documents share text; domains with Zipf popularity (5,000 per GB);
- three large files holding 12 % of the bytes each (so a split that cuts a file matters) and many
  small files (lognormal, median 1 MB).
Documents are made of real paragraphs picked at random, so unrelated documents stay distinct. The
generator is seeded and each file depends only on (seed, file number): any number of processes
writes the same bytes. Sizes are bytes of JSONL (1 GB = 10^9).

The runner runs ``gristmill dedup`` (the public command line, from .venv-plain, gristmill as
``pip install 'gristmill[all]'`` installs it) on each size as a fresh process with ``--keep-work``,
measures its whole process tree (driver, Ray's daemons and workers; benchmarks/process_tree.py),
counts the files under OUTPUT/_work, reads ``gristmill stats --json`` for the connected-components
rounds and the read splits, then deletes the output. ``--datatrove`` also runs datatrove's MinHash
pipeline (benchmarks/pipeline_e2e.py, same settings: word 5-grams, 14 bands x 8 rows, 2 workers) on
one size in the same run, once (it takes ~2,000 CPU s per GB). ``--prefer POLICY`` (repeatable) also
runs gristmill with that survivor policy in every run, right after the default one, for the cost of
a policy on the same data. Medians over ``--runs``. The driver runs in .venv-bench (psutil, datatrove):

    make bench-env
    .venv-bench/bin/python benchmarks/pipeline_scale.py generate --sizes 0.3,1,3,10
    .venv-bench/bin/python benchmarks/pipeline_scale.py run --sizes 0.3,1,3,10 --runs 1 --datatrove
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import glob
import json
import multiprocessing
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import zstandard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_e2e import BANDS, NGRAM, NUM_PERM, ROWS, run_datatrove  # noqa: E402
from process_tree import REPO, gristmill_command, measure  # noqa: E402
from shared_data import shared_data  # noqa: E402

DATA = REPO / "bench-data" / "scale"
TEXT_SOURCES = ("/usr/share/doc/python3.11/html/_sources/**/*.txt", "/usr/share/doc/*/copyright")
ARTICLES = shared_data("article-extraction-benchmark") / "ground-truth.json"
MAX_PIECE, MIN_WORDS = 700, 8  # paragraph pieces: short enough that no one piece makes two documents alike
DOC_MEDIAN, DOC_SIGMA, MIN_PIECES = 2500, 0.9, 3  # document length: lognormal bytes, at least 3 pieces
TITLE_WORDS = 6  # a first line of random words that no other cluster has
DUP_FRACTION = 0.34  # of the documents outside the hot cluster, the share that copies another (exact or near)
ZIPF_A, MAX_CLUSTER_PER_GB = 2.1, 500  # extra members of a duplicated cluster: power law, cut where it grows with N
NEAR_SHARE, EDIT_RATE = 0.5, (0.002, 0.02)  # an extra member is a near copy with this chance; words edited
HOT_PER_GB, HOT_NEAR, HOT_BYTES = 10_000, 0.7, 1500
BOILERPLATE, HEADER_P, FOOTER_P = 500, 0.3, 0.5
DOMAINS_PER_GB = 5000
BIG_FILES, BIG_SHARE = 3, 0.12
SMALL_MEDIAN, SMALL_RANGE = 1 << 20, (32 << 10, 32 << 20)
LINE_OVERHEAD = len(b'{"id":"s0-000000000","url":"https:///","text":""}\n')
BASE, EXACT, NEAR = 0, 1, 2
HOT = -1  # the cluster number of the hot cluster's documents
SEPARATOR = b"\\n\\n"  # a blank line, JSON-escaped: texts are kept escaped, so a line is a join of bytes


# -- real text --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Pool:
    """Distinct paragraph pieces of real text, JSON-escaped, and the words they use."""

    pieces: list[bytes]
    lengths: np.ndarray
    words: list[bytes]


def _real_texts() -> Iterator[str]:
    for pattern in TEXT_SOURCES:
        for path in sorted(glob.glob(pattern, recursive=True)):
            yield Path(path).read_text(encoding="utf-8", errors="replace")
    if ARTICLES.exists():
        for page in json.loads(ARTICLES.read_text(encoding="utf-8")).values():
            yield page["articleBody"]


def _cut(block: str) -> Iterator[str]:
    """A paragraph in pieces of at most MAX_PIECE characters, at line (or, for long lines, word) ends."""
    chunk: list[str] = []
    size = 0
    for line in block.splitlines():
        for part in textwrap.wrap(line, MAX_PIECE) if len(line) > MAX_PIECE else [line]:
            if chunk and size + len(part) > MAX_PIECE:
                yield "\n".join(chunk)
                chunk, size = [], 0
            chunk.append(part)
            size += len(part) + 1
    if chunk:
        yield "\n".join(chunk)


def build_pool() -> Pool:
    """Pieces rather than whole files: documents built from them are distinct where they should be, and
    the ~16 MB of text a machine has is enough for any size (each piece is reused, never a document)."""
    pieces: dict[bytes, None] = {}
    for text in _real_texts():
        for block in re.split(r"\n\s*\n", text):
            for piece in _cut(block.strip()):
                if len(piece.split()) >= MIN_WORDS:
                    pieces[orjson.dumps(piece)[1:-1]] = None
    if len(pieces) < 10_000:
        raise SystemExit(f"only {len(pieces)} paragraphs of real text found; install python3.11-doc "
                         "(make system-deps)")
    unique = list(pieces)
    words = sorted(set(re.findall(rb"\b[A-Za-z]{3,12}\b", b" ".join(unique))))
    return Pool(unique, np.fromiter(map(len, unique), np.int64, len(unique)), words)


# -- the plan: every document's cluster, kind, domain and file, drawn at once with NumPy ---------------
@dataclasses.dataclass
class Plan:
    """Everything the file writers need, small enough to share with forked processes (~1.4 GB at 10 GB)."""

    seed: int
    pool: Pool
    piece_ids: np.ndarray  # the pieces of every cluster's base text, cluster after cluster
    piece_start: np.ndarray  # per cluster
    piece_count: np.ndarray
    titles: np.ndarray  # (clusters, TITLE_WORDS) word numbers: a title line of its own for every cluster
    header: np.ndarray  # boilerplate number per cluster, -1 for none
    footer: np.ndarray
    boilerplate: np.ndarray  # piece numbers
    hot_text: bytes
    doc_cluster: np.ndarray  # per document, in file order; HOT for the hot cluster
    doc_kind: np.ndarray  # BASE, EXACT or NEAR
    doc_domain: np.ndarray
    domains: list[bytes]
    files: list[tuple[str, int, int]]  # name, first document, end
    summary: dict[str, Any]


def make_plan(target_bytes: int, seed: int, pool: Pool) -> Plan:
    """Draw the whole data set's structure up front, so that copies of one cluster land in any file and
    every file can then be written alone."""
    rng = np.random.default_rng(seed)
    gb = target_bytes / 1e9
    words = np.array(pool.words, dtype=object)
    word_len = np.fromiter(map(len, pool.words), np.int64, len(pool.words))
    mean_piece = float(pool.lengths.mean())

    # The hot cluster: one page of real paragraphs.
    hot_pieces: list[bytes] = []
    while sum(map(len, hot_pieces)) < HOT_BYTES:
        hot_pieces.append(pool.pieces[int(rng.integers(len(pool.pieces)))])
    hot_text = SEPARATOR.join(hot_pieces)
    hot_copies = max(100, round(HOT_PER_GB * gb))

    # Ordinary clusters: more than needed, then the first ones that fill the target.
    room = target_bytes - hot_copies * (len(hot_text) + LINE_OVERHEAD + 40)
    estimate = int(1.5 * room / (DOC_MEDIAN * np.exp(DOC_SIGMA ** 2 / 2) + LINE_OVERHEAD) + 1000)
    extras = np.minimum(rng.zipf(ZIPF_A, estimate), max(100, round(MAX_CLUSTER_PER_GB * gb)))
    duplicated = rng.random(estimate) < DUP_FRACTION / (extras.mean() * (1 - DUP_FRACTION))
    sizes = 1 + np.where(duplicated, extras, 0)
    lengths = rng.lognormal(np.log(DOC_MEDIAN), DOC_SIGMA, estimate)
    counts = np.maximum(MIN_PIECES, np.rint(lengths / mean_piece)).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    piece_ids = rng.integers(0, len(pool.pieces), int(counts.sum()))
    titles = rng.integers(0, len(pool.words), (estimate, TITLE_WORDS))
    boiler_choices = np.flatnonzero((pool.lengths > 80) & (pool.lengths < 300))
    boilerplate = rng.choice(boiler_choices, BOILERPLATE, replace=False)
    header = np.where(rng.random(estimate) < HEADER_P, (rng.zipf(1.3, estimate) - 1) % BOILERPLATE, -1)
    footer = np.where(rng.random(estimate) < FOOTER_P, (rng.zipf(1.3, estimate) - 1) % BOILERPLATE, -1)
    boiler_len = np.append(pool.lengths[boilerplate], 0)  # index -1: none
    text_bytes = (np.add.reduceat(pool.lengths[piece_ids], starts) + len(SEPARATOR) * (counts - 1)
                  + word_len[titles].sum(1) + 5 + len(SEPARATOR)
                  + boiler_len[header] + boiler_len[footer] + len(SEPARATOR) * ((header >= 0) + (footer >= 0)))
    clusters = int(np.searchsorted(np.cumsum(sizes * (text_bytes + LINE_OVERHEAD + 25)), room)) + 1
    if clusters > estimate:
        raise AssertionError("the cluster estimate fell short")
    sizes, counts, starts = sizes[:clusters], counts[:clusters], starts[:clusters]
    piece_ids = piece_ids[: int(starts[-1] + counts[-1])]

    # Documents: every cluster's members (its base first), then the hot copies, in a random order.
    doc_cluster = np.concatenate([np.repeat(np.arange(clusters, dtype=np.int64), sizes),
                                  np.full(hot_copies, HOT, np.int64)])
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    doc_kind = np.where(rng.random(len(doc_cluster)) < NEAR_SHARE, NEAR, EXACT).astype(np.int8)
    doc_kind[first] = BASE
    doc_kind[len(doc_kind) - hot_copies:] = np.where(rng.random(hot_copies) < HOT_NEAR, NEAR, EXACT)
    doc_kind[len(doc_kind) - hot_copies] = BASE
    doc_bytes = np.concatenate([np.repeat(text_bytes[:clusters], sizes),
                                np.full(hot_copies, len(hot_text))]) + LINE_OVERHEAD + 25
    order = rng.permutation(len(doc_cluster))
    doc_cluster, doc_kind, doc_bytes = doc_cluster[order], doc_kind[order], doc_bytes[order]
    domain_count = max(100, round(DOMAINS_PER_GB * gb))
    doc_domain = (rng.zipf(1.2, len(doc_cluster)) - 1) % domain_count
    domains = [b"%s-%s.example" % (words[a], words[b])
               for a, b in rng.integers(0, len(pool.words), (domain_count, 2))]

    # Files: three large ones among many small ones, filled in document order.
    total = int(doc_bytes.sum())
    small = rng.lognormal(np.log(SMALL_MEDIAN), 1.0, int(total / SMALL_MEDIAN) + 100)
    small = np.clip(small, *SMALL_RANGE)
    small = small[: int(np.searchsorted(np.cumsum(small), total * (1 - BIG_FILES * BIG_SHARE))) + 1]
    targets = [("part", size) for size in small] + [("big", total * BIG_SHARE)] * BIG_FILES
    order_files = rng.permutation(len(targets))
    ends = np.searchsorted(np.cumsum(doc_bytes), np.cumsum([targets[i][1] for i in order_files]))
    ends = np.minimum(np.append(ends[:-1], len(doc_cluster)), len(doc_cluster))
    files, lo, numbers = [], 0, Counter[str]()
    for i, end in zip(order_files, ends, strict=True):
        if end > lo:
            kind = targets[i][0]
            files.append((f"{kind}-{numbers[kind]:06d}.jsonl", lo, int(end)))
            numbers[kind] += 1
            lo = int(end)

    kinds = Counter(doc_kind.tolist())
    summary = {
        "documents": len(doc_cluster), "clusters": clusters + 1, "exact_copies": kinds[EXACT],
        "near_copies": kinds[NEAR], "hot_copies": hot_copies,
        "hot_exact": int((doc_kind[doc_cluster == HOT] == EXACT).sum()),
        "duplicated_clusters": int((sizes > 1).sum()), "largest_clusters": sorted(sizes.tolist())[-5:],
        "cluster_sizes_log2": {f"{2 ** b}-{2 ** (b + 1) - 1}": n for b, n in
                               sorted(Counter(np.log2(sizes).astype(int).tolist()).items())},
        "domains": domain_count, "files": len(files), "big_files": numbers["big"],
        "pool_pieces": len(pool.pieces), "pool_bytes": int(pool.lengths.sum()), "words": len(pool.words),
    }
    return Plan(seed, pool, piece_ids, starts, counts, titles, header[:clusters], footer[:clusters],
                boilerplate, hot_text, doc_cluster, doc_kind, doc_domain, domains, files, summary)


# -- writing: one process per file, documents rebuilt from the plan -------------------------------------
_PLAN: Plan | None = None  # set before the pool forks, so the workers inherit it


def _base_text(plan: Plan, cluster: int) -> bytes:
    """A cluster's text, rebuilt from the plan each time a member is written (cheaper than keeping it)."""
    if cluster == HOT:
        return plan.hot_text
    pool = plan.pool
    parts = [b" ".join(pool.words[w] for w in plan.titles[cluster]).capitalize()]
    if plan.header[cluster] >= 0:
        parts.append(pool.pieces[plan.boilerplate[plan.header[cluster]]])
    start = plan.piece_start[cluster]
    parts.extend(pool.pieces[i] for i in plan.piece_ids[start:start + plan.piece_count[cluster]].tolist())
    if plan.footer[cluster] >= 0:
        parts.append(pool.pieces[plan.boilerplate[plan.footer[cluster]]])
    return SEPARATOR.join(parts)


def _near_copy(text: bytes, words: list[bytes], rnd: random.Random, edits: int) -> bytes:
    """``edits`` words replaced, deleted or inserted at random places. Spans run from one space to the
    next, and a JSON escape holds no space, so the result is still valid escaped text."""
    parts, previous = [], 0
    for position in sorted(rnd.randrange(len(text)) for _ in range(edits)):
        space = text.find(b" ", max(position, previous))
        after = text.find(b" ", space + 1) if space >= 0 else -1
        if after < 0:
            break
        parts.append(text[previous:space])
        choice = rnd.random()
        if choice < 0.4:  # replace the word
            parts.append(b" " + rnd.choice(words))
            previous = after
        elif choice < 0.7:  # delete it
            previous = after
        else:  # insert one before it
            parts.append(b" " + rnd.choice(words))
            previous = space
    parts.append(text[previous:])
    return b"".join(parts)


def _write_file(number: int) -> int:
    """Write one file of the plan, with random edits seeded by (seed, file number) alone; its JSONL bytes."""
    plan = _PLAN
    assert plan is not None
    name, lo, hi = plan.files[number]
    rnd = random.Random(f"{plan.seed}:{number}")
    words = plan.pool.words
    path = Path(plan.summary["folder"]) / (name + (".zst" if plan.summary["zst"] else ""))
    temporary = path.with_name(path.name + ".tmp")
    written = 0
    with open(temporary, "wb") as raw, contextlib.ExitStack() as stack:
        out = stack.enter_context(zstandard.ZstdCompressor(level=3).stream_writer(raw)) if plan.summary["zst"] else raw
        lines: list[bytes] = []
        for doc in range(lo, hi):
            cluster, kind = int(plan.doc_cluster[doc]), int(plan.doc_kind[doc])
            text = _base_text(plan, cluster)
            if kind == NEAR and cluster == HOT:  # the page as another site serves it
                site = plan.domains[rnd.randrange(len(plan.domains))]
                text = _near_copy(site + SEPARATOR + text, words, rnd, rnd.randint(1, 2))
            elif kind == NEAR:
                text = _near_copy(text, words, rnd, max(1, round(len(text) / 6 * rnd.uniform(*EDIT_RATE))))
            domain = plan.domains[plan.doc_domain[doc]]
            lines.append(b'{"id":"s%d-%09d","url":"https://%s/%s/%d","text":"%s"}\n'
                         % (plan.seed, doc, domain, rnd.choice(words), doc, text))
            if len(lines) == 4096 or doc == hi - 1:  # a few MB at a time, not a big file in memory
                chunk = b"".join(lines)
                out.write(chunk)
                written += len(chunk)
                lines.clear()
    temporary.rename(path)
    return written


def data_folder(root: Path, size_gb: float, seed: int, zst: bool) -> Path:
    return root / f"gen-{size_gb:g}GB-seed{seed}{'-zst' if zst else ''}"


def generate(folder: Path, size_gb: float, seed: int, zst: bool, jobs: int, pool: Pool) -> None:
    """The data set of ``size_gb`` in ``folder``: input/ and, outside it (a folder walk would read it as
    JSON input), generated.json with the planned structure, written last as the mark of a finished set."""
    done = folder / "generated.json"
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "input").mkdir(parents=True)
    global _PLAN
    started = time.perf_counter()
    _PLAN = make_plan(int(size_gb * 1e9), seed, pool)
    _PLAN.summary.update(folder=str(folder / "input"), zst=zst)
    planned = time.perf_counter() - started
    by_size = sorted(range(len(_PLAN.files)), key=lambda i: _PLAN.files[i][1] - _PLAN.files[i][2])
    with multiprocessing.get_context("fork").Pool(jobs) as workers:
        written = sum(workers.imap_unordered(_write_file, by_size))
    on_disk = sum(path.stat().st_size for path in (folder / "input").iterdir())
    summary = {**_PLAN.summary, "jsonl_bytes": written, "bytes_on_disk": on_disk, "seed": seed,
               "plan_seconds": round(planned, 1), "seconds": round(time.perf_counter() - started, 1),
               "jobs": jobs}
    _PLAN = None
    done.write_text(json.dumps(summary, indent=1))


# -- the runner ------------------------------------------------------------------------------------------
def _work_files(work: Path) -> dict[str, int]:
    """Files under OUTPUT/_work by the folder below it (a stage's datasets and completion records), as
    ``--keep-work`` leaves them: a file a stage wrote and deleted again is not counted."""
    if not work.is_dir():
        raise RuntimeError(f"{work} is missing after --keep-work: the job's work folder moved; update this")
    counts: Counter[str] = Counter()
    for folder, _, names in os.walk(work):
        if names:
            relative = Path(folder).relative_to(work).parts
            counts[relative[0] if relative else "."] += len(names)
    return dict(sorted(counts.items()))


def run_gristmill(inputs: Path, work: Path, partition_bytes: int | None, prefer: str | None = None) -> dict[str, Any]:
    out = work / "corpus"
    gristmill = gristmill_command()
    command = [gristmill, "dedup", str(inputs), "-o", str(out), "--keep-work", "--num-perm", str(NUM_PERM),
               "--bands", str(BANDS), "--rows", str(ROWS), "--ngram", str(NGRAM)]
    if partition_bytes is not None:
        command += ["--partition-bytes", str(partition_bytes)]
    if prefer is not None:
        command += ["--prefer", prefer]
    measured = measure(command, work / "gristmill.log")
    shown = subprocess.run([gristmill, "stats", str(out), "--json"], capture_output=True, text=True)
    if shown.returncode != 0:
        raise RuntimeError(f"gristmill stats {out} exited {shown.returncode}: {shown.stderr[-2000:]}")
    stats = json.loads(shown.stdout)
    files = _work_files(out / "_work")
    shutil.rmtree(out)
    return {**_peaks(measured, _ray_worker), "work_files": files, "stats": stats}


def _ray_worker(name: str) -> bool:
    """A Ray worker process (named ``ray::<task>``), not one of Ray's own agents."""
    return name.startswith("ray::") and not name.startswith(("ray::Dashboard", "ray::RuntimeEnv"))


def _peaks(measured: dict[str, Any], is_worker: Callable[[str], bool]) -> dict[str, Any]:
    """The tree's figures plus the peaks of its largest worker and of the command's own process."""
    processes = measured.pop("processes")
    workers = [p for p in processes if not p["root"] and is_worker(p["name"])]
    root = next(p for p in processes if p["root"])
    return {**measured, "worker_pss": max((p["pss"] for p in workers), default=0),
            "worker_rss": max((p["rss"] for p in workers), default=0), "workers_seen": len(workers),
            "driver_rss": root["rss"], "largest_workers": workers[:3]}


def run_one(tool: str, size: float, data: Path, run: int, root: Path, partition_bytes: int | None) -> dict[str, Any]:
    """One run of ``tool``: ``datatrove``, ``gristmill``, or ``gristmill --prefer POLICY``."""
    work = root / "runs" / f"{tool.split()[0]}-{size:g}GB-run{run}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    load = os.getloadavg()[0]
    if tool.startswith("gristmill"):
        prefer = tool.split("--prefer ", 1)[1] if "--prefer " in tool else None
        result = run_gristmill(data / "input", work, partition_bytes, prefer)
    else:  # datatrove's pool processes are the executor's children; the largest of them is its worker peak
        result = _peaks(run_datatrove(data / "input", work), lambda name: True)
        result["removed"] = len(result["removed"])
        for folder in work.iterdir():  # its signatures, buckets and output; the logs stay
            if folder.is_dir() and folder.name != "logs":
                shutil.rmtree(folder)
    return {**result, "tool": tool, "size": size, "run": run, "load": load, "breakdown": result["breakdown"][:8],
            "partition_bytes": partition_bytes}


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def report(results: list[dict[str, Any]], generated: dict[float, dict[str, Any]]) -> str:
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for result in results:
        groups.setdefault((result["tool"], result["size"]), []).append(result)
    per_gb = {key: _median(runs, "cpu") / (generated[key[1]]["jsonl_bytes"] / 1e9) for key, runs in groups.items()}
    unit = per_gb.get(("gristmill", 1.0))
    lines = ["| tool | GB | documents | runs | wall s | CPU s | CPU s/GB | vs 1 GB | tree PSS GiB | tree RSS GiB | "
             "largest worker PSS MiB | its RSS MiB | driver RSS MiB | work files | rounds | splits | "
             "removed / planned duplicates | 1-min load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for (tool, size), runs in sorted(groups.items(), key=lambda item: (item[0][0] != "gristmill", item[0][1])):
        info, last = generated[size], runs[-1]
        planned = info["exact_copies"] + info["near_copies"]  # the hot cluster's copies included
        if tool.startswith("gristmill"):
            documents = last["stats"]["documents"]
            removed = documents.get("exact_duplicate", 0) + documents.get("near_duplicate", 0)
            rounds = last["stats"].get("components", {}).get("rounds", "")
            splits = last["stats"].get("splits", "")
            files = sum(last["work_files"].values())
        else:
            removed, rounds, splits, files = last["removed"], "", "", ""
        ratio = f"{per_gb[(tool, size)] / unit:.2f}" if unit and tool == "gristmill" else ""
        loads = ", ".join(f"{r['load']:.1f}" for r in runs)
        lines.append(
            f"| {tool} | {info['jsonl_bytes'] / 1e9:.2f} | {info['documents']:,} | {len(runs)} | "
            f"{_median(runs, 'wall'):.1f} | {_median(runs, 'cpu'):.0f} | {per_gb[(tool, size)]:.1f} | {ratio} | "
            f"{_median(runs, 'peak_pss') / 2**30:.2f} | {_median(runs, 'peak') / 2**30:.2f} | "
            f"{_median(runs, 'worker_pss') / 2**20:.0f} | {_median(runs, 'worker_rss') / 2**20:.0f} | "
            f"{_median(runs, 'driver_rss') / 2**20:.0f} | {files} | {rounds} | {splits} | "
            f"{removed:,} / {planned:,} | {loads} |")
    for size in sorted({size for tool, size in groups if tool == "datatrove"}):
        if ("gristmill", size) in per_gb:
            lines += ["", f"datatrove / gristmill CPU s at {size:g} GB: "
                          f"{per_gb[('datatrove', size)] / per_gb[('gristmill', size)]:.1f}x"]
    for tool, size in sorted(key for key in groups if key[0].startswith("gristmill --prefer")):
        if ("gristmill", size) in per_gb:
            lines += ["", f"{tool} / gristmill (longest) median CPU s at {size:g} GB: "
                          f"{per_gb[(tool, size)] / per_gb[('gristmill', size)]:.3f}"]
    lines += ["", "largest workers (task at their peak, PSS MiB; last run):"]
    for (tool, size), runs in sorted(groups.items()):
        lines.append(f"- {tool} {size:g} GB: " + ", ".join(
            f"{w['name'].strip()[:40]} {w['pss'] / 2**20:.0f}" for w in runs[-1]["largest_workers"]))
    lines += ["", "work files by folder under OUTPUT/_work (last run):"]
    for (tool, size), runs in sorted(groups.items()):
        if tool.startswith("gristmill"):
            lines.append(f"- {tool} {size:g} GB: " + ", ".join(f"{k} {v:,}" for k, v in runs[-1]["work_files"].items()))
    lines += ["", "gristmill stage seconds (last run):"]
    for (tool, size), runs in sorted(groups.items()):
        if tool.startswith("gristmill"):
            lines.append(f"- {tool} {size:g} GB: " + json.dumps(runs[-1]["stats"].get("stage_seconds", {})))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("generate", "run"))
    parser.add_argument("--data", type=Path, default=DATA, help="where data sets, runs and results go")
    parser.add_argument("--sizes", default="0.3,1,3,10", help="GB of JSONL, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zst", action="store_true", help="write .jsonl.zst (read whole, never cut)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes that generate")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--datatrove", type=float, nargs="?", const=1.0, metavar="GB",
                        help="also run datatrove on this size (default 1 GB when given bare), in the first "
                             "run only: it takes ~2,000 CPU s per GB")
    parser.add_argument("--prefer", action="append", default=[], metavar="POLICY",
                        help="also run gristmill with --prefer POLICY in every run, beside the default (longest), "
                             "for the cost of a survivor policy (repeatable)")
    parser.add_argument("--partition-bytes", type=int,
                        help="gristmill's --partition-bytes (default its own, 128 MiB): a smaller reducer budget "
                             "reaches the size where every shuffle has several partitions sooner")
    args = parser.parse_args()
    sizes = [float(size) for size in args.sizes.split(",")]
    if args.datatrove is not None and (args.datatrove not in sizes or args.zst):
        parser.error("--datatrove needs its size in --sizes, and plain JSONL (its reader globs *.jsonl)")
    pool = None
    generated: dict[float, dict[str, Any]] = {}
    for size in sizes:
        folder = data_folder(args.data, size, args.seed, args.zst)
        if not (folder / "generated.json").exists():
            pool = pool or build_pool()
            generate(folder, size, args.seed, args.zst, args.jobs, pool)
        generated[size] = {**json.loads((folder / "generated.json").read_text()), "folder": folder}
        info = generated[size]
        print(f"{size:g} GB: {info['jsonl_bytes'] / 1e9:.2f} GB, {info['documents']:,} documents in "
              f"{info['files']:,} files, generated in {info['seconds']} s", flush=True)
    if args.command == "generate":
        return
    results = []
    for run in range(args.runs):
        for size in sizes:
            tools = ["gristmill", *(f"gristmill --prefer {policy}" for policy in args.prefer)]
            tools += ["datatrove"] if args.datatrove == size and run == 0 else []
            for tool in tools:
                result = run_one(tool, size, generated[size]["folder"], run, args.data, args.partition_bytes)
                results.append(result)
                print(f"run {run + 1} {tool} {size:g} GB: {result['wall']:.1f} s, {result['cpu']:.0f} CPU s, "
                      f"tree PSS {result['peak_pss'] / 2**30:.2f} GiB, largest worker PSS "
                      f"{result['worker_pss'] / 2**20:.0f} MiB", flush=True)
    table = report(results, generated)
    print(table)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.data / f"result-{stamp}.md").write_text(table + "\n")
    (args.data / f"result-{stamp}.json").write_text(json.dumps(
        {"sizes": sizes, "seed": args.seed, "zst": args.zst,
         "generated": {str(k): {**v, "folder": str(v["folder"])} for k, v in generated.items()},
         "runs": results}, indent=1, default=str))
    print(f"written: {args.data / f'result-{stamp}.md'} and .json")


if __name__ == "__main__":
    main()
