"""Stage ``clusters``: one survivor per component, chosen in two phases so that no member's signature
ever moves by cluster label (``gristmill.dedup.survivors``: the best of the splits' bests is the best of all).

1. Map, per split: the split's clustered documents (``labels``) with their signatures; per label, the
   split's best member and how many documents (exact copies included) the split holds of the cluster,
   shuffled by label (``reps_in``): one row per (split, cluster), carrying that member's signature.
2. Reduce, per label partition: the best of those rows is the cluster's survivor and their counts add
   up to its size; each row goes back to the split that sent it with the survivor's key, id and
   signature (``cluster_reps``).
3. Per split: every member's estimated Jaccard similarity to its survivor, where the member's
   signature is (``clusters_out``); members that have exact copies, by key, for
   :func:`gristmill.pipeline.job.exact.exact_clusters`, which then gives every copy its final cluster.

A cluster of 10^8 members spread over S splits puts S rows in one reduce task, not 10^8 signatures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.pipeline.format.signature_index import list_matrix
from gristmill.pipeline.job import components
from gristmill.pipeline.job.datasets import (
    CLUSTER_MAP_DONE,
    CLUSTER_MEMBERS_DONE,
    CLUSTER_OUT_SCHEMA,
    CLUSTER_REPS,
    CLUSTERED_SURVIVORS,
    CLUSTERS_DONE,
    CLUSTERS_OUT,
    EXACT_BY_REP,
    LABELS,
    REPS_IN,
    SIGNATURES,
    cluster_reps_schema,
    reps_schema,
    split_name,
    with_survivor_columns,
)
from gristmill.pipeline.job.exact import exact_clusters
from gristmill.pipeline.job.partitions import Partitions
from gristmill.pipeline.job.tasks import Job, map_splits, route_by_split, run_once
from gristmill.pipeline.job.workdir import partition_of

_MEMBER_COLUMNS = ["key", "id", "length", "copies", "existing", "prefer", "domain", "signature"]


def _members(job: Job, split_index: int) -> pa.Table:
    """The split's clustered documents with their signatures and component label."""
    labels = job.work.read_partition(LABELS, split_index, components.LABEL_SCHEMA)
    if split_index < len(job.index_files):  # an earlier corpus's rows: no preference, no domain
        sigs = with_survivor_columns(job.work.read_table(SIGNATURES.file(split_index), ["key", "id", "length", "copies",
                                                                                         "existing", "signature"]))
    else:
        sigs = job.work.read_table(SIGNATURES.file(split_index), _MEMBER_COLUMNS)
    where = pc.index_in(labels["key"], value_set=sigs["key"].combine_chunks())
    return sigs.select(_MEMBER_COLUMNS).take(where).append_column("label", labels["label"])


