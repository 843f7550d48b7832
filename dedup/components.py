"""Connected components as rounds of per-partition tasks, for a job in which no process holds the graph.

Every function here is one task of one round: it reads one partition's rows and returns rows, each
shuffled by the hash of one node (:func:`route`) into the next round's partitions, whose count the
driver sets from the row counts (``ceil(rows / rows_per_partition)``). Labels come out as
``gristmill.dedup.connected_components`` gives them: the smallest document key of each component.

**Names.** A document key ``k`` becomes the node id ``mix(k)``, a bijective 64-bit mix, and "smaller"
below means smaller id: a random priority, so a chain whose keys ascend along it (what a hot LSH
bucket becomes) contracts exactly like a shuffled one. A *floor* travels with each node: the
smallest document key known to be in its component, so the label is still the smallest key.

**A round** (:func:`contract`). Edges ``upper -> lower`` (``upper > lower``, with the floor of
``lower``) sit in the partition of ``upper``; notes ``(node, floor, larger)`` in the partition of
``node``, ``larger`` counting the edges one task sent with ``node`` as their lower end. A task unions
its edges. A node whose every edge is here (it is homed here and all edges naming it as lower end
landed here: always true of a node with no larger neighbour) leaves the graph, pointing at its
component's smallest node here (a *move*). Every other member is linked to that smallest node (a
star) and floors flow to it. No edge row is ever added (a component of ``c`` nodes here has at
least ``c - 1`` rows and sends at most ``c - 1``), and the largest node of every component leaves,
so every component finishes. A node left with no edge is *done*: its floor is its label. When a
round's rows fit one partition, that task sees whole components and finishes them all.

**Rounds.** On a path with random ids, the nodes with no larger neighbour (a third) leave each round
and stars shortcut over them: rows fall about 1.45x a round while each partition holds a thin slice
of a component, faster once a partition holds a large share, and the round whose rows fit one
partition finishes. So the contraction takes about ``log_1.45(rows / rows_per_partition) + 1``
rounds, set by the largest component against one task's budget, not by the corpus. A component
leaves the working set as soon as it is finished: a pair or a star after 2 rounds, a thinly spread
path of ``c`` nodes after about ``log_1.45(c) + 2``. The worst case is a long path (large diameter)
spread thinly over many partitions: a 10^6-node chain at 2^16 rows per partition takes 9
contraction rounds (30 partitions in the first), a 10^6-leaf star 2, a random graph of 10^6 nodes
with mean degree 1.5 or 4 takes 6.

**Labels of moved nodes** (:func:`resolve`, :func:`settle`). A move points at a live node that may
move later. A second layer of tasks runs a round behind: it joins pending requests ``(node,
requester)`` with the previous round's moves and finishes, replies, and forwards each request to
where the node moved. A requester is one file of moves (one round, one partition); it asks once per
distinct target, so a star's million leaves ask their centre once per file. The finishing round's
labels fit one partition, so every settle task takes them whole (:func:`final_replies`) instead of
waiting for a last resolve round; :func:`settle` then follows each file's replies to a label. In
all: the contraction rounds plus one (plus two if no round had to finish everything at once).

**Skew.** Every row is routed by the hash of one node. The producer of the edges (a bucket or verify
task) unions its own edges first (:func:`seed`), so a 10^6-leaf star reaches round 1 as leaf ->
centre rows spread by leaf, and no node has more than one edge row per producer: partial minima
per producer, combined in round 1. From then on a node has at most one edge row and one note per
partition of the round before, and a resolve task at most one request per file for a node. A
partition therefore stays within hash noise of the mean as long as rows per partition far exceed
partitions, with no salting by hand.

Deterministic: the same edges and partition counts give the same rows, moves and labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, TypeVar

import numpy as np

from .cluster import distinct, find_sorted

_U64 = np.uint64
_C1 = 0xFF51AFD7ED558CCD
_C2 = 0xC4CEB9FE1A85EC53
_INV_C1 = pow(_C1, -1, 1 << 64)
_INV_C2 = pow(_C2, -1, 1 << 64)
_ROUTE_SALT = _U64(0x9E3779B97F4A7C15)
_EMPTY_IDS = np.zeros(0, dtype=np.uint64)
_EMPTY_KEYS = np.zeros(0, dtype=np.int64)


def _xorshift(h: np.ndarray) -> np.ndarray:
    return h ^ (h >> _U64(33))  # its own inverse: 33 >= 64 / 2


def _mix(h: np.ndarray, first: int, second: int) -> np.ndarray:
    h = _xorshift(h) * _U64(first)
    return _xorshift(_xorshift(h) * _U64(second))


def node_ids(keys: np.ndarray) -> np.ndarray:
    """Node ids (uint64) of int64 document keys: MurmurHash3's bijective finaliser, a random priority."""
    with np.errstate(over="ignore"):
        return _mix(np.asarray(keys, dtype=np.int64).view(np.uint64), _C1, _C2)


