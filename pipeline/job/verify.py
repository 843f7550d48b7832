"""Stage ``verify`` (unless ``--no-verify``): each candidate edge joined with its two documents'
signatures in two per-split hops (by the left key's split, then the right key's); only edges whose
estimated Jaccard reaches the threshold enter connected components."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.format.signature_index import list_matrix
from pipeline.job import components
from pipeline.job.config import DedupError
from pipeline.job.datasets import (
    CANDIDATE_SCHEMA,
    SIGNATURES,
    VERIFY_IN,
    VERIFY_LEFT_DONE,
    VERIFY_RIGHT,
    VERIFY_RIGHT_DONE,
    cc_edges,
    edges_from,
    verify_right_schema,
)
from pipeline.job.tasks import Job, map_splits, route_by_split, run_once


def _signatures_of(job: Job, split_index: int, keys: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The signatures of ``keys`` (all of one split's signed documents), in the order of ``keys``."""
    sigs = job.work.read_table(SIGNATURES.file(split_index), ["key", "signature"])
    where = pc.index_in(keys, value_set=sigs["key"].combine_chunks())
    if where.null_count:
        raise DedupError(f"split {split_index}: a candidate edge names a document without a signature")
    column = sigs["signature"].take(where)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _verify_left(job: Job, split_index: int) -> dict[str, Any]:
    """Hop 1: candidate edges whose left key is in this split get its signature, then go to the right key's split."""

    def compute() -> dict[str, Any]:
        edges = job.work.read_folder(VERIFY_IN.split(split_index), CANDIDATE_SCHEMA)
        edges = edges.sort_by([("left", "ascending"), ("right", "ascending")])
        edges = edges.append_column("left_signature", _signatures_of(job, split_index, edges["left"]))
        route_by_split(job, VERIFY_RIGHT, split_index, edges, "right")
        return {"candidates": edges.num_rows}

    return run_once(job.work, VERIFY_LEFT_DONE.split(split_index), compute)


def _verify_right(job: Job, split_index: int, cc_partitions: int) -> dict[str, Any]:
    """Hop 2: the right key's signature; edges at or above the threshold enter connected components."""

    def compute() -> dict[str, Any]:
        from dedup.lsh import estimated_jaccard

        num_perm = job.params.num_perm
        edges = job.work.read_folder(VERIFY_RIGHT.split(split_index), verify_right_schema(num_perm))
        left, right = edges["left"].to_numpy(), edges["right"].to_numpy()
        if edges.num_rows:
            similar = estimated_jaccard(list_matrix(edges["left_signature"], num_perm),
                                        list_matrix(_signatures_of(job, split_index, edges["right"]), num_perm))
            close = similar >= job.params.threshold  # the test dedup.verify_edges applies
            left, right = left[close], right[close]
        components.write_edges(job.work, cc_edges(0), edges_from(split_index), left, right,
                               components.round_op(0), cc_partitions)
        return {"candidates": edges.num_rows, "edges": int(left.size)}

    return run_once(job.work, VERIFY_RIGHT_DONE.split(split_index), compute)


def run_verify(job: Job, cc_partitions: int) -> dict[str, int]:
    """The stage: both hops over every split; the candidate and verified edge counts."""
    indices = job.all_split_indices  # --against pseudo-splits hold signatures too
    map_splits(_verify_left, job, indices)
    records = map_splits(lambda j, i: _verify_right(j, i, cc_partitions), job, indices)
    return {"candidates": sum(r["candidates"] for r in records), "verified": sum(r["edges"] for r in records)}
