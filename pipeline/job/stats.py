"""The job's statistics, summed by tasks: the driver adds up only a few totals.

Per split, the write task (:func:`split_stats`) returns the split's totals (documents by outcome,
bytes, rejects by kind) and sends one row per breakdown key with its counts to the statistics shuffle
(``STATS_IN``, by range of a hash of (breakdown, key): one partitioned file per split). Then one task
per range (:func:`reduce_stats`; :func:`stats_partitions` of them, fixed before ``write`` from the rows
read) receives its range of every split through the job's exchange, like every other shuffle (on an
object store S GETs in all, whatever the ranges: the stage's requests are O(S + P), where reading a
range of every split's table was S x P), sums each key, writes one file of the statistics table beside
the corpus (``_stats/``, ``gristmill.pipeline.format.stats_table``) and returns its range's top keys. The driver
merges those top keys (at most ``TOP_KEYS`` per range and breakdown) and :func:`final_stats` builds
what the manifest records: totals, the top keys of each breakdown and how many keys each has. A
breakdown with 50,000 domains thus never passes through the driver or the manifest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from gristmill.pipeline.format import REJECT_KINDS
from gristmill.pipeline.format.schemas import STATS_SCHEMA
from gristmill.pipeline.format.signature_index import IndexParams
from gristmill.pipeline.format.sorted_parquet import range_partition
from gristmill.pipeline.format.stats_table import BREAKDOWNS, COUNTS, LOST_TO, TOP_KEYS, as_breakdown, rank
from gristmill.pipeline.job.config import DedupConfig
from gristmill.pipeline.job.datasets import REJECTS, STATS_DONE, STATS_IN, split_name, stats_file
from gristmill.pipeline.job.outcomes import EXACT_DUPLICATE, JOB_STATUSES, KEPT, NEAR_DUPLICATE
from gristmill.pipeline.job.tasks import Job, run_once
from gristmill.pipeline.job.workdir import WorkDir

BYTES_PER_TOKEN = 4  # the approximate-token statistic: UTF-8 bytes / 4
STATS_ROWS_PER_TASK = 2_000_000  # most split-table rows one reduce task sums
_SOURCES = (("by_source", "origin"), ("by_domain", "domain"), ("by_language", "language"))


def stats_partitions(documents: int, reject_rows: int) -> int:
    """Reduce tasks of the stage, fixed before ``write`` sends to them: a split's table has at most one
    row per breakdown per document (the rejects' rows add to ``by_source``), so none sums more than
    STATS_ROWS_PER_TASK rows."""
    return max(1, -(-(documents * len(BREAKDOWNS) + reject_rows) // STATS_ROWS_PER_TASK))


def split_stats(job: Job, split_index: int, docs: pa.Table, status: np.ndarray, cluster_size: np.ndarray,
                lengths: np.ndarray, survivor_domain: np.ndarray, kept_lengths: np.ndarray,
                parts: int) -> dict[str, Any]:
    """The split's totals for the driver (``lengths``: UTF-8 bytes per document as read, ``kept_lengths``
    as written, once ``--spans`` cut; ``survivor_domain``: the domain of each removed document's
    survivor); its breakdown table goes to the ``parts`` reduce tasks through ``STATS_IN``."""
    rejects = job.work.read_table(REJECTS.file(split_index))
    totals: dict[str, Any] = {name: int(np.count_nonzero(status == i)) for i, name in enumerate(JOB_STATUSES)}
    totals["bytes_in"] = int(lengths.sum())
    totals["bytes_kept"] = int(kept_lengths[status == KEPT].sum())
    totals["bytes_removed"] = int(lengths[status != KEPT].sum())
    kinds = rejects.group_by("kind").aggregate([("count", "sum")]).to_pylist()
    by_kind = {row["kind"]: int(row["count_sum"]) for row in kinds}
    totals["rejected"] = {kind: by_kind.get(kind, 0) for kind in REJECT_KINDS}
    totals["rejected_bytes"] = int(pc.sum(rejects["bytes"]).as_py() or 0)
    table = _split_table(docs, status, cluster_size, lengths, kept_lengths, rejects, survivor_domain)
    hashes = np.array([xxhash.xxh3_64_intdigest(f"{b}\0{k}".encode()) for b, k in zip(
        table["breakdown"].to_pylist(), table["key"].to_pylist(), strict=True)], np.uint64)
    job.work.write_partitioned(STATS_IN, split_name(split_index), table, range_partition(hashes, parts), parts)
    return {"totals": totals}


def _split_table(docs: pa.Table, status: np.ndarray, cluster_size: np.ndarray, lengths: np.ndarray,
                 kept_lengths: np.ndarray, rejects: pa.Table, survivor_domain: np.ndarray) -> pa.Table:
    """One row per (breakdown, key) of the split with its counts. A document removed for its spans counts in ``input`` only (no breakdown column names its outcome)."""
    n = docs.num_rows
    zeros = np.zeros(n, np.int64)
    kept = (status == 0).astype(np.int64)
    counts = {"input": np.ones(n, np.int64), "kept": kept, "exact_duplicate": (status == 1).astype(np.int64),
              "near_duplicate": (status == 2).astype(np.int64), "rejected": zeros,
              "input_bytes": lengths.astype(np.int64), "kept_bytes": kept_lengths * kept, "rejected_bytes": zeros}
    parts = []
    for breakdown, column in _SOURCES:
        parts.append(_rows(breakdown, _named(docs[column]), counts))
    removed = (status == EXACT_DUPLICATE) | (status == NEAR_DUPLICATE)  # lost_to: "loser domain -> survivor domain"
    pairs = pc.binary_join_element_wise(_named(docs["domain"].filter(pa.array(removed))),
                                        _named(pa.array(survivor_domain[removed], pa.string())), " -> ")
    parts.append(_rows(LOST_TO, pairs, {name: values[removed] for name, values in counts.items()}))
    clustered = cluster_size > 1  # cluster sizes count clusters as ``kept``: one kept document each
    parts.append(_rows("cluster_sizes", pa.array(cluster_size[clustered].astype(str)),
                       {name: values[clustered] for name, values in counts.items()}))
    rejected = rejects["count"].to_numpy()
    none = np.zeros(len(rejected), np.int64)
    parts.append(_rows("by_source", rejects["origin"], {
        "input": rejected, "kept": none, "exact_duplicate": none, "near_duplicate": none, "rejected": rejected,
        "input_bytes": none, "kept_bytes": none, "rejected_bytes": rejects["bytes"].to_numpy()}))
    return _summed(parts)


def _named(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Keys of a breakdown: a missing or empty one is ``unknown``."""
    values = pc.fill_null(values, "")
    return pc.if_else(pc.equal(values, ""), "unknown", values)


