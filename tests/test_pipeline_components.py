"""The distributed connected components (large-star / small-star over partition files) against
dedup's in-memory union-find, on graphs that stress the round count: long chains, stars, cliques."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dedup.cluster import connected_components as union_find_components
from pipeline.job import components
from pipeline.job.datasets import LABELS, cc_edges
from pipeline.job.workdir import WorkDir

KEY_BITS = 32


def _sequential(function: Any, argument_lists: list[tuple[Any, ...]]) -> list[Any]:
    return [function(*arguments) for arguments in argument_lists]


def _labels(tmp_path: Path, left: np.ndarray, right: np.ndarray, partitions: int) -> tuple[dict[int, int], dict]:
    work = WorkDir(str(tmp_path / f"work-{partitions}"))
    components.write_edges(work, cc_edges(0), "input", left, right, components.round_op(0), partitions)
    summary = components.connected_components(work, partitions, _sequential, KEY_BITS)
    table = work.read_folder(f"{LABELS.folder}/*", components.LABEL_SCHEMA)
    return dict(zip(table["key"].to_pylist(), table["label"].to_pylist(), strict=True)), summary


def _graph(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = (rng.integers(0, 4, 600) << KEY_BITS) + rng.permutation(100_000)[:600]
    chain = keys[:200]  # a path of 200 nodes in shuffled key order: diameter 199
    left = [chain[:-1]]
    right = [chain[1:]]
    star = keys[200:300]
    left.append(np.repeat(star[0], 99))
    right.append(star[1:])
    rest = keys[300:]
    pairs = rng.integers(0, rest.size, (250, 2))
    left.append(rest[pairs[:, 0]])
    right.append(rest[pairs[:, 1]])
    left_all, right_all = np.concatenate(left), np.concatenate(right)
    keep = left_all != right_all
    return left_all[keep].astype(np.int64), right_all[keep].astype(np.int64)


@pytest.mark.parametrize("seed", [0, 1])
def test_labels_match_union_find_for_any_partition_count(tmp_path: Path, seed: int) -> None:
    left, right = _graph(seed)
    nodes = np.unique(np.concatenate([left, right]))
    expected = dict(zip(nodes.tolist(), union_find_components(nodes, left, right).tolist(), strict=True))
    for partitions in (1, 5):
        labels, summary = _labels(tmp_path, left, right, partitions)
        assert labels == expected
        assert summary["nodes"] == nodes.size
        assert summary["rounds"] < 60  # far fewer rounds than the 199-edge chain would need with label propagation


def test_fingerprint_counts_each_undirected_edge_once_in_either_orientation() -> None:
    a = np.array([5, 3, 9, 7], dtype=np.int64)
    b = np.array([3, 9, 7, 1], dtype=np.int64)
    large = components.fingerprint(*components.orient(a, b, "large"), "large")
    small = components.fingerprint(*components.orient(a, b, "small"), "small")
    assert large == small and large[0] == 4
    other = components.fingerprint(*components.orient(a, b[::-1].copy(), "small"), "small")
    assert other[1] != small[1]
