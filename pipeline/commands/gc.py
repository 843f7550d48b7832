"""``gristmill gc CORPUS``: remove now the files earlier manifests listed, which a commit keeps for the
readers that opened those manifests (``gristmill.pipeline.format.gc``); prints each file removed and the bytes freed."""

from __future__ import annotations

import argparse
import json
import sys
import uuid

from gristmill.pipeline.commands import options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gristmill.pipeline.format.gc import GRACE_SECONDS

    parser.add_argument("corpus", help="corpus folder or URL (local path, s3://, memory://)")
    parser.add_argument("--now", action="store_true",
                        help="remove every file no manifest lists, even one a reader of an earlier manifest may "
                             f"still read (default: only those unlisted for {GRACE_SECONDS / 3600:g} hours)")
    options.add_output_flags(parser, json_help="print what was removed and kept as JSON on stdout")


def run(args: argparse.Namespace) -> int:
    from gristmill.pipeline.format import Corpus, CorpusError, acquire_leases, release_leases, retire_unlisted
    from gristmill.pipeline.format.gc import GRACE_SECONDS
    from gristmill.pipeline.report.stats_text import human_bytes

    try:
        corpus = Corpus.open(args.corpus)
        # the folder's lease: a job writing it is not raced, and gc is refused while one runs
        leases = acquire_leases([args.corpus], f"gc-{uuid.uuid4().hex}")
        try:
            result = retire_unlisted(args.corpus, corpus.manifest, grace=0 if args.now else GRACE_SECONDS)
        finally:
            release_leases(leases)
    except CorpusError as exc:
        print(f"gristmill gc: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"removed": result.removed, "bytes_freed": result.bytes_freed,
                          "kept": result.retired}, indent=2, sort_keys=True))
        return 0
    for relative, size in result.removed.items():
        print(f"removed  {relative}  {human_bytes(size)}")
    print(f"freed {human_bytes(result.bytes_freed)} ({result.bytes_freed:,} bytes) in {len(result.removed)} files")
    if result.retired and not args.quiet:
        print(f"kept {len(result.retired)} files an earlier manifest listed, for its readers "
              f"(gone {GRACE_SECONDS / 3600:g} hours after they were replaced; --now removes them)")
    return 0
