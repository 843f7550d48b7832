"""What document-level dedup decided for each document of a split: kept, or removed as an exact or near
duplicate of which survivor, and its cluster. The ``spans`` stage (which cuts spans from the kept
documents only) and the ``write`` stage both need it, after ``clusters``."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.pipeline.job.datasets import CLUSTERS_OUT, EXACT_CLUSTER_SCHEMA, EXACT_CLUSTERS
from gristmill.pipeline.job.exact import exact_of
from gristmill.pipeline.job.tasks import Job

KEPT, EXACT_DUPLICATE, NEAR_DUPLICATE, SPANS = 0, 1, 2, 3
# what ``removed_as`` says for each status; ``spans``: too little left once its repeated spans were cut
JOB_STATUSES = ("kept", "exact_duplicate", "near_duplicate", "spans")


@dataclass
class Outcomes:
    """Per document of a split, in key order."""

    status: np.ndarray  # int8: KEPT, EXACT_DUPLICATE or NEAR_DUPLICATE (SPANS is set by ``write``)
    cluster_id: list[str]
    cluster_size: np.ndarray
    duplicate_of: list[str | None]
    similarity: np.ndarray
    survivor_domain: np.ndarray  # a removed document's final survivor's domain (lost_to)


def document_outcomes(job: Job, split_index: int, docs: pa.Table) -> Outcomes:
    """The outcome of each of ``docs`` (the split's ``key``, ``id`` and ``content_hash``): needs the
    ``exact_out`` and ``exact_clusters`` shuffles received and the split's ``clusters_out``."""
    exact = exact_of(job, split_index, docs["content_hash"])
    clusters = job.work.read_table(CLUSTERS_OUT.file(split_index))
    n = docs.num_rows
    keys = docs["key"].to_numpy()
    ids = docs["id"].to_pylist()
    status = np.zeros(n, np.int8)
    cluster_id = list(ids)
    cluster_size = np.ones(n, np.int64)
    duplicate_of: list[str | None] = [None] * n
    similarity = np.full(n, np.nan)
    survivor_domain = np.full(n, None, object)

    # the exact group, unless a near cluster holds its survivor (below)
    member = exact["rep_key"].is_valid().to_numpy(zero_copy_only=False)
    cluster_size[member] = exact["copies"].drop_null().to_numpy()
    copy = member & (pc.fill_null(exact["rep_key"], -1).to_numpy() != keys)
    rep_ids = exact["rep_id"].to_pylist()
    status[copy] = EXACT_DUPLICATE
    similarity[copy] = 1.0
    exact_domains = exact["rep_domain"].to_pylist()
    for pos in np.flatnonzero(copy):
        duplicate_of[pos] = cluster_id[pos] = rep_ids[pos]
        survivor_domain[pos] = exact_domains[pos]
    cluster_pos = np.searchsorted(keys, clusters["key"].to_numpy())  # the split's keys are sorted
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
            status[pos] = NEAR_DUPLICATE
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
    return Outcomes(status, cluster_id, cluster_size, duplicate_of, similarity, survivor_domain)
