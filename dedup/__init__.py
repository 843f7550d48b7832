"""gristmill dedup: exact and MinHash near-duplicate detection as a plain library (no Ray, no I/O).

See docs/DEDUP.md for the normalisation steps, shingles, hashes, the band choice and the survivor
policy.
"""

from .cluster import Survivors, UnionFind, choose_representatives, connected_components, survivors
from .core import STATUSES, DedupResult, deduplicate
from .lsh import (
    UNVERIFIED_WEIGHTS,
    VERIFIED_WEIGHTS,
    band_hashes,
    bucket_edges,
    choose_bands,
    estimated_jaccard,
    optimal_bands,
    s_curve,
    verify_edges,
)
from .minhash import DEFAULT_SEED, MERSENNE_61, SENTINEL, MinHasher
from .normalize import NO_SPACE_RANGES, NormalizeOptions, content_hash, content_hashes, normalize

__all__ = [
    "DEFAULT_SEED",
    "MERSENNE_61",
    "NO_SPACE_RANGES",
    "SENTINEL",
    "UNVERIFIED_WEIGHTS",
    "VERIFIED_WEIGHTS",
    "STATUSES",
    "DedupResult",
    "MinHasher",
    "NormalizeOptions",
    "Survivors",
    "UnionFind",
    "band_hashes",
    "bucket_edges",
    "choose_bands",
    "choose_representatives",
    "connected_components",
    "content_hash",
    "content_hashes",
    "deduplicate",
    "estimated_jaccard",
    "normalize",
    "optimal_bands",
    "s_curve",
    "survivors",
    "verify_edges",
]
