"""``gristmill index FOLDER``: make existing Parquet files a corpus by writing a manifest, rewriting nothing.

For a Hugging Face dataset, datatrove or Spark output, or any folder of Parquet files with a ``text``
column: every file is checked (a readable footer, a string text column, one schema) and a manifest
listing them is committed beside them, so ``StreamingLoader`` and ``gristmill inspect`` read the
folder (``gristmill.pipeline.format.existing``).
"""

from __future__ import annotations

import argparse
import json
import sys

from gristmill.pipeline.commands import options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", metavar="PATH_OR_URL",
                        help="the folder of Parquet files (local path, s3://, gs://, memory://); files and folders "
                             "whose names start with '_' or '.' are skipped")
    parser.add_argument("--replace", action="store_true",
                        help="index a folder that already holds a manifest gristmill index did not write "
                             "(default: refused)")
    options.add_output_flags(parser, json_help="print the manifest's summary as JSON")


def run(args: argparse.Namespace) -> int:
    from gristmill.pipeline.format import CorpusError
    from gristmill.pipeline.format.existing import index_parquet
    from gristmill.pipeline.report.stats_text import human_bytes

    try:
        manifest = index_parquet(args.folder, replace=args.replace)
    except CorpusError as exc:
        print(f"gristmill index: {exc}", file=sys.stderr)
        return 2
    summary = {"url": args.folder, "shards": len(manifest.shards), "rows": manifest.num_rows,
               "bytes": manifest.num_bytes, "row_groups": len(manifest.blocks),
               "schema": [{"name": f.name, "type": str(f.type)} for f in manifest.schema]}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"indexed {summary['url']}: {summary['shards']:,} files, {summary['rows']:,} rows, "
              f"{human_bytes(summary['bytes'])}, {summary['row_groups']:,} row groups; stream it with "
              f"StreamingLoader({summary['url']!r})")
    return 0