def _best(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: the row of its label's best member, and the label's summed ``copies``; and the labels."""
    from gristmill.dedup.cluster import find_sorted, survivors

    labels = table["label"].to_numpy()
    chosen = survivors(labels, table["length"].to_numpy(), table["id"],
                       priority=table["existing"].to_numpy(zero_copy_only=False), weights=table["copies"].to_numpy(),
                       preference=table["prefer"].to_numpy())
    at = find_sorted(chosen.label, labels)[0]
    return chosen.row[at], chosen.weight[at], chosen.label


def _cluster_map(job: Job, split_index: int, partitions: int) -> dict[str, Any]:
    """Phase 1, per split: the split's best member of each cluster and its count, shuffled by label."""

    def compute() -> dict[str, Any]:
        members = _members(job, split_index)
        best, count, _ = _best(members)
        first = np.flatnonzero(best == np.arange(best.size))  # each label's best row, once
        rows = members.take(pa.array(first)).set_column(
            _MEMBER_COLUMNS.index("copies"), "copies", pa.array(count[first], pa.int64()))
        job.work.write_partitioned(REPS_IN, split_name(split_index), rows,
                                   partition_of(rows["label"].to_numpy(), partitions), partitions)
        return {"members": members.num_rows, "clusters": rows.num_rows}

    return run_once(job.work, CLUSTER_MAP_DONE.split(split_index), compute)


def _cluster_reduce(job: Job, part: int) -> dict[str, Any]:
    """Phase 2, per label partition: each cluster's survivor and size, back to every split holding it."""

    def compute() -> dict[str, Any]:
        table = job.work.read_partition(REPS_IN, part, reps_schema(job.params.num_perm))
        winner, size, labels = _best(table)
        chosen = pa.array(winner, pa.int64())
        back = pa.table({
            "key": table["key"], "label": table["label"], "rep_key": table["key"].take(chosen),
            "rep_id": table["id"].take(chosen), "cluster_size": pa.array(size, pa.int64()),
            "rep_signature": table["signature"].take(chosen), "rep_domain": table["domain"].take(chosen),
        }, schema=cluster_reps_schema(job.params.num_perm))
        route_by_split(job, CLUSTER_REPS, part, back)
        return {"rows": table.num_rows, "clusters": int(labels.size)}

    return run_once(job.work, CLUSTERS_DONE.partition(part), compute)


def _cluster_members(job: Job, split_index: int, exact_partitions: int) -> dict[str, Any]:
    """Phase 3, per split: each member's survivor, cluster size and estimated similarity to the survivor;
    members with exact copies also to the partition of their key (``exact_partitions``)."""

    def compute() -> dict[str, Any]:
        from gristmill.dedup.cluster import find_sorted
        from gristmill.dedup.lsh import estimated_jaccard

        num_perm = job.params.num_perm
        members = _members(job, split_index).sort_by("key")
        reps = job.work.read_partition(CLUSTER_REPS, split_index, cluster_reps_schema(num_perm)).sort_by("label")
        at = pa.array(find_sorted(reps["label"].to_numpy(), members["label"].to_numpy())[0], pa.int64())
        similarity = estimated_jaccard(list_matrix(members["signature"], num_perm),
                                       list_matrix(reps["rep_signature"].take(at), num_perm))
        out = pa.table({
            "key": members["key"], "cluster_id": reps["rep_id"].take(at), "cluster_size": reps["cluster_size"].take(at),
            "rep_key": reps["rep_key"].take(at), "rep_id": reps["rep_id"].take(at),
            "similarity": pa.array(similarity, pa.float64()), "rep_domain": reps["rep_domain"].take(at),
        }, schema=CLUSTER_OUT_SCHEMA)
        job.work.write_table(CLUSTERS_OUT.file(split_index), out)
        held = out.select(["key", "cluster_id", "cluster_size", "rep_domain"]).filter(pc.greater(members["copies"], 1))
        job.work.write_partitioned(CLUSTERED_SURVIVORS, split_name(split_index), held,
                                   partition_of(held["key"].to_numpy(), exact_partitions), exact_partitions)
        return {"members": out.num_rows}

    return run_once(job.work, CLUSTER_MEMBERS_DONE.split(split_index), compute)


def run_clusters(job: Job, run_tasks: Callable[..., list[Any]], partitions: Partitions) -> list[dict[str, Any]]:
    """The stage: phase 1 per split, phase 2 per label partition, phase 3 per split, then the exact
    copies' clusters per survivor-key partition."""
    splits = job.all_split_indices  # --against pseudo-splits hold signatures and labels too
    map_splits(lambda j, i: _cluster_map(j, i, partitions.clusters), job, splits, receives=[LABELS])
    reduced = run_tasks(_cluster_reduce, [(job, p) for p in range(partitions.clusters)], receives=[REPS_IN])
    map_splits(lambda j, i: _cluster_members(j, i, partitions.exact), job, splits, receives=[CLUSTER_REPS])
    run_tasks(exact_clusters, [(job, p) for p in range(partitions.exact)],
              receives=[EXACT_BY_REP, CLUSTERED_SURVIVORS])
    return reduced
