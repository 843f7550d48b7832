"""Union-find clustering and survivor choice."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from gristmill import dedup


def test_transitive_chain_becomes_one_cluster_labelled_by_its_smallest_key() -> None:
    keys = np.array([105, 101, 103, 104, 102, 200, 300], dtype=np.int64)
    left = np.array([105, 104, 103, 102], dtype=np.int64)  # 105-104-103-102-101, given backwards
    right = np.array([104, 103, 102, 101], dtype=np.int64)
    labels = dedup.connected_components(keys, left, right)
    assert labels.tolist() == [101, 101, 101, 101, 101, 200, 300]  # 200 and 300 are singletons


def test_no_edges_means_singletons() -> None:
    keys = np.array([3, 1, 2], dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)
    assert dedup.connected_components(keys, empty, empty).tolist() == [3, 1, 2]


def test_labels_do_not_depend_on_edge_order_or_batching() -> None:
    rng = np.random.default_rng(5)
    keys = rng.permutation(np.arange(0, 50_000, 5, dtype=np.int64))
    left = rng.choice(keys, 6000)
    right = rng.choice(keys, 6000)
    whole = dedup.connected_components(keys, left, right)
    order = rng.permutation(6000)
    finder = dedup.UnionFind(keys)
    for part in np.array_split(order, 7):  # edges arriving in seven batches, shuffled, flipped
        finder.union(right[part], left[part])
    np.testing.assert_array_equal(finder.labels(keys), whole)
    # every label is the minimum key of its component
    for label in np.unique(whole)[:50]:
        assert label == keys[whole == label].min()
    np.testing.assert_array_equal(finder.labels(), whole[np.argsort(keys)])


def test_union_find_rejects_unknown_and_repeated_keys() -> None:
    finder = dedup.UnionFind(np.array([1, 2, 3]))
    with pytest.raises(KeyError, match="right holds keys that are not documents, e.g. 9"):
        finder.union(np.array([1]), np.array([9]))
    with pytest.raises(ValueError, match="unique"):
        dedup.UnionFind(np.array([1, 1, 2]))


def test_cluster_spanning_batches() -> None:
    """Signatures from separate batches (as Ray workers make them) cluster like one batch."""
    base = " ".join(f"word{i}" for i in range(300))
    batch_one = [base, "an unrelated document about something else entirely " * 5]
    batch_two = [base.replace("word150", "changed"), "yet another text with its own words " * 5]
    hasher = dedup.MinHasher()
    signatures = np.concatenate([hasher.signatures(batch_one), hasher.signatures(batch_two)])
    keys = np.array([10, 11, 20, 21], dtype=np.int64)
    bands, rows = dedup.optimal_bands(0.8, 128)
    finder = dedup.UnionFind(keys)
    for band in range(bands):  # band by band, as a distributed job would shuffle them
        one_band = dedup.band_hashes(signatures[:, band * rows :], 1, rows)
        finder.union(*dedup.bucket_edges(keys, one_band))
    assert finder.labels(keys).tolist() == [10, 11, 10, 21]


def test_longest_document_wins_then_smallest_id() -> None:
    labels = np.array([7, 7, 7, 8, 8, 9])
    lengths = np.array([10, 30, 30, 5, 5, 1])
    ids = np.array(["c", "b", "a", "z", "y", "x"])
    is_rep, rep = dedup.choose_representatives(labels, lengths, ids)
    assert is_rep.tolist() == [False, False, True, False, True, True]
    assert rep.tolist() == [2, 2, 2, 4, 4, 5]


def test_priority_comes_first_then_the_same_tie_breaks() -> None:
    labels = np.array([1, 1, 1, 1])
    lengths = np.array([100, 10, 10, 50])
    ids = np.array([4, 3, 2, 1])
    priority = np.array([0.5, 2.0, 2.0, 1.0])
    is_rep, rep = dedup.choose_representatives(labels, lengths, ids, priority)
    assert rep.tolist() == [2, 2, 2, 2]  # highest priority (two of them), equal length, smaller id
    _, rep = dedup.choose_representatives(labels, lengths, pa.array(ids), pa.array([0, 0, 0, 1]))
    assert rep.tolist() == [3, 3, 3, 3]
    with pytest.raises(ValueError, match="NaN"):
        dedup.choose_representatives(labels, lengths, ids, np.array([1.0, np.nan, 0, 0]))


def test_choice_does_not_depend_on_input_order() -> None:
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 40, 500)
    lengths = rng.integers(0, 5, 500)  # many length ties
    ids = rng.permutation(500)
    is_rep, rep = dedup.choose_representatives(labels, lengths, ids)
    assert np.unique(labels).size == is_rep.sum()
    chosen = {(labels[i], ids[rep[i]]) for i in range(500)}
    order = rng.permutation(500)
    _, rep2 = dedup.choose_representatives(labels[order], lengths[order], ids[order])
    assert {(labels[order][i], ids[order][rep2[i]]) for i in range(500)} == chosen
    for label, rep_id in chosen:
        members = labels == label
        best = lengths[members].max()
        assert rep_id == ids[members & (lengths == best)].min()
