"""``gristmill rejects CORPUS``: every input record a dedup run rejected, with its file, position, kind
and reason, read from the rejects file the corpus's manifest names.

Why: ``gristmill stats`` says how many records were rejected; this says which and why, so a user can
fix the input or the options (``--text-column``, ``--max-doc-bytes``). The file is streamed in record
batches, so millions of rejects list in bounded memory. ``--json`` writes JSON Lines, one object per
reject, so the output streams and pipes into ``jq`` or ``head``; the per-kind summary that text mode
prints first is in ``gristmill stats --json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow.compute as pc

from gristmill.pipeline.commands import options
from gristmill.pipeline.format import REJECT_KINDS, Corpus, CorpusError
from gristmill.pipeline.report.rejects import reject_batches, rejects_path, render_tally, tally
from gristmill.pipeline.report.terminal import terminal_safe

_FIELDS = ("source", "position", "kind", "reason", "bytes", "count", "origin")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", help="corpus folder or URL written by gristmill dedup")
    parser.add_argument("--limit", type=_count, metavar="N", help="list at most N rejects (default: all)")
    parser.add_argument("--kind", choices=REJECT_KINDS, help="list only rejects of this kind (default: every kind)")
    options.add_output_flags(parser, json_help="write JSON Lines, one object per reject: " + ", ".join(_FIELDS))


def _count(text: str) -> int:
    """argparse type for a count: a whole number, 0 or more."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _rejects(corpus: Corpus, path: str, kind: str | None, limit: int | None) -> Iterator[dict[str, Any]]:
    """The rejects of ``kind`` (all when None) in file order, at most ``limit`` of them."""
    if limit == 0:
        return
    listed = 0
    for batch in reject_batches(corpus, path, _FIELDS):
        if kind is not None:
            batch = batch.filter(pc.equal(batch.column("kind"), kind))
        for row in batch.to_pylist():
            yield row
            listed += 1
            if listed == limit:
                return


def _line(reject: dict[str, Any]) -> str:
    stands_for = f" (stands for {reject['count']:,} records)" if reject["count"] != 1 else ""
    return f"{reject['source']}: {reject['position']}: {reject['kind']}: {reject['reason']}{stands_for}"


def run(args: argparse.Namespace) -> int:
    try:
        corpus = Corpus.open(args.corpus)
        path = rejects_path(corpus)
        if path is None:
            print(f"gristmill rejects: {args.corpus}: its manifest names no rejects file; only corpora written "
                  "by gristmill dedup record rejects", file=sys.stderr)
            return 2
        if not args.json:
            counts = tally(corpus, path)
            if not counts:
                print(f"no rejects: every input record of {args.corpus} became a document")
                return 0
            print(terminal_safe("\n".join(render_tally(counts))))
        for reject in _rejects(corpus, path, args.kind, args.limit):
            print(terminal_safe(json.dumps(reject, ensure_ascii=False) if args.json else _line(reject)))
    except CorpusError as exc:
        print(f"gristmill rejects: {exc}", file=sys.stderr)
        return 2
    return 0
