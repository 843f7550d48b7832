"""Stage ``sign``, per split: the exact survivors' signatures (computed by ``read``, one per content hash)
and band hashes; the sending side of the band shuffle and, with verification, of the signatures by key."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.pipeline.format.signature_index import fixed_list, list_matrix
from gristmill.pipeline.job.buckets import shuffle_bands
from gristmill.pipeline.job.config import DedupError
from gristmill.pipeline.job.datasets import DOCS, HASH_SIGNATURES, SIGN_DONE, SIGNATURES, signed_schema
from gristmill.pipeline.job.exact import exact_of
from gristmill.pipeline.job.partitions import Partitions
from gristmill.pipeline.job.tasks import Job, run_once
from gristmill.pipeline.job.verify import shuffle_signatures


def sign_split(job: Job, split_index: int, partitions: Partitions) -> dict[str, Any]:
    """The split's signed documents, once, and their band hashes (and signatures) to the shuffles; an
    ``--against`` index file's signed rows are what ``read`` wrote."""

    def compute() -> dict[str, Any]:
        if split_index < len(job.index_files):
            sigs = job.work.read_table(SIGNATURES.file(split_index))
        else:
            sigs = _signed(job, split_index)
            job.work.write_table(SIGNATURES.file(split_index), sigs)
        keys = sigs["key"].to_numpy()
        shuffle_bands(job, split_index, keys, list_matrix(sigs["bands"], job.params.bands), partitions.buckets)
        if job.params.verify:
            shuffle_signatures(job, split_index, sigs, partitions.verify)
        return {"signed": sigs.num_rows}

    return run_once(job.work, SIGN_DONE.split(split_index), compute)


def _signed(job: Job, split_index: int) -> pa.Table:
    """The exact survivors of a split with their signatures (from ``read``, by content hash; no text is
    read), their exact copies' count and band hashes."""
    from gristmill.dedup.lsh import band_hashes

    docs = job.work.read_table(DOCS.file(split_index), ["key", "id", "content_hash", "length", "prefer", "domain"])
    exact = exact_of(job, split_index, docs["content_hash"])
    survivor = pc.fill_null(pc.equal(exact["rep_key"], docs["key"]), True)  # null: a text of its own
    docs, copies = docs.filter(survivor), pc.fill_null(exact["copies"].filter(survivor), 1)
    signed = job.work.read_table(HASH_SIGNATURES.file(split_index))
    rows = pc.index_in(docs["content_hash"], value_set=signed["content_hash"].combine_chunks())
    if rows.null_count:
        raise DedupError(f"split {split_index}: a document's content hash has no signature")
    signatures = signed["signature"].take(rows)
    matrix = list_matrix(signatures, job.params.num_perm)
    bands = band_hashes(matrix, job.params.bands, job.params.rows) if docs.num_rows else np.zeros(
        (0, job.params.bands), np.uint64)
    return pa.table({
        "key": docs["key"], "id": docs["id"], "content_hash": docs["content_hash"], "length": docs["length"],
        "copies": copies, "existing": pa.array(np.zeros(docs.num_rows, bool)),
        "signature": signatures, "bands": fixed_list(bands),  # (the column as read, not rebuilt from matrix)
        "prefer": docs["prefer"], "domain": docs["domain"],
    }, schema=signed_schema(job.params.num_perm, job.params.bands))
