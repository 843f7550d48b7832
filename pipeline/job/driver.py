"""The driver: plans a run, starts (or joins) Ray, runs the stages in order, then commits the manifest.

Each stage's result is recorded in the work folder when it finishes, so a rerun skips finished
stages (and, inside a stage, finished tasks); after the commit the work folder goes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

from gristmill.pipeline.format import (
    CORPUS_SCHEMA,
    JOB_FINGERPRINT_KEY,
    REJECT_SCHEMA,
    REMOVED_SCHEMA,
    STATS_TABLE_KEY,
    Corpus,
    Lease,
    ShardInfo,
    acquire_leases,
    open_fs,
    release_leases,
    retire_unlisted,
    write_manifest,
)
from gristmill.pipeline.format.manifest import PAIRS_KEY, SPANS_CUT_KEY
from gristmill.pipeline.format.schemas import with_columns
from gristmill.pipeline.format.signature_index import IndexFile, IndexParams
from gristmill.pipeline.format.span_index import SPAN_INDEX_KEY
from gristmill.pipeline.job import components, extras
from gristmill.pipeline.job.buckets import bucket_partition
from gristmill.pipeline.job.clusters import run_clusters
from gristmill.pipeline.job.config import DedupConfig, DedupError, index_params
from gristmill.pipeline.job.datasets import (
    BUCKETS_IN,
    EXACT_CLUSTERS,
    EXACT_OUT,
    JOB_RECORD,
    REJECTS,
    SPANS_OUT,
    TIMINGS,
    band_file,
    index_file,
    rejects_file,
    stage_record,
)
from gristmill.pipeline.job.earlier import (
    figures,
    run_earlier,
    shuffled_indices,
    sorted_indices,
    whole_indices,
)
from gristmill.pipeline.job.exact import run_exact
from gristmill.pipeline.job.exchange import end_stage, start_exchange, stop_exchange
from gristmill.pipeline.job.inputs import InputFile, Split, plan_splits, resolve_inputs
from gristmill.pipeline.job.keys import check_split_count
from gristmill.pipeline.job.nodes import check_local_paths
from gristmill.pipeline.job.partitions import Partitions, partitions_for
from gristmill.pipeline.job.plan import against_index_files, claim_folders, job_fingerprint
from gristmill.pipeline.job.prefer import Preference, check_input_column, parse_preference
from gristmill.pipeline.job.read import read_index_split, run_read
from gristmill.pipeline.job.sign import sign_split
from gristmill.pipeline.job.spans import (
    earlier_span_indexes,
    run_spans,
    span_partitions,
    span_settings,
    top_spans,
)
from gristmill.pipeline.job.stats import final_stats, merge_counts, run_stats, span_stats, stats_partitions
from gristmill.pipeline.job.tasks import Job, job_runner, map_splits
from gristmill.pipeline.job.verify import run_verify
from gristmill.pipeline.job.workdir import WorkDir
from gristmill.pipeline.job.write import write_split

log = logging.getLogger("gristmill.dedup")

STAGES = ("read", "exact", "sign", "against", "buckets", "verify", "cc", "clusters", "spans", "write", "stats")
# Arrow's mimalloc pool kept ~60 MB per worker of freed pages after each split; purging them at once
# costs ~6% more CPU in the stages. (Arrow's system pool with glibc's mmap threshold fixed kept ~110 MB
# less, but page faults on every fresh buffer cost ~30% more CPU; docs/PIPELINE.md, memory.) Set for
# the local Ray the job starts; deploy/Dockerfile sets it for clusters.
WORKER_ALLOCATOR_ENV = {"MIMALLOC_PURGE_DELAY": "0"}
# Input up to this size runs without Ray (``_runs_in_process``): a 20-document job spent 17-29 s, most
# of it starting Ray and its workers (docs/PIPELINE.md, small jobs).
IN_PROCESS_BYTES = 8 * 1024 * 1024


def job_stages(config: DedupConfig) -> tuple[str, ...]:
    """The stages ``run_dedup`` runs for ``config``, in order (``verify`` only when verifying, ``against``
    only with ``--against``, ``spans`` only with ``--spans``)."""
    wanted = {"verify": config.verify, "against": bool(config.against), "spans": config.spans is not None}
    return tuple(stage for stage in STAGES if wanted.get(stage, True))


class JobProgress(Protocol):
    """What the job tells a progress display (``gristmill.pipeline.report.progress.StageProgress``)."""

    def begin(self, stage: str, total_bytes: int | None = None) -> None: ...
    def task_done(self, result: dict[str, Any]) -> None: ...
    def end(self, stage: str, resumed: bool = False) -> None: ...


def run_dedup(config: DedupConfig, on_stage: Callable[[str], None] | None = None,
              progress: JobProgress | None = None) -> dict[str, Any]:
    """Run the whole job (initialising local Ray if nothing is connected); returns the manifest stats.

    ``on_stage(name)`` is called as each stage of ``job_stages(config)`` finishes or is found finished (resume);
    ``progress`` hears each stage begin and end and each of its tasks finish, for progress inside stages.
    """
    if min(1 if config.num_partitions is None else config.num_partitions, config.split_bytes,
           config.partition_bytes, config.spill_bytes, config.cc_rows_per_task) < 1:
        raise DedupError("num_partitions, split_bytes, partition_bytes, spill_bytes and cc_rows_per_task must be "
                         "positive")
    started = time.time()
    params = index_params(config)
    preference = parse_preference(config.prefer, config.storage_options)  # a domain file read here, once
    files = resolve_inputs(config.inputs, config.storage_options)
    check_input_column(preference, files, config.storage_options)
    index_files = against_index_files(config, params) if config.against else []
    splits = plan_splits(files, config.split_bytes, first_index=len(index_files))
    check_split_count(len(splits), len(index_files))
    fingerprint = job_fingerprint(config, params, splits, index_files, preference)  # names the output files
    claim_folders(config, files, fingerprint)  # refuse a folder we may not write before taking its lease
    if os.environ.get("RAY_ADDRESS") or _ray_is_up():
        # a cluster to join may have several nodes: every local path is checked on each before anything
        # is written (a lease is a write); a private local Ray, started after the lease, is one node
        _start_ray()
        import ray

        check_local_paths(ray, config, files)
    # one writer per output folder (pipeline.format.lease): another job is refused, this same job waits
    leases = acquire_leases([config.output] + ([config.removed] if config.removed else []), fingerprint,
                            config.storage_options)
    try:
        return _run_leased(config, params, preference, files, index_files, splits, fingerprint, leases, started,
                           on_stage, progress)
    finally:
        release_leases(leases)


def _ray_is_up() -> bool:
    """Whether the caller (the command line's --ray-address, a test, a notebook) started Ray already
    (not imported: not started, and a small job then never imports it)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def _runs_in_process(config: DedupConfig, splits: list[Split], work: WorkDir) -> bool:
    """A job small enough that Ray's start-up (and its workers' imports) would be most of its time:
    input up to ``IN_PROCESS_BYTES``, no --against, a local work folder, and no Ray to join or already
    started. Its tasks run here in turn and write the same files (docs/PIPELINE.md, small jobs)."""
    return (sum(split.bytes for split in splits) <= IN_PROCESS_BYTES and not config.against
            and not work.atomic_put and not os.environ.get("RAY_ADDRESS") and not _ray_is_up())


def _start_ray() -> None:
    """Join RAY_ADDRESS's cluster (set by `ray job submit`), else start a private local Ray rather than
    attach to whatever cluster this machine happens to run; a caller's Ray stays as it is."""
    import ray

    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS") or "local"
    local = {"include_dashboard": False} if address == "local" else {}  # the dashboard costs seconds
    if address == "local":
        for name, value in WORKER_ALLOCATOR_ENV.items():  # inherited by the workers this starts
            os.environ.setdefault(name, value)
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, **local)


