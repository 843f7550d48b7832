"""Union-find clustering of candidate edges and the choice of one survivor per cluster."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values, by one sort: NumPy 2.4's hashing ``np.unique`` takes seconds per
    million mostly distinct int64 where sorting takes a tenth of one."""
    ordered = np.sort(np.asarray(values))
    keep = np.ones(ordered.size, dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def find_sorted(values: np.ndarray, query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For sorted ``values``: where each query value is (clipped to the last) and whether it is there.

    The queries are searched in sorted order, several times faster on large arrays than in random
    order (and the sort is cheap on queries that come in sorted runs).
    """
    if values.size == 0:
        return np.zeros(query.size, dtype=np.int64), np.zeros(query.size, dtype=bool)
    order = np.argsort(query, kind="stable")
    at = np.empty(query.size, dtype=np.int64)
    at[order] = np.minimum(np.searchsorted(values, query[order]), values.size - 1)
    return at, values[at] == query


def key_positions(sorted_keys: np.ndarray, wanted: np.ndarray, what: str) -> np.ndarray:
    """Positions of ``wanted`` int64 keys in ``sorted_keys``; a missing key is a KeyError naming it."""
    wanted = np.asarray(wanted, dtype=np.int64)
    index, found = find_sorted(sorted_keys, wanted)
    if not found.all():
        raise KeyError(f"{what} holds keys that are not documents, e.g. {int(wanted[~found][0])}")
    return index


class UnionFind:
    """Disjoint sets over a fixed set of int64 document keys, fed with edges batch by batch.

    Edges from several batches (say, each band or each input partition) can be added one after the
    other; ``labels`` then names every key's component by the smallest key in it, whatever the order
    the edges came in.
    """

    def __init__(self, keys: np.ndarray) -> None:
        self._keys = distinct(np.asarray(keys, dtype=np.int64))
        if self._keys.size != np.asarray(keys).size:
            raise ValueError("document keys must be unique")
        self._parent = np.arange(self._keys.size, dtype=np.int64)

    def union(self, left: np.ndarray, right: np.ndarray) -> UnionFind:
        """Merge the sets of ``left[i]`` and ``right[i]`` for every i; returns self."""
        left_index = key_positions(self._keys, left, "left")
        right_index = key_positions(self._keys, right, "right")
        if left_index.shape != right_index.shape:
            raise ValueError(f"left and right differ in length: {left_index.size} and {right_index.size}")
        from . import _kernels as K  # on first use: see dedup/_constants.py
        K.union_edges(self._parent, left_index, right_index)
        return self

    def labels(self, keys: np.ndarray | None = None) -> np.ndarray:
        """The smallest key of each key's component (for ``keys``, default all keys in sorted order)."""
        from . import _kernels as K  # on first use: see dedup/_constants.py

        root_keys = self._keys[K.roots(self._parent)]
        if keys is None:
            return root_keys
        return root_keys[key_positions(self._keys, keys, "keys")]


def connected_components(keys: np.ndarray, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Component label of every key (in the order of ``keys``): the smallest key in its component."""
    return UnionFind(keys).union(left, right).labels(keys)


def _dense_rank(values: np.ndarray | pa.Array | pa.ChunkedArray | list) -> np.ndarray:
    """Ascending rank of each value (equal values share a rank); works for numbers and strings."""
    if isinstance(values, pa.Array | pa.ChunkedArray):
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            # Arrow's order of UTF-8 bytes is the order of code points, as numpy's of str, at 10x the speed
            return pc.rank(values, sort_keys="ascending", tiebreaker="dense").to_numpy().astype(np.int64) - 1
        values = values.to_numpy(zero_copy_only=False)
    values = np.asarray(values)
    if values.dtype == object:
        values = values.astype(str)
    return np.unique(values, return_inverse=True)[1].reshape(-1)


class Survivors(NamedTuple):
    """Per distinct label (ascending): its best row and the summed weight of its rows."""

    label: np.ndarray
    row: np.ndarray  # int64 index into the rows given
    weight: np.ndarray  # int64


def survivors(
    labels: np.ndarray,
    lengths: np.ndarray,
    ids: np.ndarray | pa.Array | list,
    priority: np.ndarray | pa.Array | list | None = None,
    weights: np.ndarray | None = None,
    preference: np.ndarray | None = None,
) -> Survivors:
    """The best row of each label (see :func:`choose_representatives`) and each label's total weight.

    Both phases of a distributed survivor choice call this. Phase 1, per split: the split's best
    row per cluster label, with the count of its members (``weights``: exact copies included). Those
    rows, one per (split, cluster), are shuffled by label; phase 2 calls this again on them, with
    their counts as ``weights``: the best of the bests is the best of all (the order is total on
    distinct ids), and the weights add up to the cluster size. No member's signature moves by label.
    Each member's estimated Jaccard similarity to its representative still needs the
    representative's signature where the member is: phase 2 sends one row per (split, cluster) back,
    the winner's key, id and signature, to each split that sent a phase-1 row for that cluster.
    """
    return _survivors(labels, lengths, ids, priority, weights, preference)[0]


def _survivors(labels: np.ndarray, lengths: np.ndarray, ids: np.ndarray | pa.Array | list,
               priority: np.ndarray | pa.Array | list | None,
               weights: np.ndarray | None,
               preference: np.ndarray | None = None) -> tuple[Survivors, np.ndarray]:
    """:func:`survivors`, and the index of each row's label among the distinct labels."""
    labels = np.asarray(labels)
    n = labels.shape[0]
    lengths = np.asarray(lengths, dtype=np.int64)
    id_rank = _dense_rank(ids)
    if lengths.shape[0] != n or id_rank.shape[0] != n:
        raise ValueError(
            f"labels, lengths and ids differ in length: {n}, {lengths.shape[0]}, {id_rank.shape[0]}"
        )
    sort_keys = [id_rank, -lengths]
    if preference is not None:  # the user's survivor policy: one int64 key, higher wins
        preference = np.asarray(preference, dtype=np.int64)
        if preference.shape[0] != n:
            raise ValueError(f"preference has {preference.shape[0]} values for {n} documents")
        sort_keys.append(~preference)  # ~x = -x - 1 orders descending without overflowing at INT64_MIN
    if priority is not None:
        if isinstance(priority, pa.Array | pa.ChunkedArray):
            priority = priority.to_numpy(zero_copy_only=False)
        priority = np.asarray(priority)
        if priority.dtype.kind == "f" and np.isnan(priority).any() or priority.dtype == object:
            raise ValueError("priority must be numbers without nulls or NaN")
        priority_rank = _dense_rank(priority)
        if priority_rank.shape[0] != n:
            raise ValueError(f"priority has {priority_rank.shape[0]} values for {n} documents")
        sort_keys.append(-priority_rank)
    unique, label_rank = np.unique(labels, return_inverse=True)
    label_rank = label_rank.reshape(-1)
    sort_keys.append(label_rank)
    order = np.lexsort(sort_keys)
    first = np.ones(n, dtype=bool)
    first[1:] = label_rank[order][1:] != label_rank[order][:-1]
    weights = np.ones(n, dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    if weights.shape[0] != n:
        raise ValueError(f"weights has {weights.shape[0]} values for {n} documents")
    total = np.bincount(label_rank, weights=weights, minlength=unique.size).astype(np.int64)
    return Survivors(unique, order[first], total), label_rank


def choose_representatives(
    labels: np.ndarray,
    lengths: np.ndarray,
    ids: np.ndarray | pa.Array | list,
    priority: np.ndarray | pa.Array | list | None = None,
    preference: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One survivor per cluster: ``(is_representative, index of each row's representative)``.

    The survivor has the highest ``priority`` (when given: an earlier corpus's rows), then the highest
    ``preference`` (when given: the int64 key of the user's survivor policy), then the greatest
    length, then the smallest id, so the choice depends only on the data, never on input order or
    partitioning.
    """
    chosen, label_rank = _survivors(labels, lengths, ids, priority, None, preference)
    rep_index = chosen.row[label_rank]
    return rep_index == np.arange(rep_index.size), rep_index
