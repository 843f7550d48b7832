"""Stage ``exact``: one survivor per content hash, in two phases, so a text copied 10^8 times never
puts its copies in one task (``gristmill.dedup.survivors``: the best of the bests is the best of all).

- Map, per split (and ``--against`` index file): the split's best row of each content hash and how
  many rows have it, shuffled by hash (``exact_in``): at most one row per (split, hash).
- Reduce, per hash partition: the survivor and the count of every hash; each (hash, split) row of a
  duplicated text goes back to its split with them (``exact_out``), and a split that holds copies
  is named by survivor key (``exact_by_rep``), where :func:`exact_clusters` later gives the copies
  the final cluster of their survivor.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.pipeline.format.sorted_parquet import range_partition
from gristmill.pipeline.job.datasets import (
    CLUSTER_OF_SCHEMA,
    CLUSTERED_SURVIVORS,
    DOCS,
    EXACT_BY_REP,
    EXACT_BY_REP_SCHEMA,
    EXACT_CLUSTERS,
    EXACT_CLUSTERS_DONE,
    EXACT_DONE,
    EXACT_IN,
    EXACT_IN_SCHEMA,
    EXACT_MAP_DONE,
    EXACT_OUT,
    EXACT_OUT_SCHEMA,
    SIGNATURES,
    partition_name,
    split_name,
    with_survivor_columns,
)
from gristmill.pipeline.job.earlier import exact_rows, shuffled_indices
from gristmill.pipeline.job.tasks import Job, map_splits, route_by_split, run_once
from gristmill.pipeline.job.workdir import partition_of

_NIBBLE = np.zeros(256, np.uint8)
_NIBBLE[np.frombuffer(b"0123456789abcdef", np.uint8)] = np.arange(16, dtype=np.uint8)
HASH_DIGITS = 32  # a content hash: xxh3-128 in lowercase hex (dedup.content_hashes)


def _hash_partition(hashes: pa.Array | pa.ChunkedArray, num_partitions: int) -> np.ndarray:
    """The partition of each content hash: its first 64 bits modulo the partitions, read from the
    string column's bytes without a Python loop."""
    array = hashes.combine_chunks() if isinstance(hashes, pa.ChunkedArray) else hashes
    if len(array) == 0:
        return np.zeros(0, np.int64)
    offsets = np.frombuffer(array.buffers()[1], np.int32)[array.offset: array.offset + len(array) + 1]
    if not (np.diff(offsets) == HASH_DIGITS).all():
        raise ValueError(f"content hashes must be {HASH_DIGITS} hex digits")
    digits = np.frombuffer(array.buffers()[2], np.uint8)[offsets[0]:offsets[-1]].reshape(-1, HASH_DIGITS)
    nibbles = _NIBBLE[digits[:, :16]]
    prefix = np.ascontiguousarray((nibbles[:, 0::2] << 4) | nibbles[:, 1::2]).view(">u8").ravel()
    return range_partition(prefix, num_partitions)  # by range: a sorted earlier index is read in part


