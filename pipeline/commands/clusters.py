"""``gristmill clusters CORPUS``: the largest duplicate clusters, and one cluster side by side with diffs.

Needs the job's removed documents (``gristmill dedup --removed``); the text layout is
:mod:`pipeline.report.cluster_text`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys

import pyarrow as pa

from pipeline.format import Corpus, CorpusError
from pipeline.report.cluster_text import cluster_summary, render_cluster, render_list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", help="corpus folder or URL written by gristmill dedup")
    parser.add_argument("--removed", metavar="CORPUS2", help="the job's removed documents (default: the folder "
                        "its manifest names)")
    parser.add_argument("--top", type=int, default=20, help="clusters to list (default 20)")
    parser.add_argument("--show", metavar="ID", help="print this cluster: a cluster id, a member's document id, "
                        "or a unique prefix of either")
    parser.add_argument("--width", type=int, default=None, help="output width (default: the terminal's)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def _open(args: argparse.Namespace) -> tuple[Corpus, Corpus]:
    from pipeline.report.duplicates import open_removed

    corpus = Corpus.open(args.corpus)
    return corpus, open_removed(corpus, args.removed)


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
    from pipeline.report.duplicates import find_cluster, find_clusters, load_texts

    corpus, removed = _open(args)
    clusters = find_clusters(corpus, removed)
    width = args.width or max(60, min(200, shutil.get_terminal_size((140, 40)).columns))
    if args.show is None:
        if args.json:
            print(json.dumps([cluster_summary(c) for c in clusters[:args.top]], indent=2, ensure_ascii=False))
        else:
            print(render_list(clusters, args.top, corpus.num_rows + removed.num_rows))
        return 0
    try:
        cluster = find_cluster(clusters, args.show)
    except LookupError as exc:
        print(f"gristmill clusters: {exc}", file=sys.stderr)
        return 1
    load_texts(cluster, corpus, removed)
    if args.json:
        print(json.dumps({**cluster_summary(cluster), "members": [vars(m) for m in cluster.everyone()]},
                         indent=2, ensure_ascii=False))
    else:
        print(render_cluster(cluster, width))
    return 0
