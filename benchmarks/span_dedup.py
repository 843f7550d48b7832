"""Span-level dedup side by side: ``gristmill dedup --spans``, datatrove's SentenceDedup and a plain
single-process hash-of-lines baseline, on the same web-like corpus, in one run.

The corpus is built from HTML nobody here wrote: the 181 real article pages of the shared
article-extraction benchmark, extracted *without* boilerplate removal (every text block of the page
on its own line: menus, footers, share links, cookie notices, as a crawl without a main-content
extractor stores them). Each page is a site template: its extracted lines outside the article body
(ground truth) are the site's boilerplate, kept in place before and after the body. A document is one
template with a body of 3-8 article paragraphs from the whole pool, each paragraph's words reordered
for that document (so the body is text no other document has), and, one time in five, one paragraph
left as it was (a syndicated paragraph, repeated across sites). Documents are generated until the
corpus reaches ``--mb``.

Measured per tool: bytes cut or removed, documents out, **unique lines damaged** (lines of at least
20 normalised characters that occur in no other document, none of whose sentences occur in another
document, yet are not intact in the output: must be 0; for gristmill, documents its document-level
dedup removed as near duplicates, the plain job's, are not counted: that is not the span pass), CPU seconds of the whole process tree
(per GB of input), and the largest resident memory of one process (``peak/worker``). Run:

    make bench-env
    .venv-bench/bin/python benchmarks/span_dedup.py --mb 100 --runs 3 --datatrove-python .venv-bench/bin/python
    .venv-bench/bin/python benchmarks/span_dedup.py --mb 300 1000 --runs 1 \\
        --tools gristmill "gristmill line" "gristmill sentences:3" "hash-of-lines baseline"
    .venv-bench/bin/python benchmarks/span_dedup.py --mb 3000 --runs 1 --cpu-only --tools gristmill "gristmill line"

``--datatrove-python``: a Python with ``datatrove==0.10.1`` and spaCy (benchmarks/requirements.txt,
with ``xxhash<4``, which datatrove's hashing needs: ``make bench-env`` builds ``.venv-bench``). Several
``--mb`` sizes give one table each: CPU-s per GB should stay flat as the fixed cost (Ray's start,
imports, numba compiling) spreads. ``--cpu-only`` reads no output back: the checks hold every text in
memory, which at 3 GB is more than a 23 GB machine has.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import shutil
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_tree import gristmill_command, measure  # noqa: E402
from shared_data import ARTICLES  # noqa: E402

DATA = ARTICLES
BLOCKS = {"p", "div", "li", "h1", "h2", "h3", "h4", "h5", "h6", "tr", "br", "section", "article", "header",
          "footer", "nav", "aside", "ul", "ol", "table", "blockquote", "pre", "form", "main", "figcaption", "dd",
          "dt", "title", "option", "td", "th", "button", "label"}
SENTENCE = re.compile(r"(?<=[.!?])\s+")


def extract_all_text(body: bytes) -> list[str]:
    """Every text block of a page, one per line, in page order: no boilerplate removal."""
    import lxml.html

    from gristmill.crawlers.extract import decode_html

    html, _ = decode_html(body)
    root = lxml.html.document_fromstring(html.encode("utf-8"), parser=lxml.html.HTMLParser(encoding="utf-8"))
    for element in root.xpath("//script|//style|//noscript|//template|//svg"):
        element.drop_tree()
    parts: list[str] = []

    def walk(element: Any) -> None:
        block = isinstance(element.tag, str) and element.tag in BLOCKS
        if block:
            parts.append("\n")
        if isinstance(element.tag, str) and element.text:
            parts.append(element.text)
        for child in element:
            walk(child)
        if block:
            parts.append("\n")
        if element.tail:
            parts.append(element.tail)

    walk(root)
    return [line for line in (" ".join(piece.split()) for piece in "".join(parts).split("\n")) if line]


def templates(data: Path) -> tuple[list[tuple[list[str], list[str]]], list[str]]:
    """Per page, its boilerplate lines before and after the article; and every article paragraph."""
    truth = json.loads((data / "ground-truth.json").read_text())
    pages, paragraphs = [], []
    for page_id, entry in sorted(truth.items()):
        body = [" ".join(p.split()) for p in entry["articleBody"].split("\n") if len(p.split()) >= 8]
        paragraphs += body
        lines = extract_all_text(gzip.decompress((data / "html" / f"{page_id}.html.gz").read_bytes()))
        article = set(body)
        inside = [i for i, line in enumerate(lines) if line in article]
        first, last = (inside[0], inside[-1]) if inside else (len(lines) // 2, len(lines) // 2)
        pages.append(([line for line in lines[:first] if line not in article],
                      [line for line in lines[last + 1:] if line not in article]))
    return pages, paragraphs


def build_corpus(path: Path, megabytes: float, seed: int = 0) -> dict[str, Any]:
    """The JSONL corpus of about ``megabytes`` MB (see the module docstring)."""
    pages, paragraphs = templates(DATA)
    rng = random.Random(seed)
    size, count = 0, 0
    with open(path, "w") as out:
        while size < megabytes * 1e6:
            head, tail = pages[count % len(pages)]
            body = []
            for paragraph in rng.sample(paragraphs, rng.randint(3, 8)):
                words = paragraph.split()
                rng.shuffle(words)
                body.append(" ".join(words))
            if rng.random() < 0.2:
                body.insert(rng.randrange(len(body) + 1), rng.choice(paragraphs))
            line = json.dumps({"id": f"doc{count:08d}", "text": "\n".join([*head, *body, *tail])}) + "\n"
            out.write(line)
            size += len(line)
            count += 1
    return {"documents": count, "bytes": size, "templates": len(pages)}


def _normalised(texts: set[str]) -> dict[str, str]:
    """Each text's normalised form, the job's normalisation over the whole batch at once."""
    from gristmill.dedup.normalize import DEFAULT_NORMALIZE, fold_prepared, prepare

    ordered = sorted(texts)
    data, offsets = fold_prepared(*prepare(ordered, DEFAULT_NORMALIZE), DEFAULT_NORMALIZE)
    raw = data.tobytes()
    return {text: raw[offsets[i]:offsets[i + 1]].decode() for i, text in enumerate(ordered)}


def unique_lines(path: Path) -> dict[str, set[str]]:
    """Per document, its lines that neither occur in another document nor share a sentence with one."""
    docs = [json.loads(line) for line in open(path)]
    lines = {doc["id"]: [line.strip() for line in doc["text"].split("\n")] for doc in docs}
    sentences = {line: SENTENCE.split(line) for doc_lines in lines.values() for line in doc_lines}
    normal = _normalised({s for parts in sentences.values() for s in parts} | set(sentences))
    line_docs: dict[str, set[str]] = defaultdict(set)
    sentence_docs: dict[str, set[str]] = defaultdict(set)
    for doc_id, doc_lines in lines.items():
        for line in doc_lines:
            line_docs[line].add(doc_id)
            for sentence in sentences[line]:
                sentence_docs[normal[sentence]].add(doc_id)
    found: dict[str, set[str]] = defaultdict(set)
    for doc_id, doc_lines in lines.items():
        for line in doc_lines:
            if (len(normal[line]) >= 20 and len(line_docs[line]) == 1
                    and all(len(sentence_docs[normal[s]]) == 1 for s in sentences[line])):
                found[doc_id].add(line)
    return found


def damaged(unique: dict[str, set[str]], output: dict[str, str], whole: set[str] = frozenset()) -> int:
    """Unique lines not intact (as a line) in their document's output, a removed document included,
    except documents in ``whole`` (removed whole by gristmill's document dedup, before any span pass)."""
    count = 0
    for doc_id, lines in unique.items():
        if doc_id in whole:
            continue
        kept = {line.strip() for line in output.get(doc_id, "").split("\n")}
        count += sum(line not in kept for line in lines)
    return count


def baseline(source: Path, target: Path, normalised: bool = False) -> None:
    """The plain baseline, in this process: each stripped line (of at least 20 characters) hashed;
    a line already seen in an earlier document is cut. Two passes, one dict of every line hash. With
    ``normalised``, each line is compared after the job's normalisation (``gristmill.dedup.normalize``,
    one call per line), as ``--spans line`` compares them: the same work, done the plain way."""
    import xxhash

    from gristmill.dedup.normalize import normalize

    def key(line: str) -> str:
        return normalize(line) if normalised else line.strip()

    def counted(text: str) -> list[str]:
        return [k for k in map(key, text.split("\n")) if len(k) >= 20]

    first: dict[int, int] = {}
    with open(source) as lines:
        for number, raw in enumerate(lines):
            for text in counted(json.loads(raw)["text"]):
                first.setdefault(xxhash.xxh3_64_intdigest(text.encode()), number)
    with open(source) as lines, open(target, "w") as out:
        for number, raw in enumerate(lines):
            doc = json.loads(raw)
            kept = [line for line, text in ((line, key(line)) for line in doc["text"].split("\n"))
                    if len(text) < 20 or first[xxhash.xxh3_64_intdigest(text.encode())] == number]
            out.write(json.dumps({"id": doc["id"], "text": "\n".join(kept)}) + "\n")


DATATROVE = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.dedup.sentence_dedup import (SentDedupConfig, SentenceDedupFilter, SentenceDedupSignature,
                                                     SentenceFindDedups)
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.writers import JsonlWriter

source, work = sys.argv[1], sys.argv[2]
config = SentDedupConfig(n_sentences=3, split_sentences=True, only_dedup_in_index=True, min_doc_words=0,
                         min_num_sentences=0)
LocalPipelineExecutor([JsonlReader(source), SentenceDedupSignature(work + "/sigs", config=config)],
                      tasks=1, workers=1, logging_dir=work + "/logs1").run()
LocalPipelineExecutor([SentenceFindDedups(work + "/sigs", work + "/dups", config=config)],
                      tasks=1, workers=1, logging_dir=work + "/logs2").run()
LocalPipelineExecutor([JsonlReader(source), SentenceDedupFilter(work + "/dups", config=config),
                       JsonlWriter(work + "/out", compression=None)], tasks=1, workers=1,
                      logging_dir=work + "/logs3").run()
"""


def read_output(kind: str, folder: Path) -> dict[str, str]:
    """Document id -> output text, for each tool's output."""
    if kind == "gristmill":
        import pyarrow.parquet as pq

        return {row["id"]: row["text"] for shard in sorted(folder.glob("part-*.parquet"))
                for row in pq.read_table(shard, columns=["id", "text"]).to_pylist()}
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else [folder]
    return {doc["id"]: doc["text"] for f in files for doc in map(json.loads, open(f))}


def run_tool(name: str, corpus: Path, work: Path, datatrove_python: str | None) -> tuple[dict[str, Any], Path, str]:
    """One measured run: (what measure() reports, the output folder, its kind). The CPU seconds are the
    larger of the process tree's sampled figure and the reaped children's own accounting: a process
    that exits between two samples (the baseline, a short worker) takes its last seconds with it."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    measured, out, kind = _run_tool(name, corpus, work, datatrove_python)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {**measured, "cpu": max(measured["cpu"], reaped)}, out, kind


def _run_tool(name: str, corpus: Path, work: Path, datatrove_python: str | None) -> tuple[dict[str, Any], Path, str]:
    shutil.rmtree(work, ignore_errors=True)  # a finished job left there would be returned, not run again
    work.mkdir(parents=True)
    log = work / "log.txt"
    if name.startswith("gristmill"):
        mode = name.partition(" ")[2]
        out = work / "corpus"
        command = [gristmill_command(), "dedup", str(corpus), "-o", str(out), "--quiet", "--overwrite"]
        command += ["--spans", mode] if mode else []
        return measure(command, log), out, "gristmill"
    if name == "datatrove SentenceDedup":
        script = work / "datatrove_run.py"
        script.write_text(DATATROVE)
        measured = measure([datatrove_python or "", str(script), str(corpus), str(work)], log)
        return measured, work / "out", "jsonl"
    out = work / "baseline.jsonl"
    normalised = ["--normalised"] if name.startswith("hash-of-normalised") else []
    return measure([sys.executable, __file__, "--baseline-only", str(corpus), str(out), *normalised], log), out, "jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, nargs="+", default=[30],
                        help="corpus sizes in MB, one table each (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="runs per tool; medians reported (default: %(default)s)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/span-dedup-bench"))
    parser.add_argument("--datatrove-python", help="a Python with datatrove 0.10.1 and spaCy (default: skip it)")
    parser.add_argument("--tools", nargs="+", help="run only these (default: all; the first, plain gristmill, is "
                        "what the others' damage and ratio are measured against)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="measure CPU and memory only, reading no output back (for corpora of several GB)")
    parser.add_argument("--baseline-only", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--normalised", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.baseline_only:
        baseline(*args.baseline_only, normalised=args.normalised)
        return
    args.work.mkdir(parents=True, exist_ok=True)
    for megabytes in args.mb:
        compare(args.work, megabytes, args.runs, args.datatrove_python, args.tools, args.cpu_only)


def compare(work: Path, megabytes: float, runs: int, datatrove_python: str | None, only: list[str] | None,
            cpu_only: bool = False) -> None:
    """One corpus of ``megabytes``: every tool ``runs`` times, a table of medians, the issue's ratios;
    with ``cpu_only`` no output is read back (the checks hold every text in memory: 23 GB at 3 GB)."""
    corpus = work / f"corpus-{megabytes:g}mb.jsonl"
    if not corpus.exists():
        print("corpus:", build_corpus(corpus, megabytes), file=sys.stderr)
    size = corpus.stat().st_size
    unique = {} if cpu_only else unique_lines(corpus)
    inputs = {} if cpu_only else read_output("jsonl", corpus)
    bytes_in = sum(len(t.encode()) for t in inputs.values())
    tools = ["gristmill", "gristmill line", "gristmill sentences:3", "hash-of-lines baseline",
             "hash-of-normalised-lines baseline"]
    tools += ["datatrove SentenceDedup"] if datatrove_python else []
    tools = [tool for tool in tools if not only or tool in only]
    rows = []
    whole: set[str] = set()  # documents gristmill's document dedup removed: not the span pass's doing
    for tool in tools:
        measured = [run_tool(tool, corpus, work / f"{megabytes:g}mb-{tool.replace(' ', '-')}-{run}", datatrove_python)
                    for run in range(runs)]
        out, kind = measured[-1][1], measured[-1][2]
        output = {} if cpu_only else read_output(kind, out)
        if tool == "gristmill":
            whole = set(inputs) - set(output)
        kept = sum(len(t.encode()) for t in output.values())
        workers = [p["rss"] for r, _, _ in measured for p in r["processes"]]
        cpu = statistics.median(r["cpu"] for r, _, _ in measured)
        checked = None if cpu_only else damaged(unique, output, whole if tool.startswith("gristmill") else set())
        rows.append({"tool": tool, "documents_out": None if cpu_only else len(output),
                     "bytes_cut_or_removed": None if cpu_only else bytes_in - kept, "unique_lines_damaged": checked,
                     "cpu_s": round(cpu, 2), "cpu_s_per_gb": round(cpu / (size / 1e9), 1),
                     "wall_s": round(statistics.median(r["wall"] for r, _, _ in measured), 2),
                     "peak_worker_mib": round(max(workers) / 2**20), "runs": runs})
        print(json.dumps(rows[-1]), file=sys.stderr)
    cpu = {row["tool"]: row["cpu_s"] for row in rows}
    plain = cpu.get("gristmill", float("nan"))
    counted = "not read back (--cpu-only)" if cpu_only else (f"{len(inputs):,} documents, "
                                                             f"{sum(map(len, unique.values())):,} unique lines")
    print(f"corpus: {size / 1e6:.1f} MB, {counted}; medians of {runs} runs, {time.strftime('%Y-%m-%d')}")
    print(f"{'tool':<26} {'docs out':>9} {'bytes cut':>11} {'damaged':>8} {'CPU-s':>8} {'CPU-s/GB':>9} "
          f"{'vs plain job':>12} {'peak/worker':>12}")
    for row in rows:
        docs, cut, hurt = ("n/a" if row[k] is None else f"{row[k]:,}"
                           for k in ("documents_out", "bytes_cut_or_removed", "unique_lines_damaged"))
        print(f"{row['tool']:<26} {docs:>9} {cut:>11} {hurt:>8} {row['cpu_s']:>8.1f} {row['cpu_s_per_gb']:>9.0f} "
              f"{row['cpu_s'] / plain:>11.2f}x {row['peak_worker_mib']:>8} MiB")
    for mode in ("line", "sentences:3"):  # what the span pass adds to the same job, per GB
        if f"gristmill {mode}" in cpu:
            added = cpu[f"gristmill {mode}"] - plain
            print(f"span pass {mode}: {added:.1f} CPU-s ({added / (size / 1e9):.0f} CPU-s/GB), "
                  f"+{added / plain:.0%} of the plain job" + (" (target: at most +30%)" if mode == "line" else ""))
    for name in ("hash-of-lines baseline", "hash-of-normalised-lines baseline"):
        if cpu.get(name) and "gristmill line" in cpu:
            print(f"line span pass / {name}: {(cpu['gristmill line'] - plain) / cpu[name]:.2f}x "
                  f"(whole job: {cpu['gristmill line'] / cpu[name]:.2f}x; target at most 0.5x)")
    if "datatrove SentenceDedup" in cpu and "gristmill sentences:3" in cpu:
        print(f"sentences:3 whole job / datatrove SentenceDedup: "
              f"{cpu['gristmill sentences:3'] / cpu['datatrove SentenceDedup']:.3f}x (target at most 0.1x)")


if __name__ == "__main__":
    main()
