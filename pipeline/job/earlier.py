"""What an incremental run reads of its ``--against`` corpora: only the parts of their sorted signature
indexes that its own documents can match; the earlier index is never read whole nor shuffled.

Each index file is a pseudo-split (keys ``i << KEY_BITS | row``, ``row`` its place in the file). A
file written with a band file (``gristmill.pipeline.format.signature_index``: rows sorted by content hash, band
file sorted by band hash, small row groups) takes part in three places, each reading only the row
groups whose min/max statistics can hold a value it looks for, then only the rows that match:

- ``exact`` (:func:`exact_rows`, in each exact reducer): the earlier documents with one of the
  partition's content hashes; they win their exact group.
- ``against`` (:func:`probe_partition`, one task per band partition): the earlier documents sharing
  a band hash with the partition's new documents, sent to their pseudo-split; then
  (:func:`fetch_split`, one task per index file) those documents' rows, written as the pseudo-split's
  signed documents (``sigs/``), which ``sign`` sends through the band and verification shuffles as
  it does any split's. An earlier document no new document shares a bucket or a text with is never
  read, so buckets of earlier documents alone, which only an earlier run could act on, are skipped.

The exact and band shuffles partition by range of the hash (``range_partition``), so a row group of an
earlier index holds the hashes of one partition or two, and is read by that many tasks however many
partitions the run has. An index written before band files is read whole by ``read`` and shuffled as
a split (``read.read_index_split``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gristmill.pipeline.format.sorted_parquet import group_starts, groups_holding, open_counted
from gristmill.pipeline.job.datasets import (
    BUCKETS_IN,
    EARLIER_FETCH_DONE,
    EARLIER_KEYS,
    EARLIER_PROBE_DONE,
    EXACT_SCHEMA,
    SIGNATURES,
    partition_name,
    sig_schema,
)
from gristmill.pipeline.job.inputs import KEY_BITS
from gristmill.pipeline.job.tasks import Job, map_splits, run_once

KEY_SCHEMA = pa.schema([("key", pa.int64())])


def sorted_indices(job: Job) -> list[int]:
    """The pseudo-splits whose index file is sorted, with a band file: read in part, never shuffled."""
    return [i for i, f in enumerate(job.index_files) if f.bands_url is not None]


def whole_indices(job: Job) -> list[int]:
    """The pseudo-splits whose index file was written before band files: ``read`` reads them whole."""
    return [i for i, f in enumerate(job.index_files) if f.bands_url is None]


def shuffled_indices(job: Job) -> list[int]:
    """The splits that go through the shuffles themselves: the new input's, and any index file
    written before band files (read whole)."""
    return [i for i in job.all_split_indices if i >= len(job.index_files) or job.index_files[i].bands_url is None]


def _rows_of(groups: list[int], starts: np.ndarray) -> np.ndarray:
    """The file rows of the row groups ``groups``, in the order ``read_row_groups`` returns them."""
    parts = [np.arange(starts[g], starts[g + 1], dtype=np.int64) for g in groups]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def exact_rows(job: Job, hashes: pa.ChunkedArray | pa.Array) -> tuple[pa.Table, int]:
    """Every sorted index file's documents whose content hash is one of ``hashes`` (an exact reducer's),
    as ``EXACT_SCHEMA`` rows that win their group; and the bytes read."""
    wanted = np.unique(np.asarray(pc.unique(hashes).to_pylist(), dtype=str))
    tables, read = [], 0
    for split in sorted_indices(job) if len(wanted) else []:
        with open_counted(job.index_files[split].url, job.config.storage_options) as (parquet, counted):
            tables.append(_with_hashes(parquet, split, wanted))
            read += counted.bytes_read
    return (pa.concat_tables(tables) if tables else EXACT_SCHEMA.empty_table()), read


def _with_hashes(parquet: pq.ParquetFile, split: int, wanted: np.ndarray) -> pa.Table:
    """One index file's documents whose content hash is ``wanted``: the hash column of the row groups
    that can hold one, then the other columns of the groups that do."""
    groups = groups_holding(parquet.metadata, "content_hash", wanted)
    if not groups:
        return EXACT_SCHEMA.empty_table()
    found = parquet.read_row_groups(groups, columns=["content_hash"])["content_hash"]
    match = np.flatnonzero(pc.is_in(found, value_set=pa.array(wanted)).to_numpy(zero_copy_only=False))
    ends = np.cumsum([parquet.metadata.row_group(g).num_rows for g in groups])
    hit = np.unique(np.asarray(groups)[np.searchsorted(ends, match, side="right")]).tolist()
    if not hit:
        return EXACT_SCHEMA.empty_table()
    table = parquet.read_row_groups(hit, columns=["content_hash", "id", "length"])
    keep = pc.is_in(table["content_hash"], value_set=pa.array(wanted))
    keys = (split << KEY_BITS) + _rows_of(hit, group_starts(parquet.metadata))[keep.to_numpy(zero_copy_only=False)]
    table = table.filter(keep)
    return pa.table({"content_hash": table["content_hash"], "key": pa.array(keys, pa.int64()), "id": table["id"],
                     "length": table["length"], "existing": pa.array(np.ones(len(keys), bool)),
                     "count": pa.array(np.ones(len(keys), np.int64))}, schema=EXACT_SCHEMA)


def probe_partition(job: Job, part: int) -> dict[str, Any]:
    """One band partition, once: the earlier documents sharing a band hash with the partition's rows,
    sent by key to their pseudo-split (``EARLIER_KEYS``)."""

    def compute() -> dict[str, Any]:
        wanted = np.zeros(0, np.uint64)  # the distinct band hashes, a segment at a time: a hot bucket is one
        for table in job.work.partition_tables(BUCKETS_IN, part):
            wanted = np.union1d(wanted, table["hash"].to_numpy())
        keys, read = [], 0
        for split in sorted_indices(job) if len(wanted) else []:
            with open_counted(job.index_files[split].bands_url, job.config.storage_options) as (parquet, counted):
                groups = groups_holding(parquet.metadata, "hash", wanted)
                if groups:
                    table = parquet.read_row_groups(groups, columns=["hash", "row"])
                    hit = np.isin(table["hash"].to_numpy(), wanted)
                    rows = np.unique(table["row"].to_numpy()[hit].astype(np.int64))
                    keys.append((split << KEY_BITS) + rows)
            read += counted.bytes_read
        found_keys = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        job.work.write_partitioned(EARLIER_KEYS, partition_name(part), pa.table({"key": found_keys}, schema=KEY_SCHEMA),
                                   found_keys >> KEY_BITS, len(job.index_files))
        return {"documents": int(found_keys.size), "bytes_read": read}

    return run_once(job.work, EARLIER_PROBE_DONE.partition(part), compute)


def fetch_split(job: Job, split: int) -> dict[str, Any]:
    """One sorted index file, once: the rows the probes found, from the row groups holding them, as the
    pseudo-split's signed documents (``sigs/``)."""

    def compute() -> dict[str, Any]:
        keys = job.work.read_partition(EARLIER_KEYS, split, KEY_SCHEMA)["key"].to_numpy()
        rows = np.unique(keys - (split << KEY_BITS))
        schema = sig_schema(job.params.num_perm, job.params.bands)
        table, read = schema.empty_table(), 0
        if len(rows):
            with open_counted(job.index_files[split].url, job.config.storage_options) as (parquet, counted):
                starts = group_starts(parquet.metadata)
                groups = np.unique(np.searchsorted(starts, rows, side="right") - 1).tolist()
                index = parquet.read_row_groups(groups, columns=["id", "content_hash", "length", "signature", "bands"])
                take = pa.array(np.searchsorted(_rows_of(groups, starts), rows))
                index = index.take(take)
                table = pa.table({
                    "key": pa.array((split << KEY_BITS) + rows, pa.int64()), "id": index["id"],
                    "content_hash": index["content_hash"], "length": index["length"],
                    "copies": pa.array(np.ones(len(rows), np.int64)), "existing": pa.array(np.ones(len(rows), bool)),
                    "signature": index["signature"], "bands": index["bands"]}, schema=schema)
            read = counted.bytes_read
        job.work.write_table(SIGNATURES.file(split), table)
        return {"documents": table.num_rows, "bytes_read": read}

    return run_once(job.work, EARLIER_FETCH_DONE.split(split), compute)


