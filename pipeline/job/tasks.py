"""What every task of the job gets and how tasks run: the job context, completion records, routing by
split, and Ray tasks that retry when a node dies (or, for a small job, calls in this process)."""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa

from gristmill.pipeline.format.signature_index import IndexFile, IndexParams
from gristmill.pipeline.job.config import DedupConfig
from gristmill.pipeline.job.datasets import BySplit, Shuffled, partition_name
from gristmill.pipeline.job.exchange import prepare
from gristmill.pipeline.job.inputs import KEY_BITS
from gristmill.pipeline.job.prefer import LONGEST, Preference
from gristmill.pipeline.job.workdir import WorkDir

Item = TypeVar("Item")


@dataclass
class Job:
    """The context every task of one run shares: configuration, parameters, work folder and the range
    of split numbers, but no split list (the driver keeps the plan; a read task is sent its
    own split), so it stays a few KB at any input size. Ray's object store holds it once per run
    (:meth:`reference`); a task is sent the reference."""

    config: DedupConfig  # without its INPUT list (the driver's plan resolved it; tasks never read it)
    params: IndexParams
    work: WorkDir
    index_files: list[IndexFile]  # --against: one pseudo-split per index file
    fingerprint: str
    num_splits: int  # splits of the new input, numbered after the index files' pseudo-splits
    preference: Preference = LONGEST  # the survivor policy, parsed (a domain file read) by the driver
    span_index_urls: list[str] = field(default_factory=list)  # --spans --against: the earlier corpora's span indexes
    # the driver's progress: called with each finished task's result (never sent to a task)
    on_task: Callable[[dict[str, Any]], None] | None = field(default=None, repr=False, compare=False)
    in_process: bool = False  # a small job on a local work folder: tasks run here, one after another, no Ray
    # the driver's: every shuffle file the finished tasks' records name, {folder: {file: size}}, and
    # those named since the stage began (its stage record keeps them for a resume); never sent to a task
    work_files: dict[str, dict[str, int]] = field(default_factory=dict, repr=False, compare=False)
    stage_files: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    _reference: Any = field(default=None, init=False, repr=False, compare=False)

    @property
    def split_indices(self) -> list[int]:
        return list(range(len(self.index_files), len(self.index_files) + self.num_splits))

    @property
    def all_split_indices(self) -> list[int]:
        return list(range(len(self.index_files) + self.num_splits))

    def reference(self) -> Any:
        """This context in Ray's object store, put there on first use: every task of the run is sent
        the same reference (a few dozen bytes) and Ray hands the task the object."""
        if self._reference is None:
            import ray

            self._reference = ray.put(self)
        return self._reference

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_reference": None, "on_task": None, "work_files": {}, "stage_files": {}}

    def note_work_files(self, files: dict[str, int]) -> None:
        """Shuffle files (relative path: size) a finished task's record names: what receivers read."""
        for relative, size in files.items():
            self.work_files.setdefault(posixpath.dirname(relative), {})[relative] = size
        self.stage_files.update(files)


WORK_FILES = "work_files"  # in a completion record: the shuffle files the task wrote, {file: size}


