"""Distributed connected components: alternating large-star / small-star over hash-partitioned edges.

Kiveris et al., "Connected Components in MapReduce and Beyond" (SoCC 2014): each round is one
shuffle; after O(log^2 n) rounds every component is a star around its smallest key, so a node's
label is the smallest key of its component, the same label ``dedup.connected_components`` gives.
No process ever holds more than one partition of the edges. Each round reads
``cc/rNNN/p=*/`` and writes ``cc/rNNN+1/p=*/`` (:func:`pipeline.job.datasets.cc_edges`), with a
completion record per partition, so a rerun resumes at the first unfinished round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.job.datasets import LABELS, LABELS_DONE, Shuffled, cc_done, cc_edges, edges_from
from pipeline.job.workdir import WorkDir, partition_of

EDGE_SCHEMA = pa.schema([pa.field("u", pa.int64()), pa.field("v", pa.int64())])
LABEL_SCHEMA = pa.schema([pa.field("key", pa.int64()), pa.field("label", pa.int64())])
_MIX = np.uint64(0xBF58476D1CE4E5B9)


def round_op(round_index: int) -> str:
    """Even rounds are large-star, odd rounds small-star."""
    return "large" if round_index % 2 == 0 else "small"


def _group_min(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For rows sorted by u: the distinct u, min(u, min of its v), and each row's index into them."""
    starts = np.flatnonzero(np.concatenate([[True], u[1:] != u[:-1]]))
    nodes = u[starts]
    minima = np.minimum(np.minimum.reduceat(v, starts), nodes)
    row_group = np.repeat(np.arange(len(starts)), np.diff(np.concatenate([starts, [len(u)]])))
    return nodes, minima, row_group


def star_step(u: np.ndarray, v: np.ndarray, op: str) -> tuple[np.ndarray, np.ndarray]:
    """One large-star or small-star reduce over rows ``v in N(u)`` (sorted by u); returns new edges."""
    if len(u) == 0:
        return u, v
    nodes, minima, row_group = _group_min(u, v)
    m = minima[row_group]
    if op == "large":
        keep = v > u
        return v[keep], m[keep]
    # small-star: rows are oriented larger -> smaller; link u and every smaller neighbour to the minimum
    a = np.concatenate([v, nodes])
    b = np.concatenate([m, minima])
    keep = a != b
    return a[keep], b[keep]


def orient(a: np.ndarray, b: np.ndarray, op: str) -> tuple[np.ndarray, np.ndarray]:
    """Rows for the next reduce: both directions for large-star, larger -> smaller for small-star."""
    if op == "large":
        return np.concatenate([a, b]), np.concatenate([b, a])
    return np.maximum(a, b), np.minimum(a, b)


def fingerprint(u: np.ndarray, v: np.ndarray, op: str) -> tuple[int, int]:
    """(count, order-free hash) of the undirected edge set a partition holds, each edge counted once."""
    if op == "large":
        once = u < v
        lo, hi = u[once], v[once]
    else:
        lo, hi = v, u
    mixed = (lo.astype(np.uint64) * _MIX) ^ (hi.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15))
    mixed = (mixed ^ (mixed >> np.uint64(31))) * _MIX
    return len(lo), int(np.sum(mixed, dtype=np.uint64))


def load_sorted(work: WorkDir, folder: str) -> tuple[np.ndarray, np.ndarray]:
    """A partition's rows, deduplicated and sorted by (u, v)."""
    table = work.read_folder(folder, EDGE_SCHEMA)
    if table.num_rows == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    pairs = np.unique(np.stack([table["u"].to_numpy(), table["v"].to_numpy()], axis=1), axis=0)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def write_edges(work: WorkDir, edges: Shuffled, name: str, a: np.ndarray, b: np.ndarray, op: str,
                num_partitions: int) -> None:
    """Orient new edges for the reduce ``op`` and shuffle them by their key node into a round's ``edges``."""
    u, v = orient(a, b, op)
    table = pa.table({"u": pa.array(u, pa.int64()), "v": pa.array(v, pa.int64())})
    work.write_partitioned(edges, name, table, partition_of(u, num_partitions), num_partitions)


def cc_round(work: WorkDir, round_index: int, part: int, num_partitions: int) -> dict[str, int]:
    """One reduce task of one round; records the input edge set's fingerprint."""
    marker = cc_done(round_index).partition(part)
    done = work.read_json(marker)
    if done is not None:
        return done
    op = round_op(round_index)
    u, v = load_sorted(work, cc_edges(round_index).partition(part))
    count, digest = fingerprint(u, v, op)
    a, b = star_step(u, v, op)
    write_edges(work, cc_edges(round_index + 1), edges_from(part), a, b, round_op(round_index + 1),
                num_partitions)
    record = {"edges": count, "digest": digest}
    work.write_json(marker, record)
    return record


def cc_labels(work: WorkDir, round_index: int, part: int, num_partitions: int, key_bits: int) -> int:
    """From a converged, large-star-oriented edge set: each node's label, shuffled to its split."""
    assert round_op(round_index) == "large"
    marker = LABELS_DONE.partition(part)
    done = work.read_json(marker)
    if done is not None:
        return int(done["nodes"])
    u, v = load_sorted(work, cc_edges(round_index).partition(part))
    nodes, minima, _ = _group_min(u, v) if len(u) else (u, v, u)
    table = pa.table({"key": pa.array(nodes, pa.int64()), "label": pa.array(minima, pa.int64())})
    splits = (nodes >> key_bits) if len(nodes) else nodes
    for split in np.unique(splits):
        chosen = splits == split
        work.write_table(LABELS.file(int(split), part), table.filter(pa.array(chosen)))
    work.write_json(marker, {"nodes": len(nodes)})
    return len(nodes)


def connected_components(work: WorkDir, num_partitions: int, run_tasks: Callable[..., list[Any]],
                         key_bits: int) -> dict[str, int]:
    """Rounds until two consecutive ops leave the edge set unchanged, then labels per split.

    ``cc_edges(0)`` must hold the candidate edges (written with :func:`write_edges` for round 0);
    ``run_tasks(function, argument_tuples)`` runs one task per tuple (Ray tasks in the job).
    """
    history: list[tuple[int, int]] = []
    round_index = 0
    while True:
        records = run_tasks(cc_round, [(work, round_index, p, num_partitions) for p in range(num_partitions)])
        history.append((sum(r["edges"] for r in records), sum(r["digest"] for r in records) % (1 << 64)))
        if len(history) >= 3 and history[-1] == history[-2] == history[-3]:
            break
        round_index += 1
    final = round_index if round_op(round_index) == "large" else round_index - 1
    nodes = run_tasks(cc_labels, [(work, final, p, num_partitions, key_bits) for p in range(num_partitions)])
    return {"rounds": round_index + 1, "edges": history[0][0], "nodes": sum(nodes), "partitions": num_partitions}
