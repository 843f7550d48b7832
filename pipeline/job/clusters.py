"""Stage ``clusters``: component labels joined with signatures per split and shuffled by label; per
partition, survivor choice and the estimated similarity of every removed member to its representative;
per split, the final cluster of every exact copy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.format.signature_index import list_matrix
from pipeline.job import components
from pipeline.job.datasets import (
    CLUSTER_MAP_DONE,
    CLUSTER_OUT_SCHEMA,
    CLUSTERS_DONE,
    CLUSTERS_OUT,
    EXACT_BY_REP,
    EXACT_BY_REP_SCHEMA,
    EXACT_CLUSTER_SCHEMA,
    EXACT_CLUSTERS,
    EXACT_CLUSTERS_DONE,
    LABELS,
    REPS_IN,
    SIGNATURES,
    reps_schema,
    sig_schema,
    split_name,
)
from pipeline.job.tasks import Job, map_splits, route_by_split, run_once
from pipeline.job.workdir import partition_of


def _cluster_map(job: Job, split_index: int) -> dict[str, Any]:
    """Map: the split's clustered keys with their signatures, shuffled by component label."""

    def compute() -> dict[str, Any]:
        labels = job.work.read_folder(LABELS.split(split_index), components.LABEL_SCHEMA)
        schema = sig_schema(job.params.num_perm, job.params.bands)
        if labels.num_rows == 0:
            rows = schema.empty_table().append_column("label", pa.array([], pa.int64()))
        else:
            sigs = job.work.read_table(SIGNATURES.file(split_index))
            where = pc.index_in(labels["key"], value_set=sigs["key"].combine_chunks())
            rows = sigs.take(where).append_column("label", labels["label"])
        rows = rows.select(["key", "id", "length", "copies", "existing", "signature", "label"])
        job.work.write_partitioned(REPS_IN, split_name(split_index), rows,
                                   partition_of(rows["label"].to_numpy(), job.num_partitions), job.num_partitions)
        return {"members": rows.num_rows}

    return run_once(job.work, CLUSTER_MAP_DONE.split(split_index), compute)


def _cluster_reduce(job: Job, part: int) -> dict[str, Any]:
    """Reduce: each component's survivor, size and every member's estimated similarity to it, by split."""

    def compute() -> dict[str, Any]:
        from dedup.cluster import choose_representatives
        from dedup.lsh import estimated_jaccard

        table = job.work.read_folder(REPS_IN.partition(part), reps_schema(job.params.num_perm))
        table = table.sort_by([("label", "ascending"), ("key", "ascending")])
        labels = table["label"].to_numpy()
        keys = table["key"].to_numpy()
        is_rep, rep_index = choose_representatives(
            labels, table["length"].to_numpy(), table["id"], priority=table["existing"].to_numpy(zero_copy_only=False))
        rep_index = np.asarray(rep_index, dtype=np.int64)
        signatures = list_matrix(table["signature"], job.params.num_perm)
        similarity = estimated_jaccard(signatures, signatures[rep_index]) if len(keys) else np.zeros(0)
        _, inverse = np.unique(labels, return_inverse=True)
        sizes = np.bincount(inverse, weights=table["copies"].to_numpy()).astype(np.int64) if len(keys) else inverse
        ids = table["id"].to_pylist()
        out = pa.table({
            "key": pa.array(keys, pa.int64()), "cluster_id": [ids[i] for i in rep_index],
            "cluster_size": pa.array(sizes[inverse] if len(keys) else sizes, pa.int64()),
            "rep_key": pa.array(keys[rep_index], pa.int64()), "rep_id": [ids[i] for i in rep_index],
            "similarity": pa.array(similarity, pa.float64()),
        }, schema=CLUSTER_OUT_SCHEMA)
        route_by_split(job, CLUSTERS_OUT, part, out)
        return {"clusters": int(np.count_nonzero(is_rep)), "near_duplicates": int(len(keys) - np.count_nonzero(is_rep))}

    return run_once(job.work, CLUSTERS_DONE.partition(part), compute)


def _exact_clusters(job: Job, split_index: int) -> dict[str, Any]:
    """Exact copies of this split's survivors that ended in a near cluster: that cluster's id and size.

    Routed to the copy's split (``exact_clusters/s=S/p=R.parquet``), so an exact copy of a document
    that was itself removed as a near duplicate names the final representative, not its twin.
    """

    def compute() -> dict[str, Any]:
        copies = job.work.read_folder(EXACT_BY_REP.split(split_index), EXACT_BY_REP_SCHEMA)
        clusters = job.work.read_folder(CLUSTERS_OUT.split(split_index), CLUSTER_OUT_SCHEMA)
        members = clusters["key"].combine_chunks()
        copies = copies.filter(pc.is_in(copies["rep_key"], value_set=members))
        copies = copies.sort_by([("key", "ascending")])
        where = pc.index_in(copies["rep_key"], value_set=members)
        out = pa.table({"key": copies["key"], "cluster_id": clusters["cluster_id"].take(where),
                        "cluster_size": clusters["cluster_size"].take(where)}, schema=EXACT_CLUSTER_SCHEMA)
        route_by_split(job, EXACT_CLUSTERS, split_index, out)
        return {"copies": out.num_rows}

    return run_once(job.work, EXACT_CLUSTERS_DONE.split(split_index), compute)


def run_clusters(job: Job, run_tasks: Callable[..., list[Any]]) -> list[dict[str, Any]]:
    """The stage: map per split, reduce per partition, then the exact copies' clusters per split."""
    map_splits(_cluster_map, job, job.all_split_indices)
    reduced = run_tasks(_cluster_reduce, [(job, p) for p in range(job.num_partitions)])
    map_splits(_exact_clusters, job, job.all_split_indices)
    return reduced
