"""LSH banding: the bands x rows choice, the S-curve, band hashes and candidate pairs.

Signatures are cut into ``bands`` bands of ``rows`` values; two documents become a candidate pair
when all rows of at least one band agree, which for Jaccard similarity J happens with probability
``1 - (1 - J**rows)**bands`` (the S-curve). ``optimal_bands`` picks the pair minimising the weighted
area under the curve below the threshold (false positives) and above it (false negatives), the same
objective as datasketch's ``MinHashLSH``.
"""

from __future__ import annotations

import numpy as np

from .cluster import key_positions

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(128)

# (false positive, false negative) weights. When candidates are verified by their estimated Jaccard a
# false candidate only costs a comparison, while a missed pair is lost for good, so the banding leans
# towards recall; benchmarks/dedup_quality.py measures the effect (docs/BENCHMARKS.md).
VERIFIED_WEIGHTS = (0.1, 0.9)
UNVERIFIED_WEIGHTS = (0.5, 0.5)


def s_curve(bands: int, rows: int, jaccards: np.ndarray | list[float] | float) -> np.ndarray:
    """Probability that a pair with Jaccard similarity J becomes a candidate: 1 - (1 - J**r)**b."""
    j = np.asarray(jaccards, dtype=np.float64)
    return 1.0 - (1.0 - j**rows) ** bands


def _integral(bands: np.ndarray, rows: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Integral of the S-curve of every (bands, rows) pair over [lo, hi] (Gauss-Legendre, 128 nodes)."""
    half = (hi - lo) / 2
    s = half * _NODES + (hi + lo) / 2
    values = 1.0 - (1.0 - s[None, :] ** rows[:, None]) ** bands[:, None]
    return half * (values * _WEIGHTS).sum(axis=1)


def optimal_bands(
    threshold: float,
    num_perm: int,
    false_positive_weight: float = 0.5,
    false_negative_weight: float = 0.5,
) -> tuple[int, int]:
    """The ``(bands, rows)`` with ``bands * rows <= num_perm`` minimising weighted FP + FN probability."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be between 0 and 1 (exclusive), not {threshold}")
    if num_perm < 1:
        raise ValueError(f"num_perm must be at least 1, not {num_perm}")
    pairs = [(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)]
    bands = np.array([p[0] for p in pairs], dtype=np.float64)
    rows = np.array([p[1] for p in pairs], dtype=np.float64)
    false_pos = _integral(bands, rows, 0.0, threshold)
    false_neg = (1.0 - threshold) - _integral(bands, rows, threshold, 1.0)
    error = false_positive_weight * false_pos + false_negative_weight * false_neg
    return pairs[int(np.argmin(error))]  # first minimum: the same order as datasketch


def choose_bands(threshold: float, num_perm: int, verify: bool = True) -> tuple[int, int]:
    """``optimal_bands`` with the weights that suit whether candidates are verified afterwards."""
    return optimal_bands(threshold, num_perm, *(VERIFIED_WEIGHTS if verify else UNVERIFIED_WEIGHTS))


def band_hashes(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """``(n_docs, bands)`` uint64: a hash of each band's rows, salted with the band index."""
    signatures = np.ascontiguousarray(signatures, dtype=np.uint64)
    if signatures.ndim != 2 or bands * rows > signatures.shape[1]:
        raise ValueError(f"{bands} bands x {rows} rows need signatures with at least {bands * rows} columns")
    from . import _kernels as K  # on first use: see dedup/_constants.py

    return K.band_hashes(signatures, bands, rows)


def bucket_edges(keys: np.ndarray, band_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidate edges ``(left, right)`` of int64 keys, ``left < right``, without repeats.

    Within every band, documents with the same band hash are sorted by key and each is linked to the
    next one, so a bucket of m documents gives m - 1 edges (its members end up in one component),
    not m * (m - 1) / 2 pairs.
    """
    keys = np.asarray(keys, dtype=np.int64)
    band_hashes = np.asarray(band_hashes, dtype=np.uint64)
    if band_hashes.ndim != 2 or band_hashes.shape[0] != keys.shape[0]:
        raise ValueError(f"band_hashes must have shape ({keys.shape[0]}, bands), not {band_hashes.shape}")
    lefts, rights = [], []
    for k in range(band_hashes.shape[1]):
        column = band_hashes[:, k]
        order = np.lexsort((keys, column))
        same = column[order[1:]] == column[order[:-1]]
        lefts.append(keys[order[:-1][same]])
        rights.append(keys[order[1:][same]])
    left = np.concatenate(lefts) if lefts else np.zeros(0, np.int64)
    right = np.concatenate(rights) if rights else np.zeros(0, np.int64)
    if left.size == 0:
        return left, right
    order = np.lexsort((right, left))
    left, right = left[order], right[order]
    first = np.ones(left.size, dtype=bool)
    first[1:] = (left[1:] != left[:-1]) | (right[1:] != right[:-1])
    return left[first], right[first]


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Row-wise fraction of equal signature values: the MinHash estimate of Jaccard similarity."""
    sig_a = np.atleast_2d(sig_a)
    sig_b = np.atleast_2d(sig_b)
    if sig_a.shape != sig_b.shape:
        raise ValueError(f"signature shapes differ: {sig_a.shape} and {sig_b.shape}")
    return (sig_a == sig_b).mean(axis=1)


def verify_edges(
    keys: np.ndarray, signatures: np.ndarray, left: np.ndarray, right: np.ndarray, threshold: float
) -> np.ndarray:
    """Mask of the edges whose two documents' estimated Jaccard reaches ``threshold``.

    ``signatures[i]`` belongs to ``keys[i]``; edges name documents by key, as ``bucket_edges`` returns
    them, so a distributed job can verify the edges of whatever documents it holds signatures for.
    """
    keys = np.asarray(keys, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    left_rows = order[key_positions(sorted_keys, left, "left")]
    right_rows = order[key_positions(sorted_keys, right, "right")]
    signatures = np.asarray(signatures)
    return estimated_jaccard(signatures[left_rows], signatures[right_rows]) >= threshold
