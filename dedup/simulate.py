"""An in-memory executor for :mod:`gristmill.dedup.components`: the rounds a job would run, with their partitions.

It runs every task of a round over in-memory partitions, routed exactly as a shuffle would route
them, and records each partition's rows, so tests and benchmarks can check the labels, the number of
rounds and the balance of every round without Ray or files. Partition counts follow row counts,
``ceil(rows / rows_per_partition)``, as the job's driver would choose them from the last round's
summaries.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from typing import NamedTuple

import numpy as np

from .components import (
    Fates,
    Replies,
    Requests,
    Work,
    concat,
    contract,
    empty,
    final_replies,
    node_ids,
    node_keys,
    partition_of,
    resolve,
    route,
    seed,
    settle,
)


class Round(NamedTuple):
    """Rows of each partition of each kind of task in one shuffle round (empty where none ran)."""

    contract: np.ndarray
    resolve: np.ndarray
    settle: np.ndarray


class Simulation(NamedTuple):
    keys: np.ndarray  # every document key in an edge to another key, ascending
    labels: np.ndarray  # the smallest key of its component
    rounds: list[Round]


_NO_ROWS = np.zeros(0, dtype=np.int64)


def _partitions(rows: int, rows_per_partition: int) -> int:
    return max(1, -(-rows // rows_per_partition))


def _split(columns: tuple[np.ndarray, ...], by: np.ndarray, num_partitions: int) -> list[tuple[np.ndarray, ...]]:
    """The rows of equal-length ``columns`` in each partition of the route of ``by``."""
    part = partition_of(route(by), num_partitions)
    if num_partitions <= 1 << 16:
        part = part.astype(np.uint16)  # sorted by radix
    order = np.argsort(part, kind="stable")
    bounds = np.searchsorted(part[order], np.arange(num_partitions + 1))
    return [tuple(column[order[lo:hi]] for column in columns) for lo, hi in zip(bounds[:-1], bounds[1:])]


def _pack(sizes: list[int], num_tasks: int) -> np.ndarray:
    """Rows per settle task when files go largest first to the least loaded task, as a driver would."""
    loads = [(0, task) for task in range(num_tasks)]
    for size in sorted(sizes, reverse=True):
        load, task = heapq.heappop(loads)
        heapq.heappush(loads, (load + size, task))
    return np.array(sorted(load for load, _ in loads))


def _split_work(work: Work, num_partitions: int) -> list[Work]:
    edges = _split((work.upper, work.lower, work.floor), work.upper, num_partitions)
    notes = _split((work.node, work.node_floor, work.larger), work.node, num_partitions)
    return [Work(*e, *n) for e, n in zip(edges, notes)]


def _split_fates(fates: Fates, num_partitions: int) -> list[Fates]:
    moves = _split((fates.moved, fates.to), fates.moved, num_partitions)
    done = _split((fates.done, fates.label), fates.done, num_partitions)
    return [Fates(*m, *d) for m, d in zip(moves, done)]


def _seeded(left: np.ndarray, right: np.ndarray, producers: int) -> Work:
    """Round 1's rows: the edges cut by a hash of the edge among ``producers`` tasks, each seeding its own."""
    pieces = _split((left, right), node_ids(left) ^ node_ids(right), producers)
    return concat(Work, [seed(*piece) for piece in pieces])


def simulate_components(left: np.ndarray, right: np.ndarray, rows_per_partition: int,
                        producers: int | None = None) -> Simulation:
    """Connected components of the edges ``left[i] - right[i]`` (int64 keys), round by round.

    ``producers`` tasks (default: as many as the edges need partitions) each get the edges of one
    hash range and :func:`gristmill.dedup.components.seed` them, as bucket or verify tasks would.
    """
    left = np.asarray(left, dtype=np.int64)
    right = np.asarray(right, dtype=np.int64)
    work = _seeded(left, right, producers or _partitions(left.size, rows_per_partition))
    fates, pending = empty(Fates), empty(Requests)
    files: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    replies: dict[int, list[Replies]] = defaultdict(list)
    decided: list[Fates] = []
    last: list[Replies] = []  # a finishing round's labels, which every settle task applies last
    rounds: list[Round] = []
    while work.rows or fates.moved.size or (pending.node.size and not last):
        contracted, resolved = _NO_ROWS, _NO_ROWS
        next_work, next_fates, next_pending = empty(Work), empty(Fates), empty(Requests)
        if work.rows:
            pieces = _split_work(work, _partitions(work.rows, rows_per_partition))
            outputs = [contract(p, finish=len(pieces) == 1) for p in pieces]
            contracted = np.array([p.rows for p in pieces])
            next_work = concat(Work, [w for w, _ in outputs])
            next_fates = concat(Fates, [f for _, f in outputs])
            decided.append(next_fates)
            if len(pieces) == 1:
                last = [final_replies(next_fates)]
        if fates.moved.size or pending.node.size:
            count = _partitions(fates.rows + pending.node.size, rows_per_partition)
            mine = _split_fates(fates, count)
            asked = [Requests(*r) for r in _split(tuple(pending), pending.node, count)]
            resolved = np.array([f.rows + r.node.size for f, r in zip(mine, asked)])
            answered, waiting = [], []
            for q, (f, r) in enumerate(zip(mine, asked)):
                requester = len(rounds) << 32 | q
                files[requester] = (f.moved, f.to)
                reply, forward = resolve(f, r, requester)
                answered.append(reply)
                waiting.append(forward)
            reply = concat(Replies, answered)
            order = np.argsort(reply.requester, kind="stable")
            starts = np.flatnonzero(np.diff(reply.requester[order], prepend=-1))
            for lo, hi in zip(starts, np.append(starts[1:], order.size)):
                replies[int(reply.requester[order[lo]])].append(Replies(*(c[order[lo:hi]] for c in reply)))
            next_pending = concat(Requests, waiting)
        rounds.append(Round(contracted, resolved, _NO_ROWS))
        work, fates, pending = next_work, next_fates, next_pending
    done = concat(Fates, decided)
    nodes, labels = [done.done], [done.label]
    files = {requester: file for requester, file in files.items() if file[0].size}
    for requester, (moved, to) in files.items():
        nodes.append(moved)
        labels.append(settle(moved, to, replies[requester] + last))
    if files:
        sizes = [moved.size for moved, _ in files.values()]
        rounds.append(Round(_NO_ROWS, _NO_ROWS, _pack(sizes, _partitions(sum(sizes), rows_per_partition))))
    keys = node_keys(np.concatenate(nodes))
    order = np.argsort(keys)
    return Simulation(keys[order], np.concatenate(labels)[order], rounds)
