"""Stage ``sign``, per split: the exact survivors' signatures (computed by ``read``, one per content hash)
and band hashes; the map side of the band shuffle."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.format.signature_index import fixed_list, list_matrix
from pipeline.job.buckets import shuffle_bands
from pipeline.job.config import DedupError
from pipeline.job.datasets import (
    DOCS,
    EXACT_OUT,
    EXACT_OUT_SCHEMA,
    HASH_SIGNATURES,
    SIGN_DONE,
    SIGNATURES,
    sig_schema,
)
from pipeline.job.tasks import Job, run_once


def sign_split(job: Job, split_index: int) -> dict[str, Any]:
    """The exact survivors' signatures (computed by ``read``, one per content hash) with their band
    hashes, and the map side of the band shuffle; no text is read."""

    def compute() -> dict[str, Any]:
        from dedup.lsh import band_hashes

        docs = job.work.read_table(DOCS.file(split_index), ["key", "id", "content_hash", "length"])
        exact = job.work.read_folder(EXACT_OUT.split(split_index), EXACT_OUT_SCHEMA)
        removed = exact.filter(pc.not_equal(exact["key"], exact["rep_key"]))["key"].combine_chunks()
        docs = docs.filter(pc.invert(pc.is_in(docs["key"], value_set=removed)))
        survivors = exact.filter(pc.equal(exact["key"], exact["rep_key"]))
        copies = np.ones(docs.num_rows, np.int64)
        where = pc.index_in(docs["key"], value_set=survivors["key"].combine_chunks())  # null: no exact copies
        copies[where.is_valid().to_numpy(zero_copy_only=False)] = survivors["copies"].to_numpy()[
            where.drop_null().to_numpy()]
        signed = job.work.read_table(HASH_SIGNATURES.file(split_index))
        rows = pc.index_in(docs["content_hash"], value_set=signed["content_hash"].combine_chunks())
        if rows.null_count:
            raise DedupError(f"split {split_index}: a document's content hash has no signature")
        signatures = signed["signature"].take(rows)
        matrix = list_matrix(signatures, job.params.num_perm)
        bands = band_hashes(matrix, job.params.bands, job.params.rows) if docs.num_rows else np.zeros(
            (0, job.params.bands), np.uint64)
        sigs = pa.table({
            "key": docs["key"], "id": docs["id"], "content_hash": docs["content_hash"], "length": docs["length"],
            "copies": pa.array(copies), "existing": pa.array(np.zeros(docs.num_rows, bool)),
            "signature": signatures, "bands": fixed_list(bands),  # (the column as read, not rebuilt from matrix)
        }, schema=sig_schema(job.params.num_perm, job.params.bands))
        job.work.write_table(SIGNATURES.file(split_index), sigs)
        shuffle_bands(job, split_index, sigs["key"].to_numpy(), bands)
        return {"signed": sigs.num_rows}

    return run_once(job.work, SIGN_DONE.split(split_index), compute)