def figures(job: Job, exact: list[dict[str, Any]], found: dict[str, int]) -> dict[str, int]:
    """What the run read of its earlier corpora, for the statistics: ``bytes_read`` of the sorted index
    files (by the exact reducers, the probes and the fetches), the documents fetched, and how many
    index files (written before band files) ``read`` read whole."""
    return {"corpora": len(job.config.against), "index_files": len(job.index_files),
            "index_files_read_whole": len(whole_indices(job)), "documents_fetched": found["documents"],
            "bytes_read": found["bytes_read"] + sum(r["earlier_bytes"] for r in exact)}


def run_earlier(job: Job, band_partitions: int, run_tasks: Callable[..., list[Any]]) -> dict[str, int]:
    """The probes over every band partition, then the fetches: what the run read of its earlier indexes."""
    if not sorted_indices(job):  # every earlier index was read whole and shuffled by ``read``
        return {"documents": 0, "bytes_read": 0}
    probes = run_tasks(probe_partition, [(job, part) for part in range(band_partitions)], receives=[BUCKETS_IN])
    fetches = map_splits(fetch_split, job, sorted_indices(job), receives=[EARLIER_KEYS])
    return {"documents": sum(r["documents"] for r in fetches),
            "bytes_read": sum(r["bytes_read"] for r in probes + fetches)}