def _best_per_hash(table: pa.Table, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``gristmill.dedup.survivors`` by content hash: the best row of each distinct hash, each row's best row,
    and each row's summed weight. Ties go to the earlier row (callers keep key order)."""
    from gristmill.dedup.cluster import survivors

    labels = pc.dictionary_encode(table["content_hash"].combine_chunks()).indices.to_numpy()
    chosen = survivors(labels, table["length"].to_numpy(), table["id"],
                       priority=table["existing"].to_numpy(zero_copy_only=False), weights=weights,
                       preference=table["prefer"].to_numpy())
    # the labels are 0..G-1, all present, so chosen's arrays are indexed by label
    return chosen.row, chosen.row[labels], chosen.weight[labels]


def exact_map(job: Job, split_index: int, partitions: int) -> dict[str, Any]:
    """Map, once: the split's best row and row count per content hash, to the partition of the hash.

    An ``--against`` index file's rows (written as its signatures by ``read``) are ``existing``: they
    win their exact group.
    """

    def compute() -> dict[str, Any]:
        existing = split_index < len(job.index_files)
        if existing:
            table = with_survivor_columns(job.work.read_table(SIGNATURES.file(split_index),
                                                              ["content_hash", "key", "id", "length"]))
        else:
            table = job.work.read_table(DOCS.file(split_index), ["content_hash", "key", "id", "length", "prefer",
                                                                 "domain"])
        table = table.append_column("existing", pa.array(np.full(table.num_rows, existing), pa.bool_()))
        best, _, count = _best_per_hash(table, np.ones(table.num_rows, np.int64))
        rows = table.take(pa.array(best)).append_column("count", pa.array(count[best], pa.int64()))
        rows = rows.select(EXACT_IN_SCHEMA.names)
        job.work.write_partitioned(EXACT_IN, split_name(split_index), rows,
                                   _hash_partition(rows["content_hash"], partitions), partitions)
        return {"rows": rows.num_rows}

    return run_once(job.work, EXACT_MAP_DONE.split(split_index), compute)


def exact_partition(job: Job, part: int, partitions: int) -> dict[str, Any]:
    """Reduce, once: each duplicated hash's survivor and count, to every split holding the text."""

    def compute() -> dict[str, Any]:
        table = job.work.read_partition(EXACT_IN, part, EXACT_IN_SCHEMA)
        earlier, earlier_bytes = exact_rows(job, table["content_hash"])  # --against: the matching rows only
        table = pa.concat_tables([with_survivor_columns(earlier), table]).sort_by("key")
        keys = table["key"].to_numpy()
        count = table["count"].to_numpy()
        best, rep, total = _best_per_hash(table, count)
        duplicated = total > 1
        ids = table["id"].combine_chunks() if table.num_rows else pa.array([], pa.string())
        out = pa.table({
            "content_hash": table["content_hash"], "key": pa.array(keys, pa.int64()),
            "rep_key": pa.array(keys[rep], pa.int64()), "rep_id": ids.take(pa.array(rep)),
            "copies": pa.array(total, pa.int64()), "rep_domain": table["domain"].take(pa.array(rep)),
        }, schema=EXACT_OUT_SCHEMA).filter(pa.array(duplicated))
        route_by_split(job, EXACT_OUT, part, out)
        # the splits holding a copy (not only the survivor), by survivor key: see exact_clusters
        holds_copy = duplicated & ((count > 1) | (keys != keys[rep]))
        by_rep = pa.table({"key": keys[holds_copy], "rep_key": keys[rep][holds_copy]}, schema=EXACT_BY_REP_SCHEMA)
        job.work.write_partitioned(EXACT_BY_REP, partition_name(part), by_rep,
                                   partition_of(by_rep["rep_key"].to_numpy(), partitions), partitions)
        return {"duplicates": int((total[best] - 1).sum()), "earlier_bytes": earlier_bytes}

    return run_once(job.work, EXACT_DONE.partition(part), compute)


def exact_of(job: Job, split_index: int, hashes: pa.ChunkedArray | pa.Array) -> pa.Table:
    """The exact group of each of a split's documents, given their content ``hashes``: ``rep_key``,
    ``rep_id``, ``copies`` (the group's size) and ``rep_domain``, null for a text no other document has."""
    groups = job.work.read_partition(EXACT_OUT, split_index, EXACT_OUT_SCHEMA)
    where = pc.index_in(hashes, value_set=groups["content_hash"].combine_chunks())
    return groups.select(["rep_key", "rep_id", "copies", "rep_domain"]).take(where)


def exact_clusters(job: Job, part: int) -> dict[str, Any]:
    """After ``clusters``, once per survivor-key partition: an exact group whose survivor ended in a
    near cluster gives that cluster's id and size to every split holding copies of it (``exact_clusters``).

    Both sides arrive by survivor key (``exact_by_rep`` from the exact reducers, ``clustered_survivors``
    from the clusters reducers), so no split sends to another split: one file per task either way.
    """

    def compute() -> dict[str, Any]:
        holders = job.work.read_partition(EXACT_BY_REP, part, EXACT_BY_REP_SCHEMA)
        clustered = job.work.read_partition(CLUSTERED_SURVIVORS, part, CLUSTER_OF_SCHEMA)
        where = pc.index_in(holders["rep_key"], value_set=clustered["key"].combine_chunks())
        holders = holders.filter(where.is_valid())
        where = where.drop_null()
        out = holders
        for name in ("cluster_id", "cluster_size", "rep_domain"):
            out = out.append_column(name, clustered[name].take(where))
        route_by_split(job, EXACT_CLUSTERS, part, out)
        return {"groups": out.num_rows}

    return run_once(job.work, EXACT_CLUSTERS_DONE.partition(part), compute)


def run_exact(job: Job, partitions: int, run_tasks: Callable[..., list[Any]]) -> list[dict[str, Any]]:
    """The stage: the map over every split (index files included), then one reducer per partition."""
    map_splits(lambda j, i: exact_map(j, i, partitions), job, shuffled_indices(job))
    return run_tasks(exact_partition, [(job, p, partitions) for p in range(partitions)], receives=[EXACT_IN])