def node_keys(ids: np.ndarray) -> np.ndarray:
    """The document keys (int64) of node ids: the inverse of :func:`node_ids`."""
    with np.errstate(over="ignore"):
        return _mix(np.asarray(ids, dtype=np.uint64), _INV_C2, _INV_C1).view(np.int64)


def route(ids: np.ndarray) -> np.ndarray:
    """The uint64 hash a shuffle partitions a row on, from the node id the row is routed by."""
    with np.errstate(over="ignore"):
        return _mix(np.asarray(ids, dtype=np.uint64) ^ _ROUTE_SALT, _C1, _C2)


def partition_of(routes: np.ndarray, num_partitions: int) -> np.ndarray:
    """Partition of each route hash among ``num_partitions`` contiguous hash ranges.

    Ranges, so a map task can write its rows sorted by hash once and let the driver choose the next
    round's partition count from the row counts afterwards.
    """
    with np.errstate(over="ignore"):
        return ((np.asarray(routes, dtype=np.uint64) >> _U64(32)) * _U64(num_partitions) >> _U64(32)).astype(np.int64)


class Work(NamedTuple):
    """Rows of one round: edges (routed by ``upper``) and notes (routed by ``node``)."""

    upper: np.ndarray  # uint64 node ids, upper > lower
    lower: np.ndarray
    floor: np.ndarray  # int64: the smallest key its sender knew to be in lower's component
    node: np.ndarray  # uint64
    node_floor: np.ndarray  # int64, as ``floor``, for the node
    larger: np.ndarray  # int64: how many edges one task sent with this node as their lower end
    DTYPES = (np.uint64, np.uint64, np.int64, np.uint64, np.int64, np.int64)

    @property
    def rows(self) -> int:
        return int(self.upper.size + self.node.size)


class Fates(NamedTuple):
    """What a round decided: nodes that moved to another node, and nodes done with their label.

    Both are routed by their node, to the resolve task a round behind.
    """

    moved: np.ndarray  # uint64
    to: np.ndarray  # uint64
    done: np.ndarray  # uint64
    label: np.ndarray  # int64
    DTYPES = (np.uint64, np.uint64, np.uint64, np.int64)

    @property
    def rows(self) -> int:
        return int(self.moved.size + self.done.size)


class Requests(NamedTuple):
    """Pending questions "what became of ``node``?" from a requester (a file of moves); routed by node."""

    node: np.ndarray  # uint64
    requester: np.ndarray  # int64
    DTYPES = (np.uint64, np.int64)


class Replies(NamedTuple):
    """Answers to one or more requesters; routed by requester. ``done`` rows carry the label,
    the others the node it moved to."""

    requester: np.ndarray  # int64
    node: np.ndarray  # uint64
    to: np.ndarray  # uint64, where not done
    label: np.ndarray  # int64, where done
    done: np.ndarray  # bool
    DTYPES = (np.int64, np.uint64, np.uint64, np.int64, np.bool_)


Table = TypeVar("Table", Work, Fates, Requests, Replies)


def empty(kind: type[Table]) -> Table:
    """A table of ``kind`` without rows."""
    return kind(*(np.zeros(0, dtype=dtype) for dtype in kind.DTYPES))


