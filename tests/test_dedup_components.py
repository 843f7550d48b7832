"""Connected components as per-partition rounds (dedup.components), run by dedup.simulate: labels equal
to dedup.connected_components, at most ten shuffle rounds, balanced partitions in every round,
converged components leaving the working set; and the two-phase survivor choice."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gristmill import dedup
from gristmill.dedup import components
from gristmill.dedup.cluster import _dense_rank, distinct
from gristmill.dedup.simulate import Simulation, simulate_components

MILLION = 1_000_000


def _check(sim: Simulation, left: np.ndarray, right: np.ndarray, rows_per_partition: int,
           max_rounds: int) -> None:
    """Labels as union-find gives them; at most ``max_rounds`` shuffle rounds; in every round and for
    every kind of task, the largest partition at most twice the mean. The mean is the round's rows
    over its partitions, whose count follows the rows (``ceil(rows / rows_per_partition)``), so the
    bound also keeps every task within twice its budget."""
    keys = distinct(np.concatenate([left, right]))
    np.testing.assert_array_equal(sim.keys, keys)
    np.testing.assert_array_equal(sim.labels, dedup.connected_components(keys, left, right))
    assert len(sim.rounds) <= max_rounds
    for number, shuffle_round in enumerate(sim.rounds, 1):
        for kind, rows in shuffle_round._asdict().items():
            if rows.size:
                assert rows.size == -(-rows.sum() // rows_per_partition), (number, kind)
                assert rows.max() <= 2 * rows.mean(), (number, kind, rows.max(), rows.mean())
                assert rows.max() <= 2 * rows_per_partition, (number, kind)


def _contraction_rows(sim: Simulation) -> list[int]:
    return [int(r.contract.sum()) for r in sim.rounds if r.contract.size]


@pytest.mark.parametrize("order", ["shuffled", "ascending"])
def test_a_chain_of_a_million_nodes_takes_ten_rounds(order: str) -> None:
    # ascending keys along the chain are what a hot LSH bucket's edges become
    keys = np.arange(MILLION) if order == "ascending" else np.random.default_rng(1).permutation(MILLION)
    sim = simulate_components(keys[:-1], keys[1:], 1 << 16)
    _check(sim, keys[:-1], keys[1:], 1 << 16, max_rounds=10)
    rows = _contraction_rows(sim)
    assert rows[0] > 29 << 16  # 30 partitions in the first round
    assert all(later < earlier for earlier, later in zip(rows, rows[1:]))  # it shrinks every round
    assert np.unique(sim.labels).tolist() == [0]


@pytest.mark.parametrize("producers", [1, 16])
def test_a_star_of_a_million_leaves_is_spread_by_leaf(producers: int) -> None:
    # one boilerplate text in a hot bucket: one task may hold every edge of it, or every task some
    left = np.full(MILLION - 1, 7, dtype=np.int64)
    right = np.delete(np.arange(MILLION, dtype=np.int64), 7)
    sim = simulate_components(left, right, 1 << 16, producers)
    _check(sim, left, right, 1 << 16, max_rounds=3)
    assert sim.rounds[0].contract.size == 16  # the centre's million edges, balanced over 16 tasks


def test_a_random_graph_with_a_giant_component() -> None:
    rng = np.random.default_rng(2)
    n = 300_000
    left, right = rng.integers(0, n, (2, 3 * n // 4))  # mean degree 1.5
    keep = left != right
    sim = simulate_components(left[keep], right[keep], 1 << 14)
    _check(sim, left[keep], right[keep], 1 << 14, max_rounds=10)


def test_converged_components_leave_the_working_set() -> None:
    rng = np.random.default_rng(3)
    chain = rng.permutation(100_000)
    pairs = (rng.permutation(600_000) + 100_000).reshape(2, -1)  # 300k two-document clusters
    left, right = np.concatenate([chain[:-1], pairs[0]]), np.concatenate([chain[1:], pairs[1]])
    sim = simulate_components(left, right, 1 << 13)
    _check(sim, left, right, 1 << 13, max_rounds=10)
    alone = _contraction_rows(simulate_components(chain[:-1], chain[1:], 1 << 13))
    mixed = _contraction_rows(sim)
    # a pair ends in round 2; from round 3 on only the chain is left, already smaller than at its start
    assert mixed[2] < alone[0] < mixed[0] / 4


def test_a_200k_member_cluster_stays_within_the_task_budget() -> None:
    rng = np.random.default_rng(4)
    keys = rng.permutation(400_000)
    left = np.concatenate([keys[:199_999], keys[200_000::2]])  # a 200k chain, the slowest shape
    right = np.concatenate([keys[1:200_000], keys[200_001::2]])  # and 100k pairs
    sim = simulate_components(left, right, 1 << 14)
    _check(sim, left, right, 1 << 14, max_rounds=10)  # every task under 2 * 2^14 rows


def test_the_same_edges_give_the_same_rounds_and_labels_whatever_the_budget() -> None:
    rng = np.random.default_rng(5)
    left, right = rng.integers(0, 50_000, (2, 40_000))
    keep = left != right
    left, right = left[keep], right[keep]
    first, again = (simulate_components(left, right, 1 << 10) for _ in range(2))
    np.testing.assert_array_equal(first.labels, again.labels)
    assert [[r.tolist() for r in shuffle_round] for shuffle_round in first.rounds] == [
        [r.tolist() for r in shuffle_round] for shuffle_round in again.rounds]
    for budget, producers in ((1 << 6, 3), (1 << 13, None), (1 << 20, 1)):
        np.testing.assert_array_equal(simulate_components(left, right, budget, producers).labels, first.labels)


@settings(max_examples=150, deadline=None)
@given(
    edges=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=80),
    offset=st.sampled_from([0, -(2**62), 2**62]),
    stride=st.integers(1, 3),
    budget=st.integers(1, 40),
    producers=st.integers(1, 4),
)
def test_labels_equal_union_find_on_small_graphs(edges: list[tuple[int, int]], offset: int, stride: int,
                                                 budget: int, producers: int) -> None:
    pairs = np.array([(a, b) for a, b in edges if a != b], dtype=np.int64).reshape(-1, 2) * stride + offset
    if pairs.size == 0:
        return
    sim = simulate_components(pairs[:, 0], pairs[:, 1], budget, producers)
    keys = np.unique(pairs)
    np.testing.assert_array_equal(sim.keys, keys)
    np.testing.assert_array_equal(sim.labels, dedup.connected_components(keys, pairs[:, 0], pairs[:, 1]))


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50))
def test_node_ids_are_a_bijection_of_keys(keys: list[int]) -> None:
    array = np.array(keys, dtype=np.int64)
    np.testing.assert_array_equal(components.node_keys(components.node_ids(array)), array)


def test_routes_spread_consecutive_keys_evenly() -> None:
    ids = components.node_ids(np.arange(100_000))
    counts = np.bincount(components.partition_of(components.route(ids), 7), minlength=7)
    assert counts.size == 7 and counts.min() > 0.95 * counts.mean()


def test_settle_refuses_replies_that_leave_a_moved_node_unlabelled() -> None:
    replies = components.Replies(np.zeros(1, np.int64), np.array([5], np.uint64), np.array([6], np.uint64),
                                 np.zeros(1, np.int64), np.zeros(1, bool))  # 5 moved to 6; 6 never answered
    with pytest.raises(ValueError, match="do not follow every moved node"):
        components.settle(np.array([4], np.uint64), np.array([5], np.uint64), [replies])


@settings(max_examples=100, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 4), st.booleans(), st.integers(1, 3),
                            st.integers(0, 3)), min_size=1, max_size=60),
    with_priority=st.booleans(),
)
def test_two_phase_survivors_equal_the_one_phase_choice(rows: list[tuple[int, int, bool, int, int]],
                                                        with_priority: bool) -> None:
    labels, lengths, priority, copies, split = (np.array(column) for column in zip(*rows))
    ids = np.array([f"doc-{i:03d}" for i in np.random.default_rng(len(rows)).permutation(len(rows))])
    priority = priority if with_priority else None
    # phase 1: per split, the best row of each label and the label's count of documents there
    partial_rows, partial_weights = [], []
    for s in np.unique(split):
        mine = np.flatnonzero(split == s)
        best = dedup.survivors(labels[mine], lengths[mine], ids[mine],
                               None if priority is None else priority[mine], copies[mine])
        partial_rows.append(mine[best.row])
        partial_weights.append(best.weight)
    chosen = np.concatenate(partial_rows)  # one row per (split, label) moves, no member's signature
    # phase 2: the same choice over the partial rows, keyed by label
    final = dedup.survivors(labels[chosen], lengths[chosen], ids[chosen],
                            None if priority is None else priority[chosen], np.concatenate(partial_weights))
    is_rep, rep_index = dedup.choose_representatives(labels, lengths, ids, priority)
    np.testing.assert_array_equal(final.label, np.unique(labels))
    np.testing.assert_array_equal(chosen[final.row], rep_index[is_rep][np.argsort(labels[is_rep])])
    np.testing.assert_array_equal(final.weight, np.bincount(np.unique(labels, return_inverse=True)[1],
                                                            weights=copies).astype(np.int64))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=6), max_size=30), st.integers(0, 30))
def test_ids_rank_in_code_point_order_from_arrow_and_from_python(ids: list[str], split: int) -> None:
    expected = [sorted(set(ids)).index(value) for value in ids]  # Python's str order: code points
    column = pa.chunked_array([pa.array(ids[:split], pa.string()), pa.array(ids[split:], pa.string())])
    assert _dense_rank(column).tolist() == expected
    assert _dense_rank(pa.array(ids, pa.large_string())).tolist() == expected
    if not any(value.endswith("\x00") for value in ids):  # numpy's str drops trailing NULs
        assert _dense_rank(ids).tolist() == expected
