"""``gristmill dedup INPUT... -o CORPUS``: raw documents in, a deduplicated corpus out (on Ray).

Options given on the command line win over the TOML job file (``--job job.toml``), which can hold
any key of :class:`gristmill.pipeline.job.DedupConfig` at its top level or under ``[dedup]``. Sizes take units
(``64MiB``, ``1.5GB``) on the command line and in the job file (``gristmill.pipeline.commands.options``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import Any

from gristmill.pipeline.report.terminal import terminal_safe

# Command-line options that map one to one onto DedupConfig fields.
_OPTIONS = ("threshold", "num_perm", "ngram", "bands", "rows", "seed", "text_column", "id_column",
            "max_doc_bytes", "split_bytes", "num_partitions", "partition_bytes", "spill_bytes", "cc_rows_per_task",
            "removed", "against", "shard_bytes", "row_group_bytes", "prefer", "work_dir", "spans", "span_min_docs",
            "span_min_chars", "min_chars")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from gristmill.pipeline.commands import options
    from gristmill.pipeline.job.config import DedupConfig

    defaults = DedupConfig(inputs=[], output="")

    def size_flag(flag: str, text: str) -> None:
        dest = flag.removeprefix("--").replace("-", "_")
        parser.add_argument(flag, type=options.size, metavar="SIZE",
                            help=f"{text} (default: {options.format_size(getattr(defaults, dest))})")

    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="files, globs or folders (any fsspec URL) of Parquet, JSONL(.gz/.zst), WARC(.gz), "
                             "or a corpus folder")
    parser.add_argument("-o", "--output", help="the corpus folder to write (any fsspec URL; required here or in "
                                               "the job file)")
    parser.add_argument("--job", metavar="TOML", help="a TOML job file with any of these options, at its top level "
                                                      "or under [dedup]; the command line wins (default: none)")
    parser.add_argument("--prefer", metavar="POLICY",
                        help="which copy of a duplicate group survives: longest, domains:FILE (a ranked domain "
                             "list, one a line), domains=A,B,..., canonical, column:NAME (higher wins), "
                             "column:-NAME (lower wins) or earliest (fetch_time); see docs/DEDUP.md "
                             f"(default: {defaults.prefer})")
    parser.add_argument("--threshold", type=float,
                        help=f"Jaccard similarity counted as near-duplicate (default: {defaults.threshold})")
    parser.add_argument("--num-perm", type=int, help=f"MinHash permutations (default: {defaults.num_perm})")
    parser.add_argument("--ngram", type=int, help=f"words per shingle (default: {defaults.ngram})")
    parser.add_argument("--bands", type=int,
                        help="LSH bands (with --rows; default: optimal for the threshold, recall-leaning with "
                             "verification)")
    parser.add_argument("--rows", type=int, help="rows per LSH band (with --bands; default: with the bands)")
    parser.add_argument("--no-verify", dest="verify", action="store_false", default=None,
                        help="link every LSH candidate pair; by default a pair is linked only when its estimated "
                             "Jaccard reaches the threshold")
    parser.add_argument("--seed", type=int, help="MinHash seed (default: dedup.DEFAULT_SEED)")
    parser.add_argument("--text-column", help=f"field holding the text (default: {defaults.text_column})")
    parser.add_argument("--id-column",
                        help=f"field holding the id (default: {defaults.id_column}; generated when absent)")
    size_flag("--max-doc-bytes", "reject documents larger than this")
    size_flag("--split-bytes", "input bytes per parallel split (one read task each)")
    parser.add_argument("--num-partitions", type=int,
                        help="partitions of every shuffle (default: about --partition-bytes of rows each, no cap)")
    size_flag("--partition-bytes", "rows (in memory) each shuffle partition is sized to hold; sets the partition "
                                   "counts and so a reducer's memory")
    size_flag("--spill-bytes", "rows a reducer sorts in memory before it spills sorted runs to disk")
    parser.add_argument("--cc-rows-per-task", type=int,
                        help="rows a connected-components task reads, about 170 bytes each "
                             f"(default: {defaults.cc_rows_per_task:,})")
    parser.add_argument("--removed", metavar="CORPUS2", help="also write the removed documents here (default: not "
                                                             "written)")
    parser.add_argument("--against", metavar="CORPUS", action="append",
                        help="dedup against an earlier corpus's signature index (repeat for several corpora; "
                             "default: none)")
    parser.add_argument("--spans", metavar="MODE",
                        help="after document dedup, cut spans repeated across documents, keeping each in one "
                             "document chosen by --prefer: line, paragraph or sentences:N (N sentences at a time "
                             "from the start of each line; C4's rule is sentences:3); see docs/DEDUP.md "
                             "(default: off)")
    parser.add_argument("--span-min-docs", type=int, metavar="K",
                        help=f"with --spans: cut a span found in at least K documents (default: {defaults.span_min_docs})")
    parser.add_argument("--span-min-chars", type=int, metavar="N",
                        help="with --spans: never cut a span of fewer normalised characters "
                             f"(default: {defaults.span_min_chars})")
    parser.add_argument("--min-chars", type=int, metavar="N",
                        help="with --spans: remove a document left with fewer characters once cut, unless it keeps "
                             f"a repeated span for the corpus (reason: spans; default: {defaults.min_chars})")
    size_flag("--shard-bytes", "target shard size")
    size_flag("--row-group-bytes", "target row group size")
    parser.add_argument("--work-dir", metavar="URL",
                        help="the folder for intermediate results (any fsspec URL; on a cluster of several "
                             "nodes one every node reaches, e.g. object storage); empty or an earlier run's, "
                             "removed after success (default: OUTPUT/_work)")
    parser.add_argument("--keep-work", action="store_true", default=None,
                        help="keep the work folder (intermediate results) after success")
    parser.add_argument("--overwrite", action="store_true", default=None,
                        help="replace a committed corpus that a different job wrote in OUTPUT; re-running the same "
                             "job resumes without it")
    parser.add_argument("--ray-address", default=os.environ.get("RAY_ADDRESS"),
                        help="connect to this Ray cluster (default: $RAY_ADDRESS, else a private local Ray)")
    options.add_output_flags(parser, json_help="print the statistics as JSON on stdout")


def _text_or_texts(value: Any) -> str | list[str]:
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(item, str) for item in value)):
        return value
    raise TypeError(value)


def _table(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    raise TypeError(value)


def _job_only() -> dict[str, Any]:
    """Job-file keys beyond the flags: fsspec options for every URL, and ``prefer`` as a ranked list."""
    from gristmill.pipeline.commands.options import JobKey

    return {"storage_options": JobKey("a table of fsspec options", _table),
            "prefer": JobKey("text, or a list of domains as text", _text_or_texts)}


def config_from_args(args: argparse.Namespace) -> Any:
    """Merge the job file and the command line (the command line wins) into a DedupConfig.

    The job file is checked by the same typed schema as crawl's and serve's (``options.apply_job_file``:
    the parser's types), so ``num_perm = "128"`` is an error naming the key and the type it needs.
    ``args`` comes from ``gristmill.pipeline.cli`` (which records the parser and the command's own tokens).
    """
    from gristmill.pipeline.commands import options
    from gristmill.pipeline.job import DedupConfig, DedupError

    if args.job:
        options.apply_job_file(args._parser, args, args.job, "dedup", args._argv, _job_only())
    values: dict[str, Any] = {}
    if args.inputs:
        values["inputs"] = list(args.inputs)
    if args.output:
        values["output"] = args.output
    for name in (*_OPTIONS, "storage_options"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    for flag in ("keep_work", "overwrite"):
        if getattr(args, flag):
            values[flag] = True
    if args.verify is False:
        values["verify"] = False
    if not values.get("inputs") or not values.get("output"):
        raise DedupError("need INPUT... and -o OUTPUT (on the command line or in the job file)")
    return DedupConfig.from_mapping(values)


def run(args: argparse.Namespace) -> int:
    import ray

    from gristmill.pipeline.commands import options
    from gristmill.pipeline.format import CorpusError
    from gristmill.pipeline.job import DedupError, job_stages, run_dedup
    from gristmill.pipeline.job.inputs import InputError
    from gristmill.pipeline.report.progress import StageProgress
    from gristmill.pipeline.report.stats_text import render

    ray_was_up = ray.is_initialized()  # a caller's Ray (tests, a notebook) stays up
    try:
        config = config_from_args(args)
        if args.ray_address and not ray_was_up:
            ray.init(address=args.ray_address, logging_level=logging.WARNING, log_to_driver=False)
        progress = StageProgress("dedup", job_stages(config), quiet=args.quiet)
        stats = run_dedup(config, progress=progress)
        empty = _why_empty(stats, config)
    except (DedupError, InputError, CorpusError, OSError, ValueError) as exc:
        print(f"gristmill dedup: {options.error_line(exc)}", file=sys.stderr)
        return 2
    finally:
        if not ray_was_up:
            _stop_ray(ray)
    print(terminal_safe(json.dumps(stats, indent=2, sort_keys=True) if args.json else render(stats)))
    if empty:
        print(empty, file=sys.stderr)
        return 1
    return 0


def _stop_ray(ray: Any) -> None:
    """Stop the Ray this command started or joined, here rather than at exit: an interrupted run ends
    with ``os._exit`` (``gristmill.pipeline.cli``), which skips Ray's own exit hook. Deaf to Ctrl-C, which users
    press again, and which inside Ray's shutdown prints a traceback and leaves its processes running."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ray.shutdown()
    finally:
        signal.signal(signal.SIGINT, previous)


def _why_empty(stats: dict[str, Any], config: Any) -> str | None:
    """Why the run produced nothing, when every input record was rejected or there were none; None when
    it kept or removed something. The command then exits 1: exit 0 would let a script carry on with an
    empty corpus, and the reasons would stay hidden in the rejects file."""
    from gristmill.pipeline.format import Corpus
    from gristmill.pipeline.report.rejects import rejects_path, render_tally, tally, text_field_hint

    documents = stats["documents"]
    if documents["input"] != documents["rejected"]:
        return None
    if not documents["input"]:
        return f"gristmill dedup: the inputs hold no documents; {config.output} is empty"
    corpus = Corpus.open(config.output, config.storage_options)
    counts = tally(corpus, rejects_path(corpus))
    hint = text_field_hint(counts)
    return "\n".join([f"gristmill dedup: every input record was rejected; {config.output} is empty",
                      *render_tally(counts), *([hint] if hint else []),
                      f"list them all with: gristmill rejects {config.output}"])
