"""``make demo``: crawl the bundled demo web, deduplicate it on local Ray, and stream it as training batches.

One command shows the whole product on a machine with no network: it serves the demo sites
(``gristmill.pipeline.demo.site``) on 127.0.0.1, crawls them with the crawler, runs the dedup job on a local
Ray with two CPUs (``--prefer``: the original publishers' copies survive, not the wire's), prints
which domains lost documents to which and the corpus's statistics and writes the HTML report, lists the largest
duplicate clusters, trains a small BPE tokenizer on the kept text (nothing is downloaded), then
streams one epoch of packed token batches through ``StreamingLoader`` and prints what a training
loop would see, including an exact resume from a checkpoint. Everything lands under
``demo-output/`` (``--output``); the last lines say where. Progress bars show on a terminal only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gristmill.pipeline.report.progress import StageProgress, progress_bar

# The demo's Ray is private to this machine: keep it on loopback (Ray otherwise swaps 127.0.0.1 for the
# machine's network address). Set before anything imports Ray, which reads it once.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

OUTPUT = Path("demo-output")
EOS = "<|endoftext|>"
PAD = "<|pad|>"  # token id 0, so padding never looks like an end of document
SHORT_DOC_CHARS = 200  # kept documents shorter than this are listed as likely boilerplate
WHAT_IF_THRESHOLD = 0.9  # the demo recuts its clusters at this threshold from the stored pairs


def _say(text: str = "") -> None:
    print(text, flush=True)


def _heading(step: int, text: str) -> None:
    _say(f"\n== {step}. {text} " + "=" * max(0, 72 - len(text)))


# -- 1-2: the site and the crawl -------------------------------------------------------------------
def crawl_demo_site(site: Any, raw: Path) -> dict[str, Any]:
    """Crawl every demo site into ``raw`` (a raw corpus); returns the crawl summary."""
    from gristmill import crawlers

    pages = sum(page.kind not in ("robots", "sitemap") for _, page in site.pages())
    bar = progress_bar(total=pages, unit="page", desc="crawl")

    def progress(report: dict[str, Any]) -> None:
        bar.n = report["fetched"]
        bar.set_postfix(queued=report["queued"], refresh=False)
        bar.refresh()

    try:
        summary = crawlers.crawl(
            site.seeds, str(raw), host_map=site.host_map, allow_networks=["127.0.0.0/8"], min_delay=0.0,
            extract_workers=1, progress_interval=0.25, commit_interval=5.0, on_progress=progress)
        bar.n = summary.fetched_this_run  # progress reports are periodic; the last one may predate the end
        bar.set_postfix(queued=summary.queued, refresh=False)
    finally:
        bar.close()
    return summary.to_dict()


# -- 3: dedup on Ray -------------------------------------------------------------------------------
# Who should survive when a story appears on several sites: the original publishers first, then the
# mirror, the news wire last (longest-wins kept the wire's copies: its credit line makes them longest).
PUBLISHERS = ("# the original publishers first", "lindenpost.test", "yamakaze.test", "jornaldovale.test",
              "# then the mirror, the wire last", "lindenpost-mirror.test", "newswire.test")


def deduplicate(raw: Path, corpus: Path, removed: Path, publishers: Path) -> dict[str, Any]:
    """Run the dedup job on a local two-CPU Ray, the survivors chosen by ``--prefer domains:publishers``;
    returns the statistics it stored in the manifest."""
    import ray

    from gristmill.pipeline.cli import quiet_third_party_warnings
    from gristmill.pipeline.job import DedupConfig, job_stages, run_dedup

    if not ray.is_initialized():
        quiet_third_party_warnings()
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    publishers.write_text("\n".join(PUBLISHERS) + "\n", encoding="utf-8")
    config = DedupConfig(inputs=[str(raw)], output=str(corpus), removed=str(removed), num_partitions=2,
                         row_group_bytes=16 * 1024, shard_bytes=256 * 1024, prefer=f"domains:{publishers}")
    _say(f"gristmill dedup {raw} -o {corpus} --removed {removed} --prefer domains:{publishers}")
    progress = StageProgress("dedup", job_stages(config), quiet=not sys.stderr.isatty())
    stats = run_dedup(config, progress=progress)
    pairs = sorted(stats.get("lost_to", {}).items(), key=lambda kv: (-kv[1]["input"], kv[0]))
    across = [(pair, row) for pair, row in pairs if pair.split(" -> ")[0] != pair.split(" -> ")[1]]
    _say(f"prefer     {stats['survivor_policy']}")
    _say("lost to    " + "; ".join(f"{pair}: {row['input']}" for pair, row in across[:6])
         + ("" if len(across) <= 6 else f"; and {len(across) - 6} more pairs"))
    return stats


# -- 4: statistics, report, clusters ---------------------------------------------------------------
def show_statistics(corpus_url: str, report_path: Path) -> dict[str, Any]:
    """Print the statistics and the largest clusters, write the HTML report; returns the checks made."""
    from gristmill.pipeline.format import SOURCE_COLUMN, Corpus
    from gristmill.pipeline.report.cluster_text import render_list
    from gristmill.pipeline.report.duplicates import find_clusters, open_removed
    from gristmill.pipeline.report.html_report import write_report
    from gristmill.pipeline.report.stats_text import render
    from gristmill.pipeline.report.what_if import render_what_if, what_if

    corpus = Corpus.open(corpus_url)
    _say(render(corpus.stats))
    verified = corpus.verify()
    _say(f"\nverify     {sum(r.ok for r in verified)}/{len(verified)} shards match their manifest checksums")
    write_report(corpus_url, str(report_path))
    _say(f"report     {report_path}  (open it in a browser)")
    removed = open_removed(corpus)
    clusters = find_clusters(corpus, removed)
    _say("")
    _say(render_list(clusters, 5, corpus.num_rows + removed.num_rows))
    texts = corpus.to_table(["text", SOURCE_COLUMN])
    short = [s for s, t in zip(texts[SOURCE_COLUMN].to_pylist(), texts["text"].to_pylist(), strict=True)
             if len(t) < SHORT_DOC_CHARS]
    if short:
        _say(f"\nnote       {len(short)} kept documents are shorter than {SHORT_DOC_CHARS} characters: tag, archive "
             "and home pages whose text is only navigation. Dedup removes copies, not thin pages; filter them "
             "before training if they matter (e.g. " + ", ".join(short[:2]) + ").")
    near = next((c for c in clusters if c.near), clusters[0] if clusters else None)
    # Tuning the threshold without re-running: the job kept its candidate pairs with their similarity.
    _say(f"\ngristmill clusters {corpus_url} --what-if {WHAT_IF_THRESHOLD}")
    recut = what_if(corpus, WHAT_IF_THRESHOLD)
    _say(render_what_if(recut))
    return {"shards_verified": all(r.ok for r in verified), "clusters": len(clusters),
            "example_cluster": near.id if near else None, "short_documents": len(short),
            "what_if": {"threshold": WHAT_IF_THRESHOLD, "now": recut["now"], "then": recut["what_if"]}}


# -- 5: the trainer's view -------------------------------------------------------------------------
def train_tokenizer(corpus_url: str, path: Path, vocab_size: int = 2000) -> None:
    """A byte-level BPE trained on the kept text: real subword tokens without downloading a model."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from gristmill.pipeline.format import Corpus

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = (t for table in Corpus.open(corpus_url).iter_tables(["text"]) for t in table["text"].to_pylist())
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.save(str(path))


