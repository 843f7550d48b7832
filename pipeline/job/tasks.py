"""What every task of the job gets and how tasks run: the job context, completion records, routing by
split, and Ray tasks that retry when a node dies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.format.signature_index import IndexParams
from pipeline.job.config import DedupConfig
from pipeline.job.datasets import BySplit
from pipeline.job.inputs import KEY_BITS, Split
from pipeline.job.workdir import WorkDir


@dataclass
class Job:
    """The context every task of one run gets: its configuration, parameters, work folder and splits."""

    config: DedupConfig
    params: IndexParams
    work: WorkDir
    splits: list[Split]  # new input, numbered after the existing index's pseudo-splits
    index_files: list[str]  # --against: one pseudo-split per index file
    fingerprint: str

    num_partitions: int

    @property
    def split_indices(self) -> list[int]:
        return [s.index for s in self.splits]

    @property
    def all_split_indices(self) -> list[int]:
        return list(range(len(self.index_files))) + self.split_indices

    def split(self, index: int) -> Split:
        return self.splits[index - len(self.index_files)]


def run_once(work: WorkDir, marker: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a task unless its completion record exists; the record is written last."""
    done = work.read_json(marker)
    if done is not None:
        return done
    record = compute()
    work.write_json(marker, record)
    return record


def route_by_split(job: Job, dataset: BySplit, part: int, table: pa.Table, column: str = "key") -> None:
    """A reducer's rows back to the split of the key in ``column``: ``dataset.file(split, part)``."""
    splits = table[column].to_numpy() >> KEY_BITS if table.num_rows else np.zeros(0, np.int64)
    for split in np.unique(splits):
        job.work.write_table(dataset.file(int(split), part), table.filter(pa.array(splits == split)))


def make_runner(ray: Any) -> Callable[..., list[Any]]:
    """Ray tasks for the shuffle reducers: one task per partition, retried when a node dies."""

    def run_tasks(function: Callable[..., Any], argument_lists: list[tuple[Any, ...]]) -> list[Any]:
        remote = ray.remote(num_cpus=1, max_retries=5, retry_exceptions=False)(function)
        return ray.get([remote.remote(*arguments) for arguments in argument_lists])

    return run_tasks


def map_splits(function: Callable[[Job, int], dict[str, Any]], job: Job, indices: list[int]) -> list[dict[str, Any]]:
    """A per-split stage: one Ray task per split, retried when its node dies.

    Plain tasks rather than Ray Data: each split is one opaque unit whose data goes through the work
    folder, and Ray Data's executor cost 3 s of start-up and two helper actors (~240 MB) per job here
    for nothing it does (docs/BENCHMARKS.md, pipeline).
    """
    import ray

    return make_runner(ray)(function, [(job, i) for i in indices]) if indices else []
