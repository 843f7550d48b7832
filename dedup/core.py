"""In-memory deduplication of a batch that fits one process: exact, then MinHash near-duplicates."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .cluster import choose_representatives, connected_components
from .lsh import (
    UNVERIFIED_WEIGHTS,
    VERIFIED_WEIGHTS,
    band_hashes,
    bucket_edges,
    estimated_jaccard,
    optimal_bands,
    verify_edges,
)
from .minhash import DEFAULT_SEED, MinHasher
from .normalize import (
    DEFAULT_NORMALIZE,
    NormalizeOptions,
    Texts,
    as_strings,
    fold_prepared,
    hashes_of_folded,
    prefold,
    utf8_batch,
)

STATUSES = ("kept", "exact_duplicate", "near_duplicate")


@dataclass(frozen=True)
class DedupResult:
    """One row per input document, in input order, and run statistics.

    Columns: ``id``, ``content_hash``, ``cluster_id`` (the representative's id), ``cluster_size``,
    ``is_representative``, ``duplicate_of`` (the representative's id, null for kept documents),
    ``similarity`` (estimated Jaccard to the representative; 1.0 for itself and exact copies) and
    ``status`` (one of ``STATUSES``).
    """

    table: pa.Table
    stats: dict[str, Any]


def _ids_array(ids: Any, n: int) -> pa.Array:
    if ids is None:
        return pa.array(np.arange(n, dtype=np.int64))
    array = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else pa.array(ids)
    if len(array) != n:
        raise ValueError(f"{len(array)} ids for {n} documents")
    if array.null_count:
        raise ValueError("ids must not be null")
    if len(array.unique()) != n:
        raise ValueError("ids must be unique")
    return array


def deduplicate(
    texts: Texts,
    ids: Any = None,
    *,
    threshold: float = 0.8,
    num_perm: int = 128,
    ngram: int = 5,
    priority: Any = None,
    verify: bool = True,
    normalize: NormalizeOptions = DEFAULT_NORMALIZE,
    shingle: str = "auto",
    char_ngram: int = 5,
    seed: int = DEFAULT_SEED,
    false_positive_weight: float | None = None,
    false_negative_weight: float | None = None,
) -> DedupResult:
    """Exact dedup by content hash, then MinHash LSH among the exact-unique documents.

    Candidate pairs come from LSH buckets, bands x rows chosen by ``optimal_bands`` (without explicit
    weights: ``VERIFIED_WEIGHTS``, leaning towards recall, when ``verify`` is on, else balanced);
    with ``verify`` only pairs whose estimated Jaccard reaches ``threshold`` are linked. Linked
    documents form clusters (connected components) and each cluster keeps one representative, chosen
    by ``choose_representatives`` (highest priority, then longest text, then smallest id).
    """
    raw = as_strings(texts)
    n = len(raw)
    id_array = _ids_array(ids, n)
    id_values = id_array.to_numpy(zero_copy_only=False)
    lengths = np.fromiter((len(t) for t in raw), dtype=np.int64, count=n)
    strings = prefold(raw, normalize)
    data, offsets = utf8_batch(strings)
    hashes = np.asarray(hashes_of_folded(*fold_prepared(data, offsets, normalize)), dtype=object)

    exact_group = np.unique(hashes.astype(str), return_inverse=True)[1].reshape(-1)
    is_exact_rep, exact_rep = choose_representatives(exact_group, lengths, id_values, priority)
    unique = np.flatnonzero(is_exact_rep)
    hasher = MinHasher(num_perm, ngram, shingle, char_ngram, seed, normalize)
    signatures, char_mode = hasher.signatures_prepared(*utf8_batch([strings[i] for i in unique]))

    default_fp, default_fn = VERIFIED_WEIGHTS if verify else UNVERIFIED_WEIGHTS
    bands, rows = optimal_bands(
        threshold,
        num_perm,
        default_fp if false_positive_weight is None else false_positive_weight,
        default_fn if false_negative_weight is None else false_negative_weight,
    )
    keys = np.arange(unique.size, dtype=np.int64)
    left, right = bucket_edges(keys, band_hashes(signatures, bands, rows))
    candidates = int(left.size)
    if verify and left.size:
        close = verify_edges(keys, signatures, left, right, threshold)
        left, right = left[close], right[close]
    unique_label = connected_components(keys, left, right)

    row_of = np.searchsorted(unique, exact_rep)  # each document's signature row (its exact twin's)
    is_rep, rep = choose_representatives(unique_label[row_of], lengths, id_values, priority)
    cluster_size = np.bincount(rep, minlength=n)[rep]
    similarity = estimated_jaccard(signatures[row_of], signatures[row_of[rep]]) if n else np.zeros(0)
    status = np.where(is_rep, "kept", np.where(hashes == hashes[rep], "exact_duplicate", "near_duplicate"))

    rep_ids = id_array.take(pa.array(rep))
    table = pa.table(
        {
            "id": id_array,
            "content_hash": pa.array(hashes.tolist(), type=pa.string()),
            "cluster_id": rep_ids,
            "cluster_size": pa.array(cluster_size, type=pa.int64()),
            "is_representative": pa.array(is_rep),
            "duplicate_of": pa.array(rep_ids.to_pylist(), type=id_array.type, mask=is_rep),
            "similarity": pa.array(similarity, type=pa.float64()),
            "status": pa.array(status.tolist(), type=pa.string()),
        }
    )
    counts = Counter(status.tolist())
    stats: dict[str, Any] = {
        "documents": n,
        **{s: counts.get(s, 0) for s in STATUSES},
        "clusters": int(is_rep.sum()),
        "cluster_sizes": dict(sorted(Counter(cluster_size[is_rep].tolist()).items())),
        "exact_unique": int(unique.size),
        "char_shingle_documents": int(char_mode.sum()),
        "candidate_pairs": candidates,
        "linked_pairs": int(left.size),
        "threshold": threshold,
        "num_perm": num_perm,
        "bands": bands,
        "rows": rows,
    }
    return DedupResult(table, stats)