def stream_epoch(corpus_url: str, tokenizer_path: Path, batch_size: int, seq_len: int,
                 on_batch: Callable[[int, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """One epoch of packed token batches, as a training loop sees them; returns what it saw."""
    import numpy as np
    from tokenizers import Tokenizer

    from gristmill.loaders import StreamingLoader
    from gristmill.loaders.tokenizers import FileTokenizer

    tokenizer = FileTokenizer(str(tokenizer_path), eos_token=EOS)
    loader = StreamingLoader(corpus_url, batch_size=batch_size, seq_len=seq_len, tokenizer=tokenizer, seed=0,
                             pad_id=0)
    seen: dict[str, Any] = {"batches": 0, "tokens": 0, "padding": 0, "documents": 0}
    first: dict[str, Any] | None = None
    started = time.perf_counter()
    with progress_bar(unit="batch", desc="epoch") as bar:
        for batch in loader:
            tokens, segments = batch["tokens"], batch["segment_ids"]
            if first is None:
                first = batch
                seen["shape"], seen["dtype"] = list(tokens.shape), str(tokens.dtype)
            seen["batches"] += 1
            seen["last_shape"] = list(tokens.shape)
            seen["tokens"] += int((segments > 0).sum())
            seen["padding"] += int((segments == 0).sum())
            seen["documents"] += int(sum(len(set(row[row > 0].tolist())) for row in segments))
            if on_batch is not None:
                on_batch(seen["batches"], batch)
            bar.update(1)
    seen["seconds"] = round(time.perf_counter() - started, 3)
    seen["counters"] = loader.counters.as_dict()
    if first is not None:
        row, segment = first["tokens"][0], first["segment_ids"][0]
        pieces, counts = np.unique(segment[segment > 0], return_counts=True)
        longest = pieces[np.argmax(counts)]  # the longest document piece in the row reads best
        decoder = Tokenizer.from_file(str(tokenizer_path))
        seen["sample_tokens"] = row[segment == longest][:16].tolist()
        seen["sample_text"] = decoder.decode(row[segment == longest].tolist())
        seen["sample_pieces"] = len(pieces)
    return seen


def resume_check(corpus_url: str, tokenizer_path: Path, batch_size: int, seq_len: int, stop_after: int) -> dict[str, Any]:
    """Stop after ``stop_after`` batches, checkpoint, restore into a fresh loader: is the next batch the same?"""
    import numpy as np

    from gristmill.loaders import StreamingLoader
    from gristmill.loaders.tokenizers import FileTokenizer

    def make() -> Any:
        return StreamingLoader(corpus_url, batch_size=batch_size, seq_len=seq_len, seed=0, pad_id=0,
                               tokenizer=FileTokenizer(str(tokenizer_path), eos_token=EOS))

    reference = [b["tokens"] for b in make()]
    if len(reference) <= stop_after:
        return {"checked": False, "reason": f"the epoch has only {len(reference)} batches"}
    first = make()
    iterator = iter(first)
    for _ in range(stop_after):
        next(iterator)
    state = first.state_dict()
    second = make()
    second.load_state_dict(json.loads(json.dumps(state)))
    rest = [b["tokens"] for b in second]
    same = len(rest) == len(reference) - stop_after and all(
        np.array_equal(a, b) for a, b in zip(rest, reference[stop_after:], strict=True))
    return {"checked": True, "stop_after": stop_after, "state_bytes": len(json.dumps(state)), "identical": same}


def show_training_view(seen: dict[str, Any], resumed: dict[str, Any], batch_size: int, seq_len: int) -> None:
    last = "" if seen.get("last_shape") == seen.get("shape") else f", the last {seen.get('last_shape')} (what was left)"
    _say(f"batches    {seen['batches']} of shape {seen.get('shape')} ({seen.get('dtype')}){last}: "
         f"batch_size {batch_size} x seq_len {seq_len}, documents packed back to back, each ending in {EOS}")
    total = seen["tokens"] + seen["padding"]
    _say(f"tokens     {seen['tokens']:,} real + {seen['padding']:,} padding ({100 * seen['padding'] / max(total, 1):.1f}%), "
         f"{seen['documents']:,} document pieces, in {seen['seconds']:.2f} s")
    counters = seen["counters"]
    _say(f"counters   {counters['blocks_fetched']} blocks fetched, {counters['bytes_read']:,} bytes read, "
         f"{counters['blocks_per_batch']:.1f} distinct blocks per batch (shuffle quality), "
         f"waited {counters['wait_seconds']:.2f} s for data")
    if "sample_text" in seen:
        sample = " ".join(seen["sample_text"].split())
        _say(f"sample     row 0 of batch 0 packs {seen['sample_pieces']} document pieces; its longest starts with "
             f"token ids {seen['sample_tokens']}")
        _say(f"           decoded: {sample[:300]}{' …' if len(sample) > 300 else ''}")
    if resumed.get("checked"):
        verdict = "identical to the uninterrupted epoch" if resumed["identical"] else "DIFFERENT from the uninterrupted epoch"
        _say(f"resume     stopped after {resumed['stop_after']} batches, saved a {resumed['state_bytes']}-byte "
             f"state_dict, restored it into a new loader: the remaining batches are {verdict}")


# -- the whole demo --------------------------------------------------------------------------------
def run_demo(output: Path, batch_size: int = 8, seq_len: int = 256) -> dict[str, Any]:
    """Every step; returns (and writes to ``output/summary.json``) what each produced."""
    from gristmill.pipeline.demo.site.server import serving

    output = output.resolve()
    paths = {name: output / name for name in ("raw", "corpus", "removed")}
    paths.update(report=output / "report.html", tokenizer=output / "tokenizer.json",
                 summary=output / "summary.json", publishers=output / "publishers.txt")
    for path in paths.values():  # a fresh run: the crawler and the job would otherwise resume
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    output.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"paths": {k: str(v) for k, v in paths.items()}}
    began = time.perf_counter()

    with serving() as site:
        _heading(1, "The demo web: five small sites on 127.0.0.1")
        for host, base in site.bases.items():
            kinds: dict[str, int] = {}
            for page in site.sites[host].values():
                kinds[page.kind] = kinds.get(page.kind, 0) + 1
            _say(f"  {base:<36} " + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())))
        _say("  origins publish 16 articles (en, de, ja, pt); print versions and a mirror copy them exactly, "
             "a news wire\n  re-publishes them with small edits; tag and archive pages hold only navigation.")
        _heading(2, "Crawl (robots.txt, sitemaps, politeness, text extraction, language id)")
        crawl = crawl_demo_site(site, paths["raw"])
    summary["crawl"] = crawl
    _say(f"crawled    {crawl['documents']} documents with {crawl['requests']} requests in {crawl['elapsed_s']:.1f} s; "
         f"HTTP statuses {crawl['status_counts']}; outcomes {crawl['outcomes']}")
    if crawl["errors"]:
        _say("errors     " + "; ".join(crawl["errors"][:5]))

    _heading(3, "Deduplicate on local Ray (exact hashes, MinHash LSH, connected components, --prefer)")
    summary["stats"] = deduplicate(paths["raw"], paths["corpus"], paths["removed"], paths["publishers"])

    _heading(4, "What the dedup did (gristmill stats / gristmill clusters, --what-if)")
    summary["checks"] = show_statistics(str(paths["corpus"]), paths["report"])

    _heading(5, "What a training loop sees (StreamingLoader, packed tokens)")
    train_tokenizer(str(paths["corpus"]), paths["tokenizer"])
    summary["loader"] = stream_epoch(str(paths["corpus"]), paths["tokenizer"], batch_size, seq_len)
    summary["resume"] = resume_check(str(paths["corpus"]), paths["tokenizer"], batch_size, seq_len, stop_after=3)
    show_training_view(summary["loader"], summary["resume"], batch_size, seq_len)

    summary["seconds"] = round(time.perf_counter() - began, 1)
    paths["summary"].write_text(json.dumps(summary, indent=2, ensure_ascii=False, default=str), encoding="utf-8")
    example = summary["checks"]["example_cluster"]
    _heading(6, f"Where everything is (the demo took {summary['seconds']:.0f} s)")
    _say(f"  raw crawl           {paths['raw']}")
    _say(f"  corpus              {paths['corpus']}   gristmill inspect {paths['corpus']} --verify")
    _say(f"  statistics          gristmill stats {paths['corpus']}  (--json)")
    _say(f"  HTML report         {paths['report']}")
    _say(f"  removed documents   {paths['removed']}")
    if example:
        _say(f"  one cluster         gristmill clusters {paths['corpus']} --show {example}")
    _say(f"  tokenizer           {paths['tokenizer']}")
    _say(f"  this run's numbers  {paths['summary']}")
    _say("  a tour of all this  docs/DEMO.md")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gristmill.pipeline.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help=f"where to write everything (default {OUTPUT}/)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per batch (default 8)")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        run_demo(args.output, args.batch_size, args.seq_len)
    finally:
        if "ray" in sys.modules:
            import ray

            ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