def run_once(work: WorkDir, marker: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a task unless its completion record exists; the record is written last, naming the shuffle
    files the task wrote and their sizes (``WORK_FILES``), which the driver hands to their receivers."""
    done = work.read_json(marker)
    if done is not None:
        return done
    work.sent.clear()
    record = compute()
    if work.sent:
        record = {**record, WORK_FILES: dict(work.sent)}
    work.write_json(marker, record)
    return record


def route_by_split(job: Job, dataset: BySplit, part: int, table: pa.Table, column: str = "key") -> None:
    """Reducer ``part``'s rows to the split of the key in ``column``, in one partitioned file whatever
    the number of splits (``dataset.file("p=PPPPP")``)."""
    splits = table[column].to_numpy() >> KEY_BITS if table.num_rows else np.zeros(0, np.int64)
    job.work.write_partitioned(dataset, partition_name(part), table, splits)


def task_arguments(arguments: tuple[Any, ...]) -> tuple[Any, ...]:
    """What a task is sent for ``arguments``: the job context as its object-store reference, the rest as
    given (a split, a partition number: small)."""
    return tuple(a.reference() if isinstance(a, Job) else a for a in arguments)


def _run_stage(call_all: Callable[[Callable[..., Any], list[tuple[Any, ...]]], list[Any]],
               function: Callable[..., Any], argument_lists: list[tuple[Any, ...]],
               receives: Sequence[Shuffled]) -> list[Any]:
    """What every runner does around ``call_all``: the shuffles the tasks read (``receives``) are
    exchanged first (every task is sent the job first), and the shuffle files the tasks' records name
    are noted in the job after (``Job.note_work_files``)."""
    if not argument_lists:
        return []
    job = argument_lists[0][0]
    if receives:
        prepare(job.work, receives, job.work_files)
    results = call_all(function, argument_lists)
    for result in results:
        if isinstance(result, dict) and WORK_FILES in result:
            job.note_work_files(result.pop(WORK_FILES))
    return results


def make_runner(ray: Any, on_task: Callable[[dict[str, Any]], None] | None = None) -> Callable[..., list[Any]]:
    """Ray tasks for the shuffle reducers: one task per partition, retried when a node dies; ``on_task``
    hears each task's result as it finishes (progress inside a stage)."""

    def call_all(function: Callable[..., Any], argument_lists: list[tuple[Any, ...]]) -> list[Any]:
        remote = ray.remote(num_cpus=1, max_retries=5, retry_exceptions=False)(function)
        refs = [remote.remote(*task_arguments(arguments)) for arguments in argument_lists]
        pending = set(refs) if on_task is not None else set()
        while pending:  # what finished within a second, in one call: no O(tasks) call per finished task
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=1.0)
            for result in ray.get(done):
                on_task(result if isinstance(result, dict) else {})
            pending.difference_update(done)
        return ray.get(refs)

    def run_tasks(function: Callable[..., Any], argument_lists: list[tuple[Any, ...]],
                  receives: Sequence[Shuffled] = ()) -> list[Any]:
        return _run_stage(call_all, function, argument_lists, receives)

    return run_tasks


def job_runner(job: Job) -> Callable[..., list[Any]]:
    """How the job's tasks run: Ray tasks (``make_runner``), or in this process for a small job."""
    if not job.in_process:
        import ray

        return make_runner(ray, job.on_task)

    def call_each(function: Callable[..., Any], argument_lists: list[tuple[Any, ...]]) -> list[Any]:
        """Each task called in turn, on a local work folder (``exchange.start_exchange``)."""
        results = []
        for arguments in argument_lists:
            results.append(function(*arguments))
            if job.on_task is not None:
                job.on_task(results[-1] if isinstance(results[-1], dict) else {})
        return results

    def run_here(function: Callable[..., Any], argument_lists: list[tuple[Any, ...]],
                 receives: Sequence[Shuffled] = ()) -> list[Any]:
        return _run_stage(call_each, function, argument_lists, receives)

    return run_here


def map_splits(function: Callable[[Job, Item], dict[str, Any]], job: Job, items: Sequence[Item],
               receives: Sequence[Shuffled] = ()) -> list[dict[str, Any]]:
    """A per-split stage: one Ray task per item (a split number, or the read stage's own split), retried
    when its node dies; ``receives``: the shuffles the tasks read (exchanged before they start).

    Plain tasks rather than Ray Data: each split is one opaque unit whose data goes through the work
    folder, and Ray Data's executor cost 3 s of start-up and two helper actors (~240 MB) per job here
    for nothing it does (docs/BENCHMARKS.md, pipeline).
    """
    return job_runner(job)(function, [(job, item) for item in items], receives) if items else []