def _run_leased(config: DedupConfig, params: IndexParams, preference: Preference, files: list[InputFile],
                index_files: list[IndexFile], splits: list[Split], fingerprint: str, leases: list[Lease], started: float,
                on_stage: Callable[[str], None] | None, progress: JobProgress | None) -> dict[str, Any]:
    """The job once its output folders are leased: claimed again (a run of this same job that held the
    lease first may have committed meanwhile), then every stage, the commit and the cleanup."""
    finished = claim_folders(config, files, fingerprint)
    if finished is not None:  # this very job committed already: re-running it is an idempotent resume
        _remove_stale(config, finished)
        for name in job_stages(config):
            if progress is not None:
                progress.end(name, resumed=True)
            if on_stage is not None:
                on_stage(name)
        return finished.stats
    work = WorkDir(config.work_url, config.storage_options)
    in_process = _runs_in_process(config, splits, work)
    if not in_process:
        _start_ray()  # already up when run_dedup joined a cluster to check its nodes
    previous = work.read_json(JOB_RECORD)
    # the shuffles and the components' rounds depend on these too
    # (and the layout: a work folder whose stage records do not name their shuffle files is not resumed)
    identity = {"fingerprint": fingerprint, "partitions": config.num_partitions, "cc_rows": config.cc_rows_per_task,
                "layout": 2}
    if previous is not None and previous != identity:
        log.info("work folder %s belongs to a different job; starting afresh", work.url)
        work.remove_all()
    work.write_json(JOB_RECORD, identity)
    # the context every task shares: without the plan (a read task is sent its own split) and without
    # the INPUT list, which can name as many files as the plan
    job = Job(dataclasses.replace(config, inputs=[]), params, work, index_files, fingerprint, len(splits), preference,
              earlier_span_indexes(config), on_task=progress.task_done if progress is not None else None,
              in_process=in_process)

    broker = start_exchange(work)  # on an object store, receivers get their rows through it
    run_tasks = job_runner(job)
    timings: dict[str, float] = dict(work.read_json(TIMINGS) or {})
    resumed: list[str] = []

    def stage(name: str, body: Callable[[], Any], total_bytes: int | None = None) -> Any:
        record = work.read_json(stage_record(name))
        if record is not None:
            resumed.append(name)
            result = record["result"]
            job.note_work_files(record["work_files"])  # what later stages' receivers read of it
        else:
            job.stage_files = {}
            if progress is not None:
                progress.begin(name, total_bytes)
            begin = time.time()
            try:
                result = body()
            except BaseException:
                stop_exchange(broker)
                raise
            end_stage(broker)
            timings[name] = round(time.time() - begin, 3)
            work.write_json(TIMINGS, timings)
            work.write_json(stage_record(name), {"result": result, "work_files": job.stage_files})
        if progress is not None:
            progress.end(name, resumed=record is not None)
        if on_stage is not None:
            on_stage(name)
        return result

    read = stage("read", lambda: map_splits(read_index_split, job, whole_indices(job))
                 + run_read(job, splits), total_bytes=sum(s.bytes for s in splits))
    carried = extras.job_schema(work, read)  # the input's own columns: DedupError on a type clash, before any shuffle
    parts = partitions_for(sum(r["docs"] for r in read), params, config.num_partitions,  # follow the rows
                           config.partition_bytes)
    exact = stage("exact", lambda: run_exact(job, parts.exact, run_tasks))
    signing = stage("sign", lambda: map_splits(lambda j, i: sign_split(j, i, parts), job, shuffled_indices(job),
                                               receives=[EXACT_OUT]))
    against = stage("against", lambda: _against(job, parts, run_tasks)) if config.against else None
    signed = sum(r["signed"] for r in signing) + (against["signed"] if against else 0)
    # connected components' first round is cut by a bound on its edges: a bucket of m rows gives m - 1
    fine = components.first_fine(signed * params.bands, config.cc_rows_per_task)
    buckets = stage("buckets", lambda: run_tasks(bucket_partition, [(job, p, parts.verify, fine)
                                                                     for p in range(parts.buckets)],
                                                 receives=[BUCKETS_IN]))
    edges = {"candidates": sum(r["edges"] for r in buckets)}
    seeded, linked = sum(r["seeded"] for r in buckets), edges["candidates"]
    if params.verify:
        fine = components.first_fine(edges["candidates"], config.cc_rows_per_task)
        verified = stage("verify", lambda: run_verify(job, parts.verify, fine, run_tasks))
        edges = {"candidates": verified["candidates"], "verified": verified["verified"]}
        seeded, linked = verified["seeded"], verified["verified"]
    cc = stage("cc", lambda: components.connected_components(job, seeded, linked, fine, run_tasks))
    stage("clusters", lambda: run_clusters(job, run_tasks, parts))
    if config.spans is not None:
        span_parts = span_partitions(sum(s.bytes for s in splits), config.num_partitions, config.partition_bytes)
        stage("spans", lambda: run_spans(job, span_parts, run_tasks))
    stats_parts = stats_partitions(sum(r["docs"] for r in read), sum(r.get("rejected", 0) for r in read))
    written = stage("write", lambda: map_splits(lambda j, i: write_split(j, i, carried, stats_parts), job,
                                                job.split_indices,
                                                receives=[EXACT_OUT, EXACT_CLUSTERS]
                                                + ([SPANS_OUT] if config.spans is not None else [])))
    table = stage("stats", lambda: run_stats(job, stats_parts, run_tasks))
    stop_exchange(broker)

    totals: dict[str, Any] = {}
    for record in written:
        merge_counts(totals, record["totals"])
    stats = final_stats(totals, table, timings, resumed, {**cc, **edges}, params, config, time.time() - started,
                        len(splits), figures(job, exact, against) if against else None)
    stats["survivor_policy"] = preference.describe()
    if config.spans is not None:
        stats["spans"] = span_stats(config, totals, top_spans([record["top_spans"] for record in written]))
    shards = [ShardInfo.from_dict(s) for record in written for s in record["shards"]]
    index_names = [index_file(i, fingerprint) for i in job.split_indices]
    band_names = [band_file(i, fingerprint) for i in job.split_indices]
    extra = {"signature_index": {"files": index_names, "band_files": band_names, "params": dataclasses.asdict(params)},
             "rejects": rejects_file(fingerprint), STATS_TABLE_KEY: {"files": table["files"]},
             "job": _job_summary(config), JOB_FINGERPRINT_KEY: fingerprint}
    if config.spans is not None:  # for later --spans --against jobs
        extra[SPAN_INDEX_KEY] = {**span_settings(config), "files": [r["span_index_file"] for r in written]}
    if params.verify:  # the candidate pairs table verification kept, for clusters --what-if
        extra[PAIRS_KEY] = verified["pairs"]
    _collect_rejects(job, extra["rejects"])
    for lease in leases:  # a writer whose lease lapsed and was taken never commits over the new holder
        lease.check()
    if config.removed:
        removed_shards = [ShardInfo.from_dict(s) for record in written for s in record["removed_shards"]]
        write_manifest(config.removed, removed_shards, with_columns(REMOVED_SCHEMA, carried), stats=stats,
                       extra={"removed_from": config.output, JOB_FINGERPRINT_KEY: fingerprint,
                              **({SPANS_CUT_KEY: {"files": [r["spans_cut_file"] for r in written]}} if config.spans else {})},
                       storage_options=config.storage_options)
    committed = write_manifest(config.output, shards, with_columns(CORPUS_SCHEMA, carried), stats=stats, extra=extra,
                               storage_options=config.storage_options)
    _remove_stale(config, Corpus(config.output, committed, *open_fs(config.output, config.storage_options)))
    if not config.keep_work:
        work.remove_all()
    return stats


