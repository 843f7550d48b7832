"""Stage ``buckets``, per band-hash partition: candidate edges within each LSH band bucket (the sending
side, :func:`shuffle_bands`, runs in ``sign``).

A hot bucket (a boilerplate page's near copies share most of their bands) puts all its rows in one
partition: the reducer reads its rows sorted through :class:`gristmill.pipeline.job.spill.ExternalSort`, which
spills sorted runs to disk past the job's ``spill_bytes``, and links consecutive keys table by table,
carrying the last row of each table into the next, so it holds about the budget whatever the bucket.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from gristmill.pipeline.format.sorted_parquet import range_partition
from gristmill.pipeline.job import components
from gristmill.pipeline.job.datasets import (
    BUCKET_SCHEMA,
    BUCKETS_DONE,
    BUCKETS_IN,
    CANDIDATE_SCHEMA,
    VERIFY_IN,
    edges_from,
    split_name,
)
from gristmill.pipeline.job.spill import ExternalSort
from gristmill.pipeline.job.tasks import Job, run_once
from gristmill.pipeline.job.workdir import partition_of


def shuffle_bands(job: Job, split_index: int, keys: np.ndarray, bands: np.ndarray, partitions: int) -> None:
    """Every (band hash, key) row goes to the partition of its band hash (hashes are salted per band), by
    range, so that a sorted earlier index is read in part (``gristmill.pipeline.job.earlier``)."""
    hashes = bands.reshape(-1)
    repeated = np.repeat(keys, bands.shape[1])
    table = pa.table({"hash": pa.array(hashes, pa.uint64()), "key": pa.array(repeated, pa.int64())})
    job.work.write_partitioned(BUCKETS_IN, split_name(split_index), table, range_partition(hashes, partitions),
                               partitions)


class EdgeSender:
    """A producer's edges (candidate or verified) to connected components' first round, contracted by
    ``components.seed_edges`` a budget of edges at a time: a hot bucket's chain of edges never sits
    whole in one task. Each batch is one file of round 1; a producer sends at least one (maybe empty)."""

    def __init__(self, job: Job, name: str, fine: int) -> None:
        self.job, self.name, self.fine = job, name, fine
        self.budget = max(1, job.config.send_bytes // 16)  # edges: two int64 keys
        self.left: list[np.ndarray] = []
        self.right: list[np.ndarray] = []
        self.held = self.batches = self.seeded = 0

    def add(self, left: np.ndarray, right: np.ndarray) -> None:
        self.left.append(left)
        self.right.append(right)
        self.held += len(left)
        if self.held >= self.budget:
            self._send()

    def _send(self) -> None:
        left = np.concatenate(self.left) if self.left else np.zeros(0, np.int64)
        right = np.concatenate(self.right) if self.right else np.zeros(0, np.int64)
        self.seeded += components.seed_edges(self.job, f"{self.name}-{self.batches:04d}", left, right, self.fine)
        self.left, self.right, self.held, self.batches = [], [], 0, self.batches + 1

    def close(self) -> int:
        """Send what is held (at least one batch); the rows sent to round 1."""
        if self.held or not self.batches:
            self._send()
        return self.seeded


def _links(tables: Iterator[pa.Table]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``gristmill.dedup.bucket_edges`` over (hash, key) rows arriving sorted a table at a time: each table is
    linked with the last row of the one before, whose bucket may go on in it."""
    from gristmill.dedup.lsh import bucket_edges

    last = BUCKET_SCHEMA.empty_table()
    for table in tables:
        table = pa.concat_tables([last, table])
        yield bucket_edges(table["key"].to_numpy(), table["hash"].to_numpy().reshape(-1, 1))
        last = table.slice(table.num_rows - 1)


def bucket_partition(job: Job, part: int, verify_partitions: int, cc_fine: int) -> dict[str, Any]:
    """One partition's band buckets, once: their candidate edges, to verification by the left key's
    partition (``verify_partitions``), or seeded into connected components (``cc_fine`` hash ranges)."""

    def compute() -> dict[str, Any]:
        sort = ExternalSort(["hash", "key"], job.config.spill_bytes)
        links = _links(sort.sorted(job.work.partition_tables(BUCKETS_IN, part)))
        edges, seeded = 0, 0
        if job.params.verify:
            with job.work.partitioned_writer(VERIFY_IN, edges_from(part), verify_partitions,
                                             job.config.send_bytes) as out:
                for left, right in links:
                    out.write(pa.table({"left": left, "right": right}, schema=CANDIDATE_SCHEMA),
                              partition_of(left, verify_partitions))
                    edges += len(left)
        else:
            sender = EdgeSender(job, edges_from(part), cc_fine)
            for left, right in links:
                sender.add(left, right)
                edges += len(left)
            seeded = sender.close()
        return {"edges": edges, "seeded": seeded, "spilled_runs": sort.runs}

    return run_once(job.work, BUCKETS_DONE.partition(part), compute)
