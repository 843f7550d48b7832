"""Banding choice, the S-curve, band hashes, bucket edges and the Jaccard estimate."""

from __future__ import annotations

import numpy as np
import pytest
from datasketch.lsh import _optimal_param

from gristmill import dedup


@pytest.mark.parametrize("num_perm", [32, 128, 256])
@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9, 0.95])
def test_optimal_bands_agrees_with_datasketch(num_perm: int, threshold: float) -> None:
    bands, rows = dedup.optimal_bands(threshold, num_perm)
    assert bands * rows <= num_perm
    assert (bands, rows) == _optimal_param(threshold, num_perm, 0.5, 0.5)


def test_weights_move_the_choice_in_the_expected_direction() -> None:
    balanced = dedup.optimal_bands(0.8, 128)
    recall_first = dedup.optimal_bands(0.8, 128, false_positive_weight=0.1, false_negative_weight=0.9)
    precision_first = dedup.optimal_bands(0.8, 128, false_positive_weight=0.9, false_negative_weight=0.1)
    assert recall_first == _optimal_param(0.8, 128, 0.1, 0.9)
    at_threshold = [dedup.s_curve(*choice, 0.8) for choice in (precision_first, balanced, recall_first)]
    assert at_threshold == sorted(at_threshold)


def test_verified_candidates_get_recall_leaning_bands() -> None:
    verified = dedup.choose_bands(0.8, 128, verify=True)
    unverified = dedup.choose_bands(0.8, 128, verify=False)
    assert verified == dedup.optimal_bands(0.8, 128, *dedup.VERIFIED_WEIGHTS)
    assert unverified == dedup.optimal_bands(0.8, 128) == _optimal_param(0.8, 128, 0.5, 0.5)
    assert dedup.s_curve(*verified, 0.8) > dedup.s_curve(*unverified, 0.8)
    assert dedup.s_curve(*verified, 0.85) > 0.95


def test_optimal_bands_rejects_impossible_arguments() -> None:
    with pytest.raises(ValueError, match="threshold"):
        dedup.optimal_bands(1.0, 128)
    with pytest.raises(ValueError, match="num_perm"):
        dedup.optimal_bands(0.8, 0)


def test_s_curve_values() -> None:
    jaccards = np.round(np.arange(0.5, 0.951, 0.05), 2)
    curve = dedup.s_curve(9, 13, jaccards)
    np.testing.assert_allclose(curve, [1 - (1 - j**13) ** 9 for j in jaccards], rtol=1e-12)
    assert np.all(np.diff(curve) > 0)
    assert curve[0] < 0.002 and curve[-1] > 0.998
    assert dedup.s_curve(1, 1, [0.0, 1.0]).tolist() == [0.0, 1.0]


def test_band_hashes_equal_exactly_when_the_band_rows_are_equal() -> None:
    rng = np.random.default_rng(0)
    signatures = rng.integers(0, 2**61 - 1, size=(4, 12), dtype=np.uint64)
    signatures[1, :4] = signatures[0, :4]  # band 0 shared by documents 0 and 1
    signatures[2, 8:] = signatures[0, 8:]  # band 2 shared by documents 0 and 2
    hashes = dedup.band_hashes(signatures, bands=3, rows=4)
    assert hashes.shape == (4, 3) and hashes.dtype == np.uint64
    equal = hashes[:, None, :] == hashes[None, :, :]
    assert equal[0, 1].tolist() == [True, False, False]
    assert equal[0, 2].tolist() == [False, False, True]
    assert not equal[0, 3].any()
    np.testing.assert_array_equal(dedup.band_hashes(signatures.copy(), 3, 4), hashes)


def test_band_index_is_part_of_the_hash() -> None:
    row = np.arange(8, dtype=np.uint64)
    same_values = np.concatenate([row[:4], row[:4]])[None, :]
    hashes = dedup.band_hashes(same_values, bands=2, rows=4)
    assert hashes[0, 0] != hashes[0, 1]


