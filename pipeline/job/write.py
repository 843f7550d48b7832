"""Stage ``write``, per split: kept rows into corpus shards (and removed rows into ``--removed``), the
split's signature index file, its totals and its statistics table (``gristmill.pipeline.job.stats``); the
driver publishes them in the manifest."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.pipeline.format import CORPUS_SCHEMA, REMOVED_SCHEMA, ShardWriter
from gristmill.pipeline.format.schemas import SOURCE_COLUMN, with_columns
from gristmill.pipeline.format.signature_index import write_index_files
from gristmill.pipeline.job.datasets import DOCS, SIGNATURES, WRITE_DONE, band_file, index_file
from gristmill.pipeline.job.extras import SplitColumns
from gristmill.pipeline.job.outcomes import JOB_STATUSES, KEPT, document_outcomes
from gristmill.pipeline.job.span_cuts import SpanCutter
from gristmill.pipeline.job.stats import split_stats
from gristmill.pipeline.job.tasks import Job, run_once


def write_split(job: Job, split_index: int, carried: pa.Schema, stats_parts: int) -> dict[str, Any]:
    """One split's output, once: its shards, removed shards, totals, and its statistics table sent to the
    ``stats_parts`` reduce tasks. ``carried``: the input's own columns that follow gristmill's
    (``gristmill.pipeline.job.extras.job_schema``)."""
    return run_once(job.work, WRITE_DONE.split(split_index),
                    lambda: _write_split_now(job, split_index, carried, stats_parts))


def _write_split_now(job: Job, split_index: int, carried: pa.Schema, stats_parts: int) -> dict[str, Any]:
    config = job.config
    docs_file = DOCS.file(split_index)
    docs = job.work.read_table(docs_file, ["key", "id", "content_hash", "origin", "domain", "language"])  # no text
    outcomes = document_outcomes(job, split_index, docs)
    n = docs.num_rows
    keys = docs["key"].to_numpy()
    status, cluster_id, cluster_size = outcomes.status, outcomes.cluster_id, outcomes.cluster_size
    duplicate_of, similarity = outcomes.duplicate_of, outcomes.similarity
    cutter = SpanCutter(job, split_index) if config.spans is not None else None

    def shard_writer(url: str, schema: pa.Schema, prefix: str) -> ShardWriter:
        # kept and removed shards never share a name, even if both folders were one
        return ShardWriter(url, schema, shard_bytes=config.shard_bytes, row_group_bytes=config.row_group_bytes,
                           name_prefix=f"{prefix}-{split_index:05d}", run_id=job.fingerprint[:12],
                           storage_options=config.storage_options)

    writer = shard_writer(config.output, with_columns(CORPUS_SCHEMA, carried), "part")
    removed_writer = (shard_writer(config.removed, with_columns(REMOVED_SCHEMA, carried), "removed")
                      if config.removed else None)
    columns = SplitColumns(job.work, split_index, carried)
    text_bytes = np.zeros(n, np.int64)
    kept_bytes = np.zeros(n, np.int64)
    start = 0
    # the text one row group (one read batch) at a time: a task never holds the split's texts
    for number, group in enumerate(job.work.read_row_groups(
            docs_file, ["id", "text", "source", "domain", "language", "fetch_time", "content_hash"])):
        rows = slice(start, start + group.num_rows)
        start += group.num_rows
        text_bytes[rows] = pc.binary_length(group["text"]).to_numpy()
        if cutter is not None:  # the spans repeated elsewhere cut; a document left too short is removed
            group, status[rows] = cutter.cut(group, keys[rows], status[rows])
        kept_bytes[rows] = pc.binary_length(group["text"]).to_numpy()
        base = group.rename_columns({"source": SOURCE_COLUMN})
        base = base.append_column("cluster_id", pa.array(cluster_id[rows], pa.string()))
        base = base.append_column("cluster_size", pa.array(cluster_size[rows], pa.int32()))
        for spec, column in zip(carried, columns.batch(number, group.num_rows).columns, strict=True):
            base = base.append_column(spec, column)
        keep = status[rows] == KEPT
        writer.write(base.filter(pa.array(keep)).append_column(
            "is_representative", pa.array(np.ones(int(keep.sum()), bool))))
        if removed_writer is not None:
            gone = ~keep
            removed = base.filter(pa.array(gone))
            removed = removed.append_column("is_representative", pa.array(np.zeros(int(gone.sum()), bool)))
            removed_as = np.array(JOB_STATUSES)[status[rows][gone]]
            removed = removed.append_column("removed_as", pa.array(removed_as.tolist(), pa.string()))
            removed = removed.append_column("duplicate_of", pa.array(
                [d for d, g in zip(duplicate_of[rows], gone, strict=True) if g], pa.string()))
            removed = removed.append_column("similarity", pa.array(similarity[rows][gone], pa.float64()))
            removed_writer.write(removed)
    shards = [s.to_dict() for s in writer.close()]
    removed_shards = [s.to_dict() for s in removed_writer.close()] if removed_writer is not None else []
    _write_index(job, split_index, keys[status == KEPT])
    result = {"shards": shards, "removed_shards": removed_shards,
              **split_stats(job, split_index, docs, status, cluster_size, text_bytes, outcomes.survivor_domain,
                            kept_bytes, stats_parts)}
    if cutter is not None:
        spans = cutter.finish(docs, status)
        result["totals"]["spans_totals"] = spans.pop("span_totals")
        result.update(spans)
    return result


def _write_index(job: Job, split_index: int, kept_keys: np.ndarray) -> None:
    """The signature index of the kept rows and its band file, beside the corpus, sorted for later
    ``--against`` runs to read in part (``gristmill.pipeline.format.signature_index.write_index_files``)."""
    sigs = job.work.read_table(SIGNATURES.file(split_index))
    sigs = sigs.filter(pc.is_in(sigs["key"], value_set=pa.array(kept_keys, pa.int64())))
    index = sigs.select(["id", "content_hash", "length", "signature", "bands"])
    write_index_files(job.config.output, index_file(split_index, job.fingerprint), band_file(split_index, job.fingerprint),
                      index, job.config.storage_options)
