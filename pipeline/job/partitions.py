"""How many partitions each shuffle gets: enough that a reducer holds about ``partition_bytes`` (default
PARTITION_BYTES) of the rows it carries, with no fixed cap, so 5 billion documents get thousands of partitions and a small job one.

The counts follow the documents the read stage found (an upper bound for every later shuffle: exact
survivors, signed documents and clustered ones are at most that many), so they are known before the
first shuffle and the same on every rerun. ``--num-partitions`` sets them all. No count changes the
result: every reducer sorts, and every later reader looks rows up by key.
"""

from __future__ import annotations

from dataclasses import dataclass

from gristmill.pipeline.format.signature_index import IndexParams

PARTITION_BYTES = 128 * 1024 * 1024  # rows a reducer holds, in memory (Arrow) bytes
EXACT_ROW_BYTES = 100  # content hash (32 hex digits), key, id, length, flags
BAND_ROW_BYTES = 16  # band hash and key, one row per band
SIGNED_ROW_BYTES = 16  # key and the like, plus the signature (8 bytes per permutation)


@dataclass(frozen=True)
class Partitions:
    """The partitions of the job's shuffles: by content hash (exact groups, and their copies' final
    clusters by survivor key), by band hash, by key with signatures (verification), by cluster label."""

    exact: int
    buckets: int
    verify: int
    clusters: int


def partitions_for(documents: int, params: IndexParams, override: int | None,
                   partition_bytes: int = PARTITION_BYTES) -> Partitions:
    """The partition counts for a run that read ``documents`` documents (index rows included)."""
    if override is not None:
        return Partitions(override, override, override, override)

    def count(rows: int, row_bytes: int) -> int:
        return max(1, -(-rows * row_bytes // partition_bytes))

    signed_row = SIGNED_ROW_BYTES + 8 * params.num_perm
    return Partitions(exact=count(documents, EXACT_ROW_BYTES),
                      buckets=count(documents * params.bands, BAND_ROW_BYTES),
                      verify=count(documents, signed_row), clusters=count(documents, signed_row))
