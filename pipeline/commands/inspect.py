"""``gristmill inspect CORPUS``: what a corpus holds, read from its manifest alone."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from gristmill.pipeline.commands import options
from gristmill.pipeline.report.progress import LINE_SECONDS, Progress
from gristmill.pipeline.report.stats_text import human_bytes
from gristmill.pipeline.report.terminal import terminal_safe

PROGRESS_SECONDS = LINE_SECONDS  # between plain progress lines when stderr is not a terminal

if TYPE_CHECKING:  # numpy and pyarrow are imported when the command runs: `inspect --help` stays quick
    from gristmill.pipeline.format import Corpus, VerifyResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", help="corpus folder or URL (local path, s3://, memory://)")
    parser.add_argument("--verify", action="store_true",
                        help="re-read every shard and compare checksums, with progress on stderr")
    options.add_output_flags(parser, json_help="print machine-readable JSON")


def verify_shards(corpus: Corpus, quiet: bool) -> list[VerifyResult]:
    """Every shard checked against the manifest, one at a time, with shards and bytes done, a rate and
    an ETA on stderr (a bar on a terminal, a line about every 10 s otherwise, nothing when ``quiet``):
    re-reading terabytes takes long enough to need it."""
    shards = corpus.shards
    results = []
    with Progress(f"verify 0/{len(shards):,} shards", sum(shard.bytes for shard in shards), "B", quiet=quiet,
                  every=PROGRESS_SECONDS) as progress:
        for done, shard in enumerate(shards, 1):
            results.append(corpus.verify_shard(shard))
            progress.desc = f"verify {done:,}/{len(shards):,} shards"
            if progress.bar is not None:
                progress.bar.set_description(progress.desc, refresh=False)
            progress.update(shard.bytes)
    return results


def summarise(corpus: Corpus, verify: bool, quiet: bool = True) -> dict[str, Any]:
    import numpy as np

    blocks = corpus.manifest.blocks  # every row group as arrays: a million of them summarise in milliseconds
    some = len(blocks) > 0
    summary: dict[str, Any] = {
        "url": corpus.url,
        "format_version": corpus.manifest.format_version,
        "created": corpus.manifest.created,
        "shards": len(corpus.shards),
        "rows": corpus.num_rows,
        "bytes": corpus.manifest.num_bytes,
        "row_groups": {
            "count": len(blocks),
            "bytes_min": int(blocks.length.min()) if some else 0,
            "bytes_median": int(np.median(blocks.length)) if some else 0,
            "bytes_max": int(blocks.length.max()) if some else 0,
            "rows_median": int(np.median(blocks.rows)) if some else 0,
        },
        "schema": [{"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in corpus.schema],
        "shard_list": [{"path": s.path, "rows": s.rows, "bytes": s.bytes, "row_groups": len(s.row_groups)}
                       for s in corpus.shards],
        "stats": corpus.stats,
    }
    if verify:
        results = verify_shards(corpus, quiet)
        summary["verify"] = {
            "ok": all(r.ok for r in results),
            "failed": [{"path": r.path, "detail": r.detail} for r in results if not r.ok],
        }
    return summary


def render(summary: dict[str, Any]) -> str:
    rg = summary["row_groups"]
    lines = [
        f"corpus   {summary['url']}  (format v{summary['format_version']}, committed {summary['created']})",
        f"shards   {summary['shards']}   rows {summary['rows']:,}   size {human_bytes(summary['bytes'])}",
        f"blocks   {rg['count']} row groups, {human_bytes(rg['bytes_min'])} / {human_bytes(rg['bytes_median'])} / "
        f"{human_bytes(rg['bytes_max'])} (min/median/max), ~{rg['rows_median']:,} rows each",
        "schema   " + ", ".join(f"{f['name']}: {f['type']}" for f in summary["schema"]),
    ]
    for shard in summary["shard_list"][:20]:
        lines.append(f"  {shard['path']}  {shard['rows']:,} rows  {human_bytes(shard['bytes'])}  "
                     f"{shard['row_groups']} row groups")
    if len(summary["shard_list"]) > 20:
        lines.append(f"  ... and {len(summary['shard_list']) - 20} more shards")
    if "verify" in summary:
        if summary["verify"]["ok"]:
            lines.append(f"verify   all {summary['shards']} shards match their checksums")
        else:
            for failure in summary["verify"]["failed"]:
                lines.append(f"CORRUPT  {failure['path']}: {failure['detail']}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from gristmill.pipeline.format import Corpus, CorpusError

    try:
        corpus = Corpus.open(args.corpus)
    except CorpusError as exc:
        print(f"gristmill inspect: {exc}", file=sys.stderr)
        return 2
    summary = summarise(corpus, args.verify, quiet=args.quiet)
    print(terminal_safe(json.dumps(summary, indent=2) if args.json else render(summary)))
    if args.verify and not summary["verify"]["ok"]:
        return 1
    return 0
