"""The job's statistics: counts, bytes and breakdowns per split (summed by the driver), and the final
statistics a manifest records (documents in = kept + exact + near duplicates + rejected)."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.format import REJECT_KINDS
from pipeline.format.signature_index import IndexParams
from pipeline.job.config import DedupConfig
from pipeline.job.datasets import REJECTS
from pipeline.job.tasks import Job

BYTES_PER_TOKEN = 4  # the approximate-token statistic: UTF-8 bytes / 4


def split_stats(job: Job, split_index: int, docs: pa.Table, status: np.ndarray,
                cluster_size: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
    """Counts, bytes and breakdowns of one split (``lengths``: UTF-8 bytes per document); the driver adds them up."""
    from dedup.core import STATUSES

    rejects = job.work.read_table(REJECTS.file(split_index))
    stats: dict[str, Any] = {name: int(np.count_nonzero(status == i)) for i, name in enumerate(STATUSES)}
    stats["bytes_in"] = int(lengths.sum())
    stats["bytes_kept"] = int(lengths[status == 0].sum())
    rejected: Counter[str] = Counter()
    for kind, count in zip(rejects["kind"].to_pylist(), rejects["count"].to_pylist(), strict=True):
        rejected[kind] += count
    stats["rejected"] = {kind: rejected.get(kind, 0) for kind in REJECT_KINDS}
    stats["rejected_bytes"] = int(pc.sum(rejects["bytes"]).as_py() or 0)
    breakdowns: dict[str, dict[str, dict[str, int]]] = {}
    for column in ("origin", "domain", "language"):
        table: dict[str, dict[str, int]] = defaultdict(lambda: {"input": 0, **{n: 0 for n in STATUSES}, "rejected": 0})
        for value, st in zip(docs[column].to_pylist(), status.tolist(), strict=True):
            entry = table[value or "unknown"]
            entry["input"] += 1
            entry[STATUSES[st]] += 1
        breakdowns[column] = dict(table)
    for origin, count in zip(rejects["origin"].to_pylist(), rejects["count"].to_pylist(), strict=True):
        entry = breakdowns["origin"].setdefault(origin, {"input": 0, **{n: 0 for n in STATUSES}, "rejected": 0})
        entry["input"] += count
        entry["rejected"] += count
    stats["by"] = breakdowns
    sizes = cluster_size[status == 0]
    stats["cluster_sizes"] = {str(k): int(v) for k, v in zip(*np.unique(sizes[sizes > 1], return_counts=True),
                                                             strict=True)}
    return stats


def merge_counts(total: dict[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    """Add nested count dicts key by key."""
    for key, value in part.items():
        if isinstance(value, Mapping):
            total[key] = merge_counts(dict(total.get(key, {})), value)
        else:
            total[key] = total.get(key, 0) + value
    return total


def final_stats(totals: dict[str, Any], timings: Mapping[str, float], resumed: list[str], cc: Mapping[str, Any],
                params: IndexParams, config: DedupConfig, wall: float) -> dict[str, Any]:
    """The statistics a manifest records, from the summed split statistics and the run's own figures."""
    rejected = dict(totals.get("rejected", {}))
    documents = {
        "input": totals.get("kept", 0) + totals.get("exact_duplicate", 0) + totals.get("near_duplicate", 0)
        + sum(rejected.values()),
        "kept": totals.get("kept", 0),
        "exact_duplicate": totals.get("exact_duplicate", 0),
        "near_duplicate": totals.get("near_duplicate", 0),
        "rejected": sum(rejected.values()),
    }
    return {
        "documents": documents,
        "rejected": rejected,
        "bytes": {"input_documents": totals.get("bytes_in", 0), "kept": totals.get("bytes_kept", 0),
                  "rejected_records": totals.get("rejected_bytes", 0)},
        "approx_tokens": {"input_documents": totals.get("bytes_in", 0) // BYTES_PER_TOKEN,
                          "kept": totals.get("bytes_kept", 0) // BYTES_PER_TOKEN},
        "by_source": totals.get("by", {}).get("origin", {}),
        "by_domain": totals.get("by", {}).get("domain", {}),
        "by_language": totals.get("by", {}).get("language", {}),
        "cluster_sizes": dict(sorted(totals.get("cluster_sizes", {}).items(), key=lambda kv: int(kv[0]))),
        "components": dict(cc),
        "stage_seconds": dict(timings),
        "resumed_stages": resumed,
        "wall_seconds": round(wall, 3),
        "params": {**dataclasses.asdict(params), "against": config.against},
    }
