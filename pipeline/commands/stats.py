"""``gristmill stats CORPUS``: a corpus's dedup statistics, readably or as JSON.

The totals come from the manifest and every breakdown in full from the statistics table beside the
corpus (``pipeline.format.stats_table``; older corpora kept them in the manifest). ``--html FILE``
also writes the same statistics as a self-contained HTML page with charts
(``pipeline.report.html_report.write_report``).
"""

from __future__ import annotations

import argparse
import json
import sys

from pipeline.format import Corpus, CorpusError
from pipeline.format.stats_table import full_stats
from pipeline.report.stats_text import render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", help="corpus folder or URL")
    parser.add_argument("--json", action="store_true", help="print the statistics as JSON")
    parser.add_argument("--html", metavar="FILE",
                        help="also write a self-contained HTML report with charts to FILE (a local path)")


def run(args: argparse.Namespace) -> int:
    try:
        corpus = Corpus.open(args.corpus)
        stats = full_stats(corpus)
    except CorpusError as exc:
        print(f"gristmill stats: {exc}", file=sys.stderr)
        return 2
    if not stats:
        print(f"gristmill stats: {args.corpus}: the manifest holds no statistics (not written by gristmill dedup)",
              file=sys.stderr)
        return 2
    print(json.dumps(stats, indent=2) if args.json else render(stats))
    if args.html:
        from pipeline.report.html_report import write_report

        try:  # the similarity chart comes from the removed corpus the manifest names, when there is one
            write_report(args.corpus, args.html)
        except (CorpusError, OSError) as exc:
            print(f"gristmill stats: --html {args.html}: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {args.html}", file=sys.stderr)  # stderr: --json output stays plain JSON
    return 0