def _against(job: Job, parts: Partitions, run_tasks: Callable[..., list[Any]]) -> dict[str, int]:
    """Stage ``against``: what the new documents can match of the sorted earlier indexes, read in part
    (``gristmill.pipeline.job.earlier``), then signed into the band and verification shuffles as a split is."""
    found = run_earlier(job, parts.buckets, run_tasks)
    signed = map_splits(lambda j, i: sign_split(j, i, parts), job, sorted_indices(job), receives=[EXACT_OUT])
    return {**found, "signed": sum(r["signed"] for r in signed)}


def _remove_stale(config: DedupConfig, corpus: Corpus) -> None:
    """After the commit: files of ours that the new manifests do not list (an earlier job's) are retired,
    and go once no reader of an earlier manifest can hold them (``gristmill.pipeline.format.gc``)."""
    passes = [retire_unlisted(config.output, corpus.manifest, config.storage_options)]
    if config.removed:
        removed_corpus = Corpus.open(config.removed, config.storage_options)
        passes.append(retire_unlisted(config.removed, removed_corpus.manifest, config.storage_options))
    retired = sum(len(p.retired) for p in passes)
    if retired:
        log.info("%d files an earlier manifest listed are kept for its readers; `gristmill gc` reclaims them",
                 retired)


def _collect_rejects(job: Job, name: str) -> None:
    """All rejected records in one Parquet file beside the corpus (file, position, reason)."""
    tables = [job.work.read_table(REJECTS.file(i)) for i in job.split_indices]
    table = pa.concat_tables(tables) if tables else REJECT_SCHEMA.empty_table()
    WorkDir(job.config.output, job.config.storage_options, spread_keys=False).write_table(name, table)


def _job_summary(config: DedupConfig) -> dict[str, Any]:
    """The options the run was given, as the manifest records them (without the storage options)."""
    summary = dataclasses.asdict(config)
    summary.pop("storage_options")
    for name in DedupConfig.SPAN_FIELDS:  # absent when off: a job without --spans writes what it wrote before
        if name not in config.span_options:
            summary.pop(name)
    return summary