def _rows(breakdown: str, keys: pa.Array | pa.ChunkedArray, counts: Mapping[str, np.ndarray]) -> pa.Table:
    columns = {"breakdown": pa.array(np.full(len(keys), breakdown, object), pa.string()), "key": keys}
    return pa.table({**columns, **{name: pa.array(counts[name], pa.int64()) for name in COUNTS}}, schema=STATS_SCHEMA)


def _summed(parts: list[pa.Table]) -> pa.Table:
    """Rows with the same (breakdown, key) added up."""
    table = pa.concat_tables(parts) if parts else STATS_SCHEMA.empty_table()
    summed = table.group_by(["breakdown", "key"], use_threads=False).aggregate([(name, "sum") for name in COUNTS])
    return summed.rename_columns([name.removesuffix("_sum") for name in summed.column_names]).select(
        STATS_SCHEMA.names).cast(STATS_SCHEMA)


def reduce_stats(job: Job, part: int) -> dict[str, Any]:
    """One range of key hashes, once: its rows of every split's table summed into ``stats_file(part)``
    beside the corpus; returns the file, the keys per breakdown and the range's top keys."""

    def compute() -> dict[str, Any]:
        table = _summed(list(job.work.partition_tables(STATS_IN, part)))
        table = table.sort_by([("breakdown", "ascending"), ("key", "ascending")])
        name = stats_file(job.fingerprint, part)
        WorkDir(job.config.output, job.config.storage_options, spread_keys=False).write_table(name, table)
        keys = {b: 0 for b in BREAKDOWNS}
        top: dict[str, list[dict[str, Any]]] = {}
        for breakdown in BREAKDOWNS:
            rows = table.filter(pc.equal(table["breakdown"], breakdown)).to_pylist()
            keys[breakdown] = len(rows)
            top[breakdown] = rank(breakdown, rows)[:TOP_KEYS]
        return {"file": name, "keys": keys, "top": top}

    return run_once(job.work, STATS_DONE.partition(part), compute)