def test_band_hashes_need_enough_columns() -> None:
    with pytest.raises(ValueError, match="at least 130 columns"):
        dedup.band_hashes(np.zeros((2, 128), np.uint64), 10, 13)


def test_bucket_edges_link_consecutive_members_only() -> None:
    keys = np.array([50, 10, 40, 20, 30, 60], dtype=np.int64)
    band = np.array([[7, 1], [7, 2], [7, 3], [7, 4], [9, 5], [9, 5]], dtype=np.uint64)
    left, right = dedup.bucket_edges(keys, band)
    # bucket 7 in band 0 holds keys 50, 10, 40, 20: three edges in key order, not six pairs;
    # bucket 9 in band 0 and bucket 5 in band 1 both give 30-60, reported once
    assert list(zip(left.tolist(), right.tolist(), strict=True)) == [(10, 20), (20, 40), (30, 60), (40, 50)]


def test_bucket_edges_grow_linearly_with_bucket_size() -> None:
    keys = np.arange(10_000, dtype=np.int64)
    left, right = dedup.bucket_edges(keys, np.zeros((10_000, 3), dtype=np.uint64))
    assert left.size == 9_999 and np.all(right - left == 1)
    assert dedup.bucket_edges(keys[:0], np.zeros((0, 3), np.uint64))[0].size == 0


def test_estimated_jaccard_is_the_fraction_of_equal_values() -> None:
    a = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=np.uint64)
    b = np.array([[1, 2, 0, 0], [5, 6, 7, 8]], dtype=np.uint64)
    assert dedup.estimated_jaccard(a, b).tolist() == [0.5, 1.0]
    assert dedup.estimated_jaccard(a[0], b[0]).tolist() == [0.5]
    with pytest.raises(ValueError, match="shapes differ"):
        dedup.estimated_jaccard(a, b[:, :3])


def test_candidate_rate_follows_the_s_curve() -> None:
    """Pairs of signatures whose rows agree with probability J become candidates at s_curve(J)."""
    rng = np.random.default_rng(1)
    bands, rows, pairs = 9, 13, 4000
    for jaccard in (0.6, 0.75, 0.85):
        first = rng.integers(0, 2**61 - 1, size=(pairs, 128), dtype=np.uint64)
        second = np.where(rng.random((pairs, 128)) < jaccard, first, first + np.uint64(1))
        hashes = dedup.band_hashes(np.concatenate([first, second]), bands, rows)
        keys = np.arange(2 * pairs, dtype=np.int64)
        left, right = dedup.bucket_edges(keys, hashes)
        rate = np.count_nonzero(right - left == pairs) / pairs
        expected = dedup.s_curve(bands, rows, jaccard)
        assert abs(rate - expected) < 4 * np.sqrt(expected * (1 - expected) / pairs) + 1e-3


def test_verify_edges_finds_signatures_by_key() -> None:
    rng = np.random.default_rng(4)
    signatures = rng.integers(0, 2**61 - 1, size=(5, 10), dtype=np.uint64)
    signatures[3, :8] = signatures[0, :8]  # 0.8 similar
    signatures[4, :5] = signatures[1, :5]  # 0.5 similar
    keys = np.array([40, 10, 30, 20, 50], dtype=np.int64)  # row i belongs to keys[i], unsorted
    left, right = np.array([20, 10, 30]), np.array([40, 50, 40])
    assert dedup.verify_edges(keys, signatures, left, right, 0.8).tolist() == [True, False, False]
    assert dedup.verify_edges(keys, signatures, left, right, 0.5).tolist() == [True, True, False]
    assert dedup.verify_edges(keys, signatures, left[:0], right[:0], 0.8).size == 0
    with pytest.raises(KeyError, match="right holds keys that are not documents, e.g. 99"):
        dedup.verify_edges(keys, signatures, left, np.array([40, 99, 40]), 0.8)
