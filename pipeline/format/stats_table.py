"""The statistics table beside a dedup corpus, and the statistics a reader sees: the manifest's totals
with every breakdown in full.

Why a table: a breakdown has a row per key (a web crawl has millions of domains), and every loader
rank and worker parses ``manifest.json``; at 50,000 domains the breakdowns made it 5.8 MB. So the
dedup job writes the breakdowns as Parquet under ``_stats/`` (``STATS_SCHEMA``: one row per
(breakdown, key) with the documents in, kept, exact and near duplicates, rejected, and their bytes;
``cluster_sizes`` rows are keyed by cluster size and count clusters as ``kept``), lists the files in
the manifest's ``extra.stats_table.files``, and keeps in ``stats`` only the totals, the ``top``
keys of each breakdown and ``breakdown_keys`` (how many keys each has). Corpora written before the
table keep every breakdown in the manifest; :func:`full_stats` reads either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from gristmill.pipeline.format.manifest import STATS_TABLE_KEY, Manifest
from gristmill.pipeline.format.reader import Corpus
from gristmill.pipeline.format.schemas import STATS_BREAKDOWNS, STATS_SCHEMA

STATS_FOLDER = "_stats"
# Which domains lost documents to which: one key per pair, "loser domain -> survivor domain", counting
# the removed documents (``input``, split into ``exact_duplicate`` and ``near_duplicate``, and their
# ``input_bytes``); ``unknown`` where a document has no domain (or its survivor is an earlier corpus's).
LOST_TO = "lost_to"
BREAKDOWNS = (*STATS_BREAKDOWNS, LOST_TO)  # every breakdown of the table
TOP_KEYS = 20  # keys per breakdown the manifest keeps
COUNTS = tuple(name for name in STATS_SCHEMA.names if name not in ("breakdown", "key"))


def stats_table_files(manifest: Manifest) -> list[str]:
    """The statistics table's files a manifest lists (relative paths; none for older corpora)."""
    table = manifest.extra.get(STATS_TABLE_KEY)
    files = table.get("files") if isinstance(table, Mapping) else None
    return [name for name in files if isinstance(name, str)] if isinstance(files, list) else []


def entry(row: Mapping[str, Any]) -> dict[str, int]:
    """One key's counts as a breakdown holds them (``{"input": ..., "kept": ..., ...}``)."""
    return {name: int(row[name]) for name in COUNTS}


def rank(breakdown: str, rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Rows of one breakdown, largest first: by documents in (cluster sizes: by clusters), then by key."""
    if breakdown == "cluster_sizes":
        return sorted(rows, key=lambda row: (-row["kept"], int(row["key"])))
    return sorted(rows, key=lambda row: (-row["input"], row["key"]))


def as_breakdown(breakdown: str, rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Rows of one breakdown as the statistics hold it: key -> counts, or size -> clusters for cluster sizes."""
    if breakdown == "cluster_sizes":
        return {str(row["key"]): int(row["kept"]) for row in sorted(rows, key=lambda row: int(row["key"]))}
    return {str(row["key"]): entry(row) for row in rows}


def read_stats_table(corpus: Corpus) -> pa.Table:
    """Every row of the corpus's statistics table (an empty table when it has none)."""
    return corpus.read_members(stats_table_files(corpus.manifest), STATS_SCHEMA, "statistics table file")


def full_stats(corpus: Corpus) -> dict[str, Any]:
    """The corpus's statistics with every breakdown whole: from the statistics table when the manifest
    lists one, else the manifest's own (older corpora kept every key there)."""
    stats = dict(corpus.stats)
    if not stats_table_files(corpus.manifest):
        return stats
    rows = read_stats_table(corpus).to_pylist()
    for breakdown in BREAKDOWNS:
        stats[breakdown] = as_breakdown(breakdown, rank(breakdown, (r for r in rows if r["breakdown"] == breakdown)))
    return stats
