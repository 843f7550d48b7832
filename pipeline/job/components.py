"""Stage ``cc``: connected components of the linked documents as rounds of Ray tasks, no task holding
more than about a budget of rows (``cc_rows_per_task``) however large a component or hot a node.

The algorithm is :mod:`gristmill.dedup.components` (its docstring has the reasoning); this module runs it as
:func:`gristmill.dedup.simulate.simulate_components` does in memory, with the work folder between rounds:

- The producers of the edges (``buckets`` without verification, ``verify`` with) contract their own
  edges by union-find (:func:`seed_edges`) and send round 1's rows, so a hot bucket arrives as a
  star spread by leaf.
- Round ``t`` runs two kinds of task at once. A *contract* task reduces its share of the round's rows
  (``cc/rTTT/work``) and sends the next round's; the fates it decides go, by node, to the *resolve*
  tasks of round ``t + 1`` (``cc/rTTT/resolve``), a round behind, which answer what became of the
  nodes that moved nodes point at and forward what must wait. A node done writes its label to its
  split at once (``labels``). A resolve task cuts the moves it received into files of moves (the
  simulator's one file per task, cut to a share of the budget); each file asks once for each node
  its moves point at, and its moves and the replies to them go, by the file's slot, to ``cc/settle``.
- The round whose rows fit one task finishes every component it holds; its labels, in
  ``cc/final.parquet``, answer whatever is still pending. Then *settle* tasks, one per group of slots
  holding about a budget of moves and replies, follow every moved node to its label.

**Task counts follow rows.** A round runs ``ceil(rows / cc_rows_per_task)`` tasks, a number known
only once the round before has run. So senders cut their rows into fine hash ranges, ``FINE`` for
every task that could read them (rows never grow from round to round, so the round before bounds
them), and a task reads a contiguous group of ranges. Measured on the simulator, fixing a round's
count from its senders' input instead costs two more rounds on a 10^6-node chain.

Each task writes a completion record holding its summary (rows read and sent, fates decided): all
the driver needs to size the next round, so a rerun replays the records and resumes at the first
unfinished task. Labels are the smallest key of each component, as ``gristmill.dedup.connected_components``
gives them, whatever the task counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from gristmill.dedup import components as algo
from gristmill.pipeline.job.datasets import (
    CC_FINAL,
    CC_SETTLE,
    CC_SETTLE_DONE,
    LABELS,
    Shuffled,
    cc_done,
    cc_resolve,
    cc_work,
)
from gristmill.pipeline.job.tasks import Job, route_by_split, run_once

FINE = 2  # hash ranges a round's rows are cut into per task that may read them
# A resolve task cuts its moves into files of at most budget / FILE_SHARE moves (and at most FILES
# files): a settle task reads a file's moves with the replies to them, about 2.4 replies a move on a
# shuffled chain (measured), so files this size pack into settle tasks near their budget.
FILE_SHARE = 4
FILES = 64
_NOBODY = -1  # the requester resolve is told this task is; its own targets are asked per file instead
WORK_SCHEMA = pa.schema([  # an edge (node = its upper end) or a note (edge false), by node
    ("node", pa.uint64()), ("lower", pa.uint64()), ("floor", pa.int64()), ("larger", pa.int64()),
    ("edge", pa.bool_()),
])
RESOLVE_SCHEMA = pa.schema([("node", pa.uint64()), ("value", pa.int64()), ("kind", pa.int8())])
MOVED, DONE, REQUEST = 0, 1, 2  # kinds of resolve rows; value: the node moved to, the label, the requester
SETTLE_SCHEMA = pa.schema([  # a resolve task's own moves (own) and the replies to them, by slot
    ("requester", pa.int64()), ("node", pa.uint64()), ("to", pa.uint64()), ("label", pa.int64()),
    ("done", pa.bool_()), ("own", pa.bool_()),
])
FINAL_SCHEMA = pa.schema([("node", pa.uint64()), ("label", pa.int64())])
LABEL_SCHEMA = pa.schema([pa.field("key", pa.int64()), pa.field("label", pa.int64())])


@dataclass(frozen=True)
class Round:
    """What every task of one round needs to know: where its input is cut and how to cut its output."""

    number: int
    work_fine: int  # hash ranges of this round's work rows
    resolve_fine: int  # hash ranges of this round's resolve rows
    next_work_fine: int
    next_resolve_fine: int
    slots: int  # destinations of cc/settle
    finish: bool  # one contract task: it holds whole components and ends them all


def tasks_for(rows: int, budget: int) -> int:
    """Tasks for ``rows`` at ``budget`` rows a task (at least one)."""
    return max(1, -(-rows // budget))


def first_fine(edges: int, budget: int) -> int:
    """Hash ranges of round 1, from a bound on its edges: a producer sends at most two rows an edge."""
    return FINE * tasks_for(2 * edges, budget)


def group(index: int, count: int, fine: int) -> range:
    """The hash ranges task ``index`` of ``count`` reads out of ``fine``: a contiguous share."""
    return range(-(-index * fine // count), -(-(index + 1) * fine // count))


def _ranges(nodes: np.ndarray, fine: int) -> np.ndarray:
    """The hash range (of ``fine``) of the route of each node (``gristmill.dedup.components.route``)."""
    return algo.partition_of(algo.route(nodes), fine)


def _send(job: Job, dataset: Shuffled, name: str, table: pa.Table, fine: int) -> None:
    """Rows (node first) to the hash ranges of their nodes."""
    job.work.write_partitioned(dataset, name, table, _ranges(table["node"].to_numpy(), fine), fine)


def _read(job: Job, dataset: Shuffled, ranges: range, schema: pa.Schema) -> pa.Table:
    tables = [table for part in ranges for table in job.work.partition_tables(dataset, part)]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def _work_table(work: algo.Work) -> pa.Table:
    edges, notes = work.upper.size, work.node.size
    return pa.table({
        "node": np.concatenate([work.upper, work.node]),
        "lower": np.concatenate([work.lower, np.zeros(notes, np.uint64)]),
        "floor": np.concatenate([work.floor, work.node_floor]),
        "larger": np.concatenate([np.zeros(edges, np.int64), work.larger]),
        "edge": np.concatenate([np.ones(edges, bool), np.zeros(notes, bool)]),
    }, schema=WORK_SCHEMA)


def _work_of(table: pa.Table) -> algo.Work:
    node, lower, floor, larger, edge = (table[name].to_numpy() for name in WORK_SCHEMA.names)
    return algo.Work(node[edge], lower[edge], floor[edge], node[~edge], floor[~edge], larger[~edge])


def _write_labels(job: Job, writer: int, nodes: np.ndarray, labels: np.ndarray) -> None:
    table = pa.table({"key": algo.node_keys(nodes), "label": labels}, schema=LABEL_SCHEMA)
    route_by_split(job, LABELS, writer, table)


def seed_edges(job: Job, name: str, left: np.ndarray, right: np.ndarray, fine: int) -> int:
    """A producer's edges (int64 keys) contracted by union-find (``gristmill.dedup.components.seed``) into round
    1's rows, sent as ``name`` to ``fine`` hash ranges (:func:`first_fine`); returns how many rows."""
    table = _work_table(algo.seed(np.asarray(left, np.int64), np.asarray(right, np.int64)))
    _send(job, cc_work(1), name, table, fine)
    return table.num_rows


