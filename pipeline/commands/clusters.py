"""``gristmill clusters CORPUS``: the largest duplicate clusters, one cluster side by side with diffs,
``--what-if T``: the funnel recut at another threshold from the job's stored candidate pairs, and
``--span HASH``: where one span that ``dedup --spans`` cut was kept and cut.

Listing and showing need the job's removed documents (``gristmill dedup --removed``) and stream them a
row group at a time (:mod:`gristmill.pipeline.report.duplicates`); the text layout is
:mod:`gristmill.pipeline.report.cluster_text`, the what-if :mod:`gristmill.pipeline.report.what_if`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys

import pyarrow as pa

from gristmill.pipeline.commands import options
from gristmill.pipeline.format import Corpus, CorpusError
from gristmill.pipeline.report.terminal import terminal_safe


def threshold(text: str) -> float:
    """``type=`` for ``--what-if``: a similarity in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a similarity in (0, 1]")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", help="corpus folder or URL written by gristmill dedup")
    parser.add_argument("--removed", metavar="CORPUS2", help="the job's removed documents (default: the folder "
                        "its manifest names)")
    parser.add_argument("--top", type=int, default=20, help="clusters to list (default: %(default)s)")
    parser.add_argument("--show", metavar="ID", help="print this cluster: a cluster id, a member's document id, "
                        "or a unique prefix of either (default: list the largest clusters)")
    parser.add_argument("--span", metavar="HASH", help="print where this span (a hash `stats` lists among the most "
                        "repeated spans, or a unique prefix) was kept and cut by `gristmill dedup --spans`")
    parser.add_argument("--width", type=int, default=None, help="output width (default: the terminal's)")
    parser.add_argument("--what-if", type=threshold, metavar="THRESHOLD", dest="what_if",
                        help="recut the clusters at this similarity threshold from the job's stored candidate pairs "
                        "and print how the funnel would change, without re-running (default: off)")
    options.add_output_flags(parser)


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except CorpusError as exc:
        print(f"gristmill clusters: {exc}", file=sys.stderr)
        return 2
    except pa.ArrowException as exc:  # a shard that is not the Parquet its manifest promised
        print(f"gristmill clusters: {args.corpus}: a shard cannot be read: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from gristmill.pipeline.report.cluster_text import cluster_summary, render_cluster, render_list
    from gristmill.pipeline.report.duplicates import find_cluster, find_clusters, load_texts, open_removed
    from gristmill.pipeline.report.progress import Progress

    corpus = Corpus.open(args.corpus)
    if args.what_if is not None:
        from gristmill.pipeline.report.what_if import render_what_if, what_if

        result = what_if(corpus, args.what_if, quiet=args.quiet)
        print(terminal_safe(json.dumps(result, indent=2) if args.json else render_what_if(result)))
        return 0
    removed = open_removed(corpus, args.removed)
    if args.span is not None:
        return _show_span(corpus, removed, args)
    width = args.width or max(60, min(200, shutil.get_terminal_size((140, 40)).columns))
    if args.show is None:
        with Progress("clusters: removed rows scanned", removed.num_rows, "rows", quiet=args.quiet) as progress:
            clusters = find_clusters(corpus, removed, args.top, progress)
        if args.json:
            print(terminal_safe(json.dumps([cluster_summary(c) for c in clusters], indent=2, ensure_ascii=False)))
        else:
            print(terminal_safe(render_list(clusters, args.top, corpus.num_rows + removed.num_rows)))
        return 0
    try:
        cluster = find_cluster(corpus, removed, args.show)
    except LookupError as exc:
        print(terminal_safe(f"gristmill clusters: {exc}"), file=sys.stderr)
        return 1
    load_texts(cluster, corpus, removed)
    if args.json:
        print(terminal_safe(json.dumps({**cluster_summary(cluster.figures()),
                                        "members": [vars(m) for m in cluster.everyone()]}, indent=2, ensure_ascii=False)))
    else:
        print(terminal_safe(render_cluster(cluster, width)))
    return 0


def _show_span(corpus: Corpus, removed: Corpus, args: argparse.Namespace) -> int:
    """``--span HASH``: the document that kept the span and every document it was cut from."""
    from gristmill.pipeline.report.span_report import find_span, render_span

    try:
        span = find_span(corpus, removed, args.span)
    except LookupError as exc:
        print(terminal_safe(f"gristmill clusters: {exc}"), file=sys.stderr)
        return 1
    print(terminal_safe(json.dumps(span.summary(), indent=2, ensure_ascii=False) if args.json else render_span(span)))
    return 0