def concat(kind: type[Table], parts: Sequence[Table]) -> Table:
    """The rows of ``parts`` (tables of ``kind``) as one table."""
    return kind(*(np.concatenate([part[i] for part in parts] or [np.zeros(0, dtype=dtype)])
                  for i, dtype in enumerate(kind.DTYPES)))


def _components(size: int, upper: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """For ``size`` nodes and edges between their indices: each node's smallest index in its component."""
    from . import _kernels as K  # on first use: see dedup/_constants.py

    parent = np.arange(size, dtype=np.int64)
    K.union_edges(parent, upper, lower)
    return K.roots(parent)  # union_edges keeps the smallest index as root


def _stars(ids: np.ndarray, members: np.ndarray, root: np.ndarray, comp_floor: np.ndarray) -> Work:
    """Edges ``member -> its root`` carrying the root's floor, and per root a note counting them.

    Each member has one root, so the edges need no deduplication.
    """
    lower = root[members]
    roots, count = np.unique(lower, return_counts=True)
    return Work(ids[members], ids[lower], comp_floor[lower], ids[roots], comp_floor[roots], count.astype(np.int64))


def _floors(size: int, root: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """The smallest floor in each node's component, indexed by root."""
    out = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(out, root, floor)
    return out


def seed(left: np.ndarray, right: np.ndarray) -> Work:
    """A producer's candidate edges (int64 document keys) contracted by union-find into round-1 rows.

    Run by each task that writes edges (bucket, verify), so a hot bucket arrives as one star whose
    rows are spread by leaf, not as a chain or a centre holding every edge.
    """
    a, b = node_ids(left), node_ids(right)
    keep = a != b
    ids, index = np.unique(np.concatenate([a[keep], b[keep]]), return_inverse=True)
    upper, lower = np.split(index, 2)
    root = _components(ids.size, upper, lower)
    members = np.flatnonzero(root != np.arange(ids.size))
    return _stars(ids, members, root, _floors(ids.size, root, node_keys(ids)))


def contract(work: Work, finish: bool) -> tuple[Work, Fates]:
    """One task of one round: this partition's rows -> the rows it sends on, and the fates it decided.

    ``finish`` when the round has one partition: its components are whole, so all of them end here.
    """
    edges = work.upper.size
    ids, index = np.unique(np.concatenate([work.upper, work.lower, work.node]), return_inverse=True)
    up, low, note = np.split(index, [edges, 2 * edges])
    own = node_keys(ids)
    floor = own.copy()
    np.minimum.at(floor, low, work.floor)
    np.minimum.at(floor, note, work.node_floor)
    root = _components(ids.size, up, low)
    comp_floor = _floors(ids.size, root, floor)
    if finish:
        return empty(Work), Fates(_EMPTY_IDS, _EMPTY_IDS, ids, comp_floor[root])
    homed = np.zeros(ids.size, dtype=bool)  # its notes and the edges it is the upper end of are here
    homed[up] = homed[note] = True
    in_edge = np.zeros(ids.size, dtype=bool)
    in_edge[up] = in_edge[low] = True
    larger = np.bincount(note, weights=work.larger, minlength=ids.size)
    whole = homed & (np.bincount(low, minlength=ids.size) >= larger)  # every edge of it is here
    is_root = root == np.arange(ids.size)
    leaving = in_edge & whole & ~is_root
    done = ~in_edge & homed & (larger == 0)  # nothing left to connect: the floor is the label
    star = np.flatnonzero(in_edge & ~leaving & ~is_root)
    # floors that no edge carries on: of a root only left nodes moved to (it must get a note, so that
    # it is decided later and its requests answered), and of a live node with no edge here
    fed = distinct(root[leaving])
    fed = fed[~find_sorted(distinct(root[star]), fed)[1]]
    idle = np.flatnonzero(~in_edge & homed & (larger > 0) & (floor < own))
    kept = np.concatenate([fed, idle])
    notes = Work(_EMPTY_IDS, _EMPTY_IDS, _EMPTY_KEYS, ids[kept],
                 np.concatenate([comp_floor[fed], floor[idle]]), np.zeros(kept.size, dtype=np.int64))
    return concat(Work, [_stars(ids, star, root, comp_floor), notes]), Fates(ids[leaving], ids[root[leaving]], ids[done], floor[done])


def final_replies(fates: Fates) -> Replies:
    """The fates of a finishing round as replies every settle task can apply after its own.

    A finishing round fits one partition, so its table is small enough to hand to every settle task,
    which saves the resolve round that would otherwise answer for it.
    """
    return Replies(np.zeros(fates.done.size, dtype=np.int64), fates.done,
                   np.zeros(fates.done.size, dtype=np.uint64), fates.label, np.ones(fates.done.size, dtype=bool))


def _unique_requests(node: np.ndarray, asker: np.ndarray) -> Requests:
    """Requests without repeats, sorted by node."""
    if node.size == 0:
        return empty(Requests)
    nodes, node_index = np.unique(node, return_inverse=True)
    askers, asker_index = np.unique(asker, return_inverse=True)
    pairs = distinct(node_index * askers.size + asker_index)
    return Requests(nodes[pairs // askers.size], askers[pairs % askers.size])


def resolve(fates: Fates, requests: Requests, requester: int) -> tuple[Replies, Requests]:
    """One resolve task, a round behind :func:`contract`: answer what the fates decide, pass the rest on.

    ``fates`` are the previous round's rows that route here; their moves are the file ``requester``
    names, which asks what becomes of each distinct target. Requests whose node moved are answered
    and forwarded to the new node; those whose node is done get the label; the others wait. Replies
    go to their requester (for :func:`settle`), requests on to the node's partition a round later.
    """
    moved_order = np.argsort(fates.moved)
    moved, to = fates.moved[moved_order], fates.to[moved_order]
    done_order = np.argsort(fates.done)
    done, label = fates.done[done_order], fates.label[done_order]
    at_move, hit_move = find_sorted(moved, requests.node)
    at_done, hit_done = find_sorted(done, requests.node)
    answered = hit_move | hit_done
    next_node = np.zeros(requests.node.size, dtype=np.uint64)
    next_node[hit_move] = to[at_move[hit_move]]
    final = np.zeros(requests.node.size, dtype=np.int64)
    final[hit_done] = label[at_done[hit_done]]
    replies = Replies(requests.requester[answered], requests.node[answered], next_node[answered],
                      final[answered], hit_done[answered])
    # forwarded requests collapse when their nodes moved to the same node (a star's leaves); waiting
    # ones are unique already, and this file's own targets are unique and asked by it alone
    forwarded = _unique_requests(next_node[hit_move], requests.requester[hit_move])
    targets = distinct(to)
    waiting = ~answered
    return replies, Requests(np.concatenate([forwarded.node, requests.node[waiting], targets]),
                             np.concatenate([forwarded.requester, requests.requester[waiting],
                                             np.full(targets.size, requester, dtype=np.int64)]))


def settle(moved: np.ndarray, to: np.ndarray, replies: Sequence[Replies]) -> np.ndarray:
    """Labels (int64) of one file's moved nodes (``moved -> to``), from all the replies it got.

    A node has one fate, so the replies map each node to the node it moved to or to its label,
    whatever their order; following the moves (pointer jumping) ends at a label.
    """
    _, node, nxt, label, done = concat(Replies, replies)
    order = np.argsort(node)
    node, nxt, label, done = node[order], nxt[order], label[order], done[order]
    pointer = np.arange(node.size)
    at, hit = find_sorted(node, nxt[~done])
    start, found = find_sorted(node, np.asarray(to, dtype=np.uint64))
    if not (hit.all() and found.all()):
        raise ValueError("the replies given do not follow every moved node to a label")
    pointer[~done] = at
    for _ in range(64):  # each jump doubles the distance followed: 2**64 covers any chain of moves
        if done[pointer].all():
            return label[pointer[start]]
        pointer = pointer[pointer]
    raise ValueError("the replies given move nodes in a cycle")
