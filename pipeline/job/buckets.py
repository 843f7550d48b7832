"""Stage ``buckets``, per hash partition: candidate edges within each LSH band bucket (the map side,
:func:`shuffle_bands`, runs in ``sign`` and, for ``--against`` index files, in ``read``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.job import components
from pipeline.job.datasets import (
    BUCKET_SCHEMA,
    BUCKETS_DONE,
    BUCKETS_IN,
    CANDIDATE_SCHEMA,
    VERIFY_IN,
    cc_edges,
    edges_from,
    split_name,
)
from pipeline.job.tasks import Job, route_by_split, run_once
from pipeline.job.workdir import partition_of


def shuffle_bands(job: Job, split_index: int, keys: np.ndarray, bands: np.ndarray) -> None:
    """Every (band hash, key) row goes to the partition of its band hash (hashes are salted per band)."""
    hashes = bands.reshape(-1)
    repeated = np.repeat(keys, bands.shape[1])
    table = pa.table({"hash": pa.array(hashes, pa.uint64()), "key": pa.array(repeated, pa.int64())})
    job.work.write_partitioned(BUCKETS_IN, split_name(split_index), table,
                               partition_of(hashes, job.num_partitions), job.num_partitions)


def bucket_partition(job: Job, part: int, cc_partitions: int) -> dict[str, Any]:
    """One partition's band buckets, once: their candidate edges, to verification or straight to
    connected components (``cc_partitions`` partitions)."""

    def compute() -> dict[str, Any]:
        from dedup.lsh import bucket_edges

        table = job.work.read_folder(BUCKETS_IN.partition(part), BUCKET_SCHEMA)
        keys = table["key"].to_numpy()
        hashes = table["hash"].to_numpy()
        left, right = bucket_edges(keys, hashes.reshape(-1, 1))
        if job.params.verify:  # to the split of the left key, where its signature is
            route_by_split(job, VERIFY_IN, part, pa.table({"left": left, "right": right}, schema=CANDIDATE_SCHEMA), "left")
        else:
            components.write_edges(job.work, cc_edges(0), edges_from(part), left, right, components.round_op(0),
                                   cc_partitions)
        return {"edges": len(left)}

    return run_once(job.work, BUCKETS_DONE.partition(part), compute)
