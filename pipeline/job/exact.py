"""Stage ``exact``, per hash partition: one survivor per content hash (the map side, :func:`shuffle_exact`,
runs in ``read``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.job.datasets import (
    EXACT_BY_REP,
    EXACT_DONE,
    EXACT_IN,
    EXACT_OUT,
    EXACT_OUT_SCHEMA,
    EXACT_SCHEMA,
    split_name,
)
from pipeline.job.tasks import Job, route_by_split, run_once


def _hash_partition(hashes: Sequence[str], num_partitions: int) -> np.ndarray:
    """The partition of each content hash (hex digits): its first 60 bits modulo the partitions."""
    return np.fromiter((int(h[:15], 16) % num_partitions for h in hashes), dtype=np.int64, count=len(hashes))


def shuffle_exact(job: Job, split_index: int, slim: pa.Table, existing: bool) -> None:
    """The map side: a split's (content hash, key, id, length) rows to the partition of their hash;
    ``existing`` marks rows of an ``--against`` index, which win their exact group."""
    table = slim.append_column("existing", pa.array(np.full(slim.num_rows, existing), pa.bool_()))
    partition = _hash_partition(table["content_hash"].to_pylist(), job.num_partitions)
    job.work.write_partitioned(EXACT_IN, split_name(split_index), table, partition, job.num_partitions)


def exact_partition(job: Job, part: int) -> dict[str, Any]:
    """One partition's exact groups, once: every member with its survivor, routed to its split."""

    def compute() -> dict[str, Any]:
        from dedup.cluster import choose_representatives

        table = job.work.read_folder(EXACT_IN.partition(part), EXACT_SCHEMA)
        table = table.sort_by([("content_hash", "ascending"), ("key", "ascending")])
        hashes = table["content_hash"].combine_chunks() if table.num_rows else pa.array([], pa.string())
        n = table.num_rows
        starts = np.ones(n, bool)
        if n > 1:
            starts[1:] = pc.not_equal(hashes[1:], hashes[:-1]).to_numpy(zero_copy_only=False)
        groups = np.cumsum(starts) - 1
        sizes = np.bincount(groups) if n else np.zeros(0, np.int64)
        in_dup = sizes[groups] > 1 if n else np.zeros(0, bool)
        sub = table.filter(pa.array(in_dup))
        labels = groups[in_dup]
        keys = sub["key"].to_numpy()
        is_rep, rep_index = choose_representatives(
            labels, sub["length"].to_numpy(), sub["id"], priority=sub["existing"].to_numpy(zero_copy_only=False))
        rep_index = np.asarray(rep_index)
        ids = sub["id"].to_pylist()
        out = pa.table({
            "key": pa.array(keys, pa.int64()), "rep_key": pa.array(keys[rep_index], pa.int64()),
            "rep_id": [ids[i] for i in rep_index], "copies": pa.array(sizes[labels], pa.int64()),
        }, schema=EXACT_OUT_SCHEMA)
        route_by_split(job, EXACT_OUT, part, out)
        # the copies again, by their survivor's split: the clusters stage tells them its final cluster
        copies = out.filter(pc.not_equal(out["key"], out["rep_key"])).select(["key", "rep_key"])
        route_by_split(job, EXACT_BY_REP, part, copies, "rep_key")
        return {"duplicates": int(len(keys) - np.count_nonzero(is_rep))}

    return run_once(job.work, EXACT_DONE.partition(part), compute)