def run_stats(job: Job, parts: int, run_tasks: Callable[..., list[Any]]) -> dict[str, Any]:
    """The stage: the ``parts`` reduce tasks (:func:`stats_partitions`); the table's files, the keys of
    each breakdown and its top keys."""
    records = run_tasks(reduce_stats, [(job, part) for part in range(parts)], receives=[STATS_IN])
    return {
        "files": [r["file"] for r in records],
        "keys": {b: sum(r["keys"][b] for r in records) for b in BREAKDOWNS},
        "top": {b: rank(b, [row for r in records for row in r["top"][b]])[:TOP_KEYS] for b in BREAKDOWNS},
    }


def merge_counts(total: dict[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    """Add nested count dicts key by key."""
    for key, value in part.items():
        if isinstance(value, Mapping):
            total[key] = merge_counts(dict(total.get(key, {})), value)
        else:
            total[key] = total.get(key, 0) + value
    return total


def final_stats(totals: dict[str, Any], table: Mapping[str, Any], timings: Mapping[str, float], resumed: list[str],
                cc: Mapping[str, Any], params: IndexParams, config: DedupConfig, wall: float,
                splits: int, against: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The statistics a manifest records: the summed split totals, each breakdown's top keys and key
    count from the statistics ``table`` (:func:`run_stats`), the run's own figures, and with
    ``--against`` what it read of the earlier corpora (``gristmill.pipeline.job.earlier.figures``)."""
    rejected = dict(totals.get("rejected", {}))
    documents = {
        "input": totals.get("kept", 0) + totals.get("exact_duplicate", 0) + totals.get("near_duplicate", 0)
        + totals.get("spans", 0) + sum(rejected.values()),
        "kept": totals.get("kept", 0),
        "exact_duplicate": totals.get("exact_duplicate", 0),
        "near_duplicate": totals.get("near_duplicate", 0),
        "rejected": sum(rejected.values()),
        **({"spans": totals.get("spans", 0)} if config.spans is not None else {}),
    }
    return {
        "documents": documents,
        "rejected": rejected,
        "bytes": {"input_documents": totals.get("bytes_in", 0), "kept": totals.get("bytes_kept", 0),
                  "rejected_records": totals.get("rejected_bytes", 0)},
        "approx_tokens": {"input_documents": totals.get("bytes_in", 0) // BYTES_PER_TOKEN,
                          "kept": totals.get("bytes_kept", 0) // BYTES_PER_TOKEN},
        **{b: as_breakdown(b, table["top"][b]) for b in BREAKDOWNS},
        "breakdown_keys": dict(table["keys"]),
        "components": dict(cc),
        "stage_seconds": dict(timings),
        "resumed_stages": resumed,
        "wall_seconds": round(wall, 3),
        "splits": splits,  # the splits the input was cut into: one read task each
        "params": {**dataclasses.asdict(params), "against": config.against},
        **({"against": dict(against)} if against is not None else {}),
    }


def span_stats(config: DedupConfig, totals: Mapping[str, Any], top: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``--spans`` did, as the manifest records it: the bytes identity (input bytes = kept + cut as
    spans + removed documents' bytes, rejected records apart), spans and bytes cut, documents removed
    for ``spans``, and the most repeated spans with the documents each was found in."""
    spans = dict(totals.get("spans_totals", {}))
    return {
        **config.span_options,
        "spans_cut": spans.get("spans_cut", 0), "bytes_cut": spans.get("bytes_cut", 0),
        "documents_cut": spans.get("documents_cut", 0), "documents_removed": totals.get("spans", 0),
        "bytes": {"input_documents": totals.get("bytes_in", 0), "kept": totals.get("bytes_kept", 0),
                  "cut_as_spans": spans.get("bytes_cut", 0), "removed_documents": totals.get("bytes_removed", 0)},
        "top": top,
    }
