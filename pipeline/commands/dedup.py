"""``gristmill dedup INPUT... -o CORPUS``: raw documents in, a deduplicated corpus out (on Ray).

Options given on the command line win over the TOML job file (``--job job.toml``), which can hold
any key of :class:`pipeline.job.DedupConfig` at its top level or under ``[dedup]``.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

# Command-line options that map one to one onto DedupConfig fields.
_OPTIONS = ("threshold", "num_perm", "ngram", "bands", "rows", "seed", "text_column", "id_column",
            "max_doc_bytes", "split_bytes", "num_partitions", "partition_bytes", "spill_bytes", "cc_rows_per_task",
            "removed", "against", "shard_bytes", "row_group_bytes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="files, globs or folders (any fsspec URL) of Parquet, JSONL(.gz/.zst), WARC(.gz), "
                             "or a corpus folder")
    parser.add_argument("-o", "--output", help="the corpus folder to write (any fsspec URL)")
    parser.add_argument("--job", metavar="TOML", help="a TOML job file with any of these options")
    parser.add_argument("--threshold", type=float, help="Jaccard similarity counted as near-duplicate (default 0.8)")
    parser.add_argument("--num-perm", type=int, help="MinHash permutations (default 128)")
    parser.add_argument("--ngram", type=int, help="words per shingle (default 5)")
    parser.add_argument("--bands", type=int,
                        help="LSH bands (with --rows; default: optimal for the threshold, recall-leaning with verification)")
    parser.add_argument("--rows", type=int, help="rows per LSH band (with --bands)")
    parser.add_argument("--no-verify", dest="verify", action="store_false", default=None,
                        help="link every LSH candidate pair; by default a pair is linked only when its estimated "
                             "Jaccard reaches the threshold")
    parser.add_argument("--seed", type=int, help="MinHash seed (default dedup.DEFAULT_SEED)")
    parser.add_argument("--text-column", help="field holding the text (default 'text')")
    parser.add_argument("--id-column", help="field holding the id (default 'id'; generated when absent)")
    parser.add_argument("--max-doc-bytes", type=int, help="reject documents larger than this (default 10 MiB)")
    parser.add_argument("--split-bytes", type=int, help="input bytes per parallel split (default 64 MiB)")
    parser.add_argument("--num-partitions", type=int,
                        help="partitions of every shuffle (default: about --partition-bytes of rows each, no cap)")
    parser.add_argument("--partition-bytes", type=int,
                        help="rows (in memory) each shuffle partition is sized to hold; sets the partition counts "
                             "and so a reducer's memory (default 128 MiB)")
    parser.add_argument("--spill-bytes", type=int,
                        help="rows a reducer sorts in memory before it spills sorted runs to disk (default 1 GiB)")
    parser.add_argument("--cc-rows-per-task", type=int,
                        help="rows a connected-components task reads, about 170 bytes each (default 4 million)")
    parser.add_argument("--removed", metavar="CORPUS2", help="also write the removed documents here")
    parser.add_argument("--against", metavar="CORPUS", action="append",
                        help="dedup against an earlier corpus's signature index (repeat for several corpora)")
    parser.add_argument("--shard-bytes", type=int, help="target shard size (default 256 MiB)")
    parser.add_argument("--row-group-bytes", type=int, help="target row group size (default 4 MiB)")
    parser.add_argument("--keep-work", action="store_true", default=None,
                        help="keep OUTPUT/_work (intermediate results) after success")
    parser.add_argument("--overwrite", action="store_true", default=None,
                        help="replace a committed corpus that a different job wrote in OUTPUT; re-running the same "
                             "job resumes without it")
    parser.add_argument("--ray-address", help="connect to this Ray cluster instead of starting a local one")


def load_job_file(path: str) -> dict[str, Any]:
    """The options of a TOML job file (top level, or its ``[dedup]`` table)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    with open(path, "rb") as handle:
        data = tomllib.load(handle)
    table = data.get("dedup", data)
    return {key.replace("-", "_"): value for key, value in table.items()}


def config_from_args(args: argparse.Namespace) -> Any:
    """Merge the job file and the command line (the command line wins) into a DedupConfig."""
    from pipeline.job import DedupConfig, DedupError

    values: dict[str, Any] = load_job_file(args.job) if args.job else {}
    if args.inputs:
        values["inputs"] = list(args.inputs)
    if args.output:
        values["output"] = args.output
    for name in _OPTIONS:
        if getattr(args, name) is not None:
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

    from pipeline.format import CorpusError
    from pipeline.job import DedupError, job_stages, run_dedup
    from pipeline.job.inputs import InputError
    from pipeline.report.progress import stage_bar
    from pipeline.report.stats_text import render

    ray_was_up = ray.is_initialized()  # a caller's Ray (tests, a notebook) stays up
    try:
        config = config_from_args(args)
        if args.ray_address:
            ray.init(address=args.ray_address)
        bar, on_stage = stage_bar(job_stages(config), "dedup")
        with bar:
            stats = run_dedup(config, on_stage=on_stage)
        empty = _why_empty(stats, config)
    except (DedupError, InputError, CorpusError, OSError, ValueError) as exc:
        print(f"gristmill dedup: {exc}", file=sys.stderr)
        return 2
    finally:
        if not ray_was_up:
            _stop_ray(ray)
    print(render(stats))
    if empty:
        print(empty, file=sys.stderr)
        return 1
    return 0


def _stop_ray(ray: Any) -> None:
    """Stop the Ray this command started or joined, here rather than at exit: an interrupted run ends
    with ``os._exit`` (``pipeline.cli``), which skips Ray's own exit hook. Deaf to Ctrl-C, which users
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
    from pipeline.format import Corpus
    from pipeline.report.rejects import rejects_path, render_tally, tally, text_field_hint

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