def _files(moves: int, budget: int) -> list[int]:
    """How many of a resolve task's ``moves`` each of its files of moves holds (at most FILES of them)."""
    size = max(1, budget // FILE_SHARE, -(-moves // FILES))
    return [min(size, moves - start) for start in range(0, moves, size)]


def _requester(file: np.ndarray | int, slots: int) -> np.ndarray | int:
    """A file of moves as requester: its slot (where its moves and the replies to them go) and number."""
    return (file % slots) << 32 | file


def _contract(job: Job, rnd: Round, index: int, count: int, seq: int) -> dict[str, int]:
    def compute() -> dict[str, int]:
        work = _work_of(_read(job, cc_work(rnd.number), group(index, count, rnd.work_fine), WORK_SCHEMA))
        sent, fates = algo.contract(work, finish=rnd.finish)
        _write_labels(job, seq, fates.done, fates.label)
        if rnd.finish:
            job.work.write_table(CC_FINAL, pa.table({"node": fates.done, "label": fates.label}, schema=FINAL_SCHEMA))
        else:
            name = f"c{index:05d}"
            _send(job, cc_work(rnd.number + 1), name, _work_table(sent), rnd.next_work_fine)
            table = pa.table({
                "node": np.concatenate([fates.moved, fates.done]),
                "value": np.concatenate([fates.to.view(np.int64), fates.label]),
                "kind": np.repeat(np.array([MOVED, DONE], np.int8), [fates.moved.size, fates.done.size]),
            }, schema=RESOLVE_SCHEMA)
            _send(job, cc_resolve(rnd.number + 1), name, table, rnd.next_resolve_fine)
        return {"rows": work.rows, "sent": sent.rows, "moved": int(fates.moved.size), "done": int(fates.done.size)}

    return run_once(job.work, cc_done(rnd.number, "contract").partition(index), compute)


def _resolve(job: Job, rnd: Round, index: int, count: int, seq: int) -> dict[str, int]:
    def compute() -> dict[str, int]:
        table = _read(job, cc_resolve(rnd.number), group(index, count, rnd.resolve_fine), RESOLVE_SCHEMA)
        node, value, kind = (table[name].to_numpy() for name in RESOLVE_SCHEMA.names)
        moved, done, asked = kind == MOVED, kind == DONE, kind == REQUEST
        fates = algo.Fates(node[moved], value[moved].view(np.uint64), node[done], value[done])
        replies, forward = algo.resolve(fates, algo.Requests(node[asked], value[asked]), _NOBODY)
        # this task's moves in files of at most a share of the budget, in target order so that moves to
        # one node share a file; each file asks once for each of its targets (resolve asked as _NOBODY)
        by_target = np.argsort(fates.to, kind="stable")
        moves, to = fates.moved[by_target], fates.to[by_target]
        sizes = _files(moves.size, job.config.cc_rows_per_task)
        file = seq * FILES + np.repeat(np.arange(len(sizes)), sizes)
        requester = np.asarray(_requester(file, rnd.slots), np.int64)
        asks = np.ones(moves.size, bool)
        asks[1:] = (to[1:] != to[:-1]) | (file[1:] != file[:-1])  # both ascend: repeats are adjacent
        waiting = forward.requester != _NOBODY
        ask_node = np.concatenate([forward.node[waiting], to[asks]])
        ask_by = np.concatenate([forward.requester[waiting], requester[asks]])
        settle = pa.table({
            "requester": np.concatenate([requester, replies.requester]),
            "node": np.concatenate([moves, replies.node]), "to": np.concatenate([to, replies.to]),
            "label": np.concatenate([np.zeros(moves.size, np.int64), replies.label]),
            "done": np.concatenate([np.zeros(moves.size, bool), replies.done]),
            "own": np.concatenate([np.ones(moves.size, bool), np.zeros(replies.node.size, bool)]),
        }, schema=SETTLE_SCHEMA)
        job.work.write_partitioned(CC_SETTLE, f"r{rnd.number:03d}-q{index:05d}", settle,
                                   settle["requester"].to_numpy() >> 32, rnd.slots)
        requests = pa.table({"node": ask_node, "value": ask_by, "kind": np.full(ask_node.size, REQUEST, np.int8)},
                            schema=RESOLVE_SCHEMA)
        _send(job, cc_resolve(rnd.number + 1), f"q{index:05d}", requests, rnd.next_resolve_fine)
        return {"rows": table.num_rows, "requests": int(ask_node.size), "moves": int(moves.size),
                "replies": int(replies.node.size)}

    return run_once(job.work, cc_done(rnd.number, "resolve").partition(index), compute)


def round_task(job: Job, rnd: Round, kind: str, index: int, count: int, seq: int) -> dict[str, int]:
    """One task of a round (``kind`` contract or resolve), once; ``seq`` numbers it within the stage."""
    return (_contract if kind == "contract" else _resolve)(job, rnd, index, count, seq)


def settle_task(job: Job, slots: range, final: bool, seq: int) -> dict[str, int]:
    """Labels of the moved nodes whose moves went to ``slots``, from the replies to them and, when a round
    finished everything left (``final``), that round's labels."""

    def compute() -> dict[str, int]:
        table = _read(job, CC_SETTLE, slots, SETTLE_SCHEMA)
        requester, node, to, label, done, own = (table[name].to_numpy() for name in SETTLE_SCHEMA.names)
        replies = [algo.Replies(requester[~own], node[~own], to[~own], label[~own], done[~own])]
        last = job.work.read_table(CC_FINAL) if final else FINAL_SCHEMA.empty_table()
        nowhere = np.zeros(0, np.uint64)
        replies.append(algo.final_replies(algo.Fates(nowhere, nowhere, last["node"].to_numpy(),
                                                     last["label"].to_numpy())))
        labels = algo.settle(node[own], to[own], replies) if own.any() else np.zeros(0, np.int64)
        _write_labels(job, seq, node[own], labels)
        return {"rows": table.num_rows + last.num_rows, "moves": int(own.sum())}

    return run_once(job.work, CC_SETTLE_DONE.partition(seq), compute)


def _slot_groups(loads: np.ndarray, moves: int) -> list[range]:
    """Consecutive slots in groups of about ``moves`` moves (a group passes it by at most one slot)."""
    groups, start, total = [], 0, 0
    for slot, load in enumerate(loads.tolist()):
        if total and total + load > moves:
            groups.append(range(start, slot))
            start, total = slot, 0
        total += load
    if total:
        groups.append(range(start, loads.size))
    return groups


def connected_components(job: Job, seeded: int, edges: int, fine: int,
                         run_tasks: Callable[..., list[Any]]) -> dict[str, Any]:
    """The stage, driven by the tasks' summaries: rounds until no row is left, then settle.

    The producers seeded ``edges`` edges into ``seeded`` rows of round 1, cut into ``fine`` hash
    ranges. ``run_tasks(function, argument_tuples)`` runs one task per tuple (Ray tasks in the job).
    Returns the ``components`` statistics, with the most rows a task read in each round (``largest``).
    """
    budget = job.config.cc_rows_per_task
    slots = FILE_SHARE * tasks_for(seeded, budget)  # moves are at most the nodes, at most round 1's rows
    loads = np.zeros(slots, np.int64)  # moves per slot
    work_rows, work_fine, resolve_rows, resolve_fine = seeded, fine, 0, 1
    number, seq, nodes, first, finished, resolving, replies, final_rows = 1, 0, 0, 0, False, False, 0, 0
    largest: list[int] = []
    while work_rows or resolving:
        contracts = min(tasks_for(work_rows, budget), work_fine) if work_rows else 0
        resolves = min(tasks_for(resolve_rows, budget), resolve_fine) if resolving else 0
        rnd = Round(number, work_fine, resolve_fine, FINE * contracts, FINE * (contracts + resolves), slots,
                    contracts == 1)
        records = run_tasks(round_task, [(job, rnd, "contract", i, contracts, seq + i) for i in range(contracts)]
                            + [(job, rnd, "resolve", i, resolves, seq + contracts + i) for i in range(resolves)],
                            receives=[cc_work(number), cc_resolve(number)])
        contracted, resolved = records[:contracts], records[contracts:]
        for i, record in enumerate(resolved):
            for sub, size in enumerate(_files(record["moves"], budget)):
                loads[_requester((seq + contracts + i) * FILES + sub, slots) >> 32] += size
        seq += contracts + resolves
        largest.append(max(r["rows"] for r in records))
        first, finished = first or contracts, finished or rnd.finish
        nodes += sum(r["done"] for r in contracted)
        replies += sum(r["replies"] for r in resolved)
        final_rows = contracted[0]["done"] if rnd.finish else final_rows
        moved = sum(r["moved"] for r in contracted)
        requests = sum(r["requests"] for r in resolved)
        work_rows = sum(r["sent"] for r in contracted)
        resolve_rows = requests + (0 if rnd.finish else moved + sum(r["done"] for r in contracted))
        resolving = moved > 0 or (requests > 0 and not finished)
        work_fine, resolve_fine, number = rnd.next_work_fine, rnd.next_resolve_fine, number + 1
    # a settle task also reads the replies to its moves (counted only in total) and the final labels
    room = max(1, budget - final_rows) * loads.sum() // max(1, loads.sum() + replies)
    groups = _slot_groups(loads, max(1, room))
    settled = run_tasks(settle_task, [(job, slot_range, finished, seq + i) for i, slot_range in enumerate(groups)],
                        receives=[CC_SETTLE])
    if settled:
        largest.append(max(r["rows"] for r in settled))
    nodes += sum(r["moves"] for r in settled)
    return {"rounds": len(largest), "edges": edges, "nodes": nodes, "partitions": first, "largest": largest}
