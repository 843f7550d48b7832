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
from gristmill.pipeline.job.datasets import (
    CLUSTERS_OUT,
    DOCS,
    EXACT_CLUSTER_SCHEMA,
    EXACT_CLUSTERS,
    SIGNATURES,
    WRITE_DONE,
    band_file,
    index_file,
)
from gristmill.pipeline.job.exact import exact_of
from gristmill.pipeline.job.extras import SplitColumns
from gristmill.pipeline.job.stats import split_stats
from gristmill.pipeline.job.tasks import Job, run_once


def write_split(job: Job, split_index: int, carried: pa.Schema) -> dict[str, Any]:
    """One split's output, once: its shards, removed shards, totals and the size of its statistics table.
    ``carried``: the input's own columns that follow gristmill's (``gristmill.pipeline.job.extras.job_schema``)."""
    return run_once(job.work, WRITE_DONE.split(split_index), lambda: _write_split_now(job, split_index, carried))


def _write_split_now(job: Job, split_index: int, carried: pa.Schema) -> dict[str, Any]:
    config = job.config
    docs_file = DOCS.file(split_index)
    docs = job.work.read_table(docs_file, ["key", "id", "content_hash", "origin", "domain", "language"])  # no text
    exact = exact_of(job, split_index, docs["content_hash"])
    clusters = job.work.read_table(CLUSTERS_OUT.file(split_index))
    n = docs.num_rows
    keys = docs["key"].to_numpy()
    ids = docs["id"].to_pylist()
    status = np.zeros(n, np.int8)  # 0 kept, 1 exact duplicate, 2 near duplicate
    cluster_id = list(ids)
    cluster_size = np.ones(n, np.int64)
    duplicate_of: list[str | None] = [None] * n
    similarity = np.full(n, np.nan)
    survivor_domain = np.full(n, None, object)  # a removed document's final survivor's domain (lost_to)

    # the exact group, unless a near cluster holds its survivor (below)
    member = exact["rep_key"].is_valid().to_numpy(zero_copy_only=False)
    cluster_size[member] = exact["copies"].drop_null().to_numpy()
    copy = member & (pc.fill_null(exact["rep_key"], -1).to_numpy() != keys)
    rep_ids = exact["rep_id"].to_pylist()
    status[copy] = 1
    similarity[copy] = 1.0
    exact_domains = exact["rep_domain"].to_pylist()
    for pos in np.flatnonzero(copy):
        duplicate_of[pos] = cluster_id[pos] = rep_ids[pos]
        survivor_domain[pos] = exact_domains[pos]
    cluster_pos = _positions(keys, clusters["key"].to_numpy())
    c_rep = clusters["rep_key"].to_numpy()
    c_id = clusters["cluster_id"].to_pylist()
    c_size = clusters["cluster_size"].to_numpy()
    c_sim = clusters["similarity"].to_numpy()
    c_rep_id = clusters["rep_id"].to_pylist()
    c_domain = clusters["rep_domain"].to_pylist()
    for row, pos in enumerate(cluster_pos):
        cluster_id[pos] = c_id[row]
        cluster_size[pos] = c_size[row]
        if c_rep[row] != keys[pos]:
            status[pos] = 2
            duplicate_of[pos] = c_rep_id[row]
            similarity[pos] = c_sim[row]
            survivor_domain[pos] = c_domain[row]
    # exact copies whose survivor is in a near cluster: that cluster's representative and size
    # (duplicate_of stays the exact twin, the document the copy's text is identical to)
    resolved = job.work.read_partition(EXACT_CLUSTERS, split_index, EXACT_CLUSTER_SCHEMA)
    found = pc.index_in(exact["rep_key"], value_set=resolved["rep_key"].combine_chunks())
    row = pc.fill_null(found, 0).to_numpy()
    final = copy & found.is_valid().to_numpy(zero_copy_only=False)
    cluster_size[final] = resolved["cluster_size"].to_numpy()[row[final]]
    resolved_ids = resolved["cluster_id"].to_pylist()
    resolved_domains = resolved["rep_domain"].to_pylist()
    for pos in np.flatnonzero(final):
        cluster_id[pos] = resolved_ids[row[pos]]
        survivor_domain[pos] = resolved_domains[row[pos]]

    kept_mask = status == 0

    def shard_writer(url: str, schema: pa.Schema, prefix: str) -> ShardWriter:
        # kept and removed shards never share a name, even if both folders were one
        return ShardWriter(url, schema, shard_bytes=config.shard_bytes, row_group_bytes=config.row_group_bytes,
                           name_prefix=f"{prefix}-{split_index:05d}", run_id=job.fingerprint[:12],
                           storage_options=config.storage_options)

    writer = shard_writer(config.output, with_columns(CORPUS_SCHEMA, carried), "part")
    removed_writer = (shard_writer(config.removed, with_columns(REMOVED_SCHEMA, carried), "removed")
                      if config.removed else None)
    columns = SplitColumns(job.work, split_index, carried)
    from gristmill.dedup.core import STATUSES

    removed_as = np.array(STATUSES)[status]
    text_bytes = np.zeros(n, np.int64)
    start = 0
    # the text one row group (one read batch) at a time: a task never holds the split's texts
    for number, group in enumerate(job.work.read_row_groups(
            docs_file, ["id", "text", "source", "domain", "language", "fetch_time", "content_hash"])):
        rows = slice(start, start + group.num_rows)
        start += group.num_rows
        text_bytes[rows] = pc.binary_length(group["text"]).to_numpy()
        base = group.rename_columns({"source": SOURCE_COLUMN})
        base = base.append_column("cluster_id", pa.array(cluster_id[rows], pa.string()))
        base = base.append_column("cluster_size", pa.array(cluster_size[rows], pa.int32()))
        for spec, column in zip(carried, columns.batch(number, group.num_rows).columns, strict=True):
            base = base.append_column(spec, column)
        keep = kept_mask[rows]
        writer.write(base.filter(pa.array(keep)).append_column(
            "is_representative", pa.array(np.ones(int(keep.sum()), bool))))
        if removed_writer is not None:
            gone = ~keep
            removed = base.filter(pa.array(gone))
            removed = removed.append_column("is_representative", pa.array(np.zeros(int(gone.sum()), bool)))
            removed = removed.append_column("removed_as", pa.array(removed_as[rows][gone].tolist(), pa.string()))
            removed = removed.append_column("duplicate_of", pa.array(
                [d for d, g in zip(duplicate_of[rows], gone, strict=True) if g], pa.string()))
            removed = removed.append_column("similarity", pa.array(similarity[rows][gone], pa.float64()))
            removed_writer.write(removed)
    shards = [s.to_dict() for s in writer.close()]
    removed_shards = [s.to_dict() for s in removed_writer.close()] if removed_writer is not None else []
    _write_index(job, split_index, keys[kept_mask])
    return {"shards": shards, "removed_shards": removed_shards,
            **split_stats(job, split_index, docs, status, cluster_size, text_bytes, survivor_domain)}


def _positions(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row of each wanted key in the (sorted) key column of a split's documents."""
    return np.searchsorted(keys, wanted)


def _write_index(job: Job, split_index: int, kept_keys: np.ndarray) -> None:
    """The signature index of the kept rows and its band file, beside the corpus, sorted for later
    ``--against`` runs to read in part (``gristmill.pipeline.format.signature_index.write_index_files``)."""
    sigs = job.work.read_table(SIGNATURES.file(split_index))
    sigs = sigs.filter(pc.is_in(sigs["key"], value_set=pa.array(kept_keys, pa.int64())))
    index = sigs.select(["id", "content_hash", "length", "signature", "bands"])
    write_index_files(job.config.output, index_file(split_index, job.fingerprint), band_file(split_index, job.fingerprint),
                      index, job.config.storage_options)
