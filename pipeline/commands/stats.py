"""``gristmill stats CORPUS``: a corpus's dedup statistics, readably or as JSON.

The totals come from the manifest and every breakdown in full from the statistics table beside the
corpus (``gristmill.pipeline.format.stats_table``; older corpora kept them in the manifest). ``--html FILE``
also writes the same statistics as a self-contained HTML page with charts
(``gristmill.pipeline.report.html_report.write_report``). A raw crawl (written by ``gristmill crawl``) has no
funnel yet: for one, ``stats`` says what it is and what to run next.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from gristmill.pipeline.commands import options
from gristmill.pipeline.report.terminal import terminal_safe

if TYPE_CHECKING:  # pyarrow is imported when the command runs, so `gristmill stats --help` is quick
    from gristmill.pipeline.format import Corpus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", help="corpus folder or URL")
    parser.add_argument("--html", metavar="FILE",
                        help="also write a self-contained HTML report with charts to FILE, a local path "
                             "(default: none)")
    options.add_output_flags(parser, json_help="print the statistics as JSON")


def describe_raw_crawl(corpus: Corpus, quiet: bool = True) -> dict[str, Any] | None:
    """What a corpus written by ``gristmill crawl`` holds (documents, hosts, fetch outcomes), or None
    for any other corpus: a crawl has no dedup funnel yet, and an all-zero one would say it lost
    everything. Hosts are counted from the ``domain`` column, one shard at a time, with progress
    unless ``quiet``. CorpusError when the crawl statistics are not what a crawl writes or a shard
    cannot be read."""
    import pyarrow.compute as pc

    from gristmill.pipeline.format import CorpusError
    from gristmill.pipeline.report.progress import Progress

    crawl = corpus.stats.get("crawl")
    if not isinstance(crawl, dict) or "documents" in corpus.stats:
        return None
    outcomes = crawl.get("outcomes") or {}
    if not isinstance(outcomes, dict) or not all(
            isinstance(count, int) and not isinstance(count, bool) and count >= 0 for count in outcomes.values()):
        raise CorpusError(f"{corpus.url}: the manifest's crawl outcomes are not counts: {str(outcomes)[:200]}")
    hosts: set[str] = set()
    if "domain" in corpus.schema.names:
        with Progress("counting hosts", len(corpus.shards), "shards", quiet=quiet) as progress:
            for shard in corpus.shards:
                try:
                    domains = corpus.read_shard(shard, ["domain"]).column("domain")
                except (OSError, ValueError) as exc:  # pyarrow's errors for a damaged file are ValueErrors
                    raise CorpusError(f"{corpus.shard_path(shard)}: a shard cannot be read: {exc}") from None
                hosts.update(host for host in pc.unique(domains).to_pylist() if host)
                progress.update(1)
    return {"kind": "raw crawl", "documents": corpus.num_rows, "hosts": len(hosts), "outcomes": outcomes}


def render_raw_crawl(corpus_url: str, summary: dict[str, Any]) -> str:
    outcomes = ", ".join(f"{kind} {count:,}" for kind, count in sorted(summary["outcomes"].items(),
                                                                       key=lambda kv: -kv[1]))
    return (f"{corpus_url} is a raw crawl of {summary['documents']:,} documents from {summary['hosts']:,} hosts, "
            f"not yet deduplicated: run gristmill dedup on it for a funnel of kept and removed documents"
            + (f"\nfetch outcomes  {outcomes}" if outcomes else ""))


def run(args: argparse.Namespace) -> int:
    from gristmill.pipeline.format import Corpus, CorpusError
    from gristmill.pipeline.format.stats_table import full_stats
    from gristmill.pipeline.report.stats_text import render

    try:
        corpus = Corpus.open(args.corpus)
        raw = describe_raw_crawl(corpus, quiet=args.quiet)
        stats = full_stats(corpus) if raw is None else {}
    except CorpusError as exc:
        print(f"gristmill stats: {exc}", file=sys.stderr)
        return 2
    if raw is not None:
        print(terminal_safe(json.dumps(raw, indent=2) if args.json else render_raw_crawl(args.corpus, raw)))
        if args.html:
            print(f"gristmill stats: --html {args.html} not written: a raw crawl has no dedup statistics to chart",
                  file=sys.stderr)
        return 0
    if not stats:
        print(f"gristmill stats: {args.corpus}: the manifest holds no statistics (not written by gristmill dedup)",
              file=sys.stderr)
        return 2
    print(terminal_safe(json.dumps(stats, indent=2) if args.json else render(stats)))
    if args.html:
        from gristmill.pipeline.report.html_report import write_report

        try:  # the similarity chart comes from the removed corpus the manifest names, when there is one
            write_report(args.corpus, args.html, quiet=args.quiet)
        except (CorpusError, OSError) as exc:
            print(f"gristmill stats: --html {args.html}: {exc}", file=sys.stderr)
            return 2
        if not args.quiet:
            print(f"wrote {args.html}", file=sys.stderr)  # stderr: --json output stays plain JSON
    return 0
