"""The job's connected components (pipeline.job.components: dedup.components' rounds as tasks over the
work folder) against dedup's in-memory union-find, on graphs that stress rounds and skew: a long
ascending chain (a hot bucket's links), a star, random pairs; every task within its row budget,
labels routed to their splits, and a driver killed mid-stage resuming to the same labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gristmill.dedup.cluster import connected_components as union_find_components
from gristmill.pipeline.job import components
from gristmill.pipeline.job.config import DedupConfig, index_params
from gristmill.pipeline.job.datasets import LABELS, edges_from
from gristmill.pipeline.job.inputs import KEY_BITS
from gristmill.pipeline.job.tasks import Job
from gristmill.pipeline.job.workdir import WorkDir

SPLITS = 4


def _sequential(function: Any, argument_lists: list[tuple[Any, ...]], receives: Any = ()) -> list[Any]:
    return [function(*arguments) for arguments in argument_lists]


def _job(folder: Path, budget: int) -> Job:
    config = DedupConfig(inputs=[], output=str(folder), cc_rows_per_task=budget)
    return Job(config=config, params=index_params(config), work=WorkDir(str(folder / "_work")), index_files=[],
               fingerprint="test", num_splits=SPLITS)


def _run(job: Job, left: np.ndarray, right: np.ndarray, producers: int = 3,
         run_tasks: Any = _sequential) -> tuple[dict[int, int], dict[str, Any]]:
    """Edges cut among ``producers`` that seed them (as bucket or verify tasks do), the stage, its labels."""
    fine = components.first_fine(left.size, job.config.cc_rows_per_task)
    seeded = sum(components.seed_edges(job, edges_from(p), left[p::producers], right[p::producers], fine)
                 for p in range(producers))
    summary = components.connected_components(job, seeded, left.size, fine, run_tasks)
    labels: dict[int, int] = {}
    rows = 0
    for split in range(SPLITS):
        table = job.work.read_partition(LABELS, split, components.LABEL_SCHEMA)
        keys = table["key"].to_numpy()
        assert (keys >> KEY_BITS == split).all()  # every label went to its key's split
        labels.update(zip(keys.tolist(), table["label"].to_pylist(), strict=True))
        rows += table.num_rows
    assert rows == len(labels)  # one label a node
    return labels, summary


def _expected(left: np.ndarray, right: np.ndarray) -> dict[int, int]:
    nodes = np.unique(np.concatenate([left, right]))
    return dict(zip(nodes.tolist(), union_find_components(nodes, left, right).tolist(), strict=True))


def _graph(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A 2,000-node chain in ascending key order, a 300-node chain in shuffled order, a 500-leaf star
    and 1,500 random pairs among 1,000 nodes, with keys over four splits."""
    rng = np.random.default_rng(seed)
    keys = (rng.integers(0, SPLITS, 4_800) << KEY_BITS) + rng.permutation(1 << 20)[:4_800]
    ascending = np.sort(keys[:2_000])
    chain, star, rest = keys[2_000:2_300], keys[2_300:2_800], keys[2_800:3_800]
    pairs = rng.integers(0, rest.size, (1_500, 2))
    left = np.concatenate([ascending[:-1], chain[:-1], np.repeat(star[0], star.size - 1), rest[pairs[:, 0]]])
    right = np.concatenate([ascending[1:], chain[1:], star[1:], rest[pairs[:, 1]]])
    keep = left != right
    return left[keep].astype(np.int64), right[keep].astype(np.int64)


@pytest.mark.parametrize("seed", [0, 1])
def test_labels_match_union_find_whatever_the_budget(tmp_path: Path, seed: int) -> None:
    left, right = _graph(seed)
    expected = _expected(left, right)
    for budget in (384, 1 << 20):
        labels, summary = _run(_job(tmp_path / f"b{budget}", budget), left, right)
        assert labels == expected
        assert summary["nodes"] == len(expected) and summary["edges"] == left.size
        assert max(summary["largest"]) <= 2 * budget  # no task read more than twice its budget
        if budget == 384:
            assert summary["partitions"] > 10 and 4 <= summary["rounds"] <= 12
        else:  # one task holds everything: it finishes every component in one round
            assert summary["rounds"] == 1 and summary["partitions"] == 1


def test_a_hot_chain_from_one_producer_stays_within_the_budget(tmp_path: Path) -> None:
    # one bucket task linking 20,000 near copies in key order: the worst shape arriving in one place
    keys = np.arange(20_000, dtype=np.int64) + (np.arange(20_000) % SPLITS << KEY_BITS)
    left, right = keys[:-1], keys[1:]
    labels, summary = _run(_job(tmp_path, 1024), left, right, producers=1)
    assert set(labels.values()) == {int(keys.min())} and len(labels) == keys.size
    assert summary["partitions"] >= 20  # seeded into a star spread by leaf, not one task's chain
    assert max(summary["largest"]) <= 2 * 1024


class _Crash(Exception):
    pass


def test_a_driver_killed_mid_stage_resumes_to_the_same_labels(tmp_path: Path) -> None:
    left, right = _graph(2)
    reference, _ = _run(_job(tmp_path / "reference", 384), left, right)
    done: list[Any] = []

    def crashing(function: Any, argument_lists: list[tuple[Any, ...]], receives: Any = ()) -> list[Any]:
        for arguments in argument_lists:
            if len(done) == 25:  # the driver dies in the middle of a round
                raise _Crash
            done.append(function(*arguments))
        return done[-len(argument_lists):]

    job = _job(tmp_path / "resumed", 384)
    with pytest.raises(_Crash):
        _run(job, left, right, run_tasks=crashing)
    computed: list[Any] = []

    def counting(function: Any, argument_lists: list[tuple[Any, ...]], receives: Any = ()) -> list[Any]:
        records = sorted(job.work.fs.glob(job.work.path("cc/done/**/*.json")))
        results = _sequential(function, argument_lists)
        computed.append(len(sorted(job.work.fs.glob(job.work.path("cc/done/**/*.json")))) - len(records))
        return results

    labels, _ = _run(job, left, right, run_tasks=counting)
    assert labels == reference
    total = len(job.work.fs.glob(job.work.path("cc/done/**/*.json")))
    assert sum(computed) == total - 25  # the 25 finished tasks were not run again
