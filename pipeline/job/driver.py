"""The Ray dedup job: raw documents in, a deduplicated, sharded corpus out (``gristmill dedup``).

Stages (docs/PIPELINE.md has the details, the memory each needs and the statistics):

1. ``read``     per split (Ray tasks): parse, reject bad records, normalise + exact hash, MinHash
                signature of each content hash new to the split, write the documents; shuffle
                (content hash, key) by hash.
2. ``exact``    per hash partition (Ray tasks): one survivor per content hash.
3. ``sign``     per split: the exact survivors' signatures (by content hash), band
                hashes; shuffle (band hash, key) by hash.
4. ``buckets``  per hash partition: candidate edges within each band bucket.
   ``verify``   (unless ``--no-verify``) each candidate edge joined with its two documents' signatures
                in two per-split hops (by the left key's split, then the right key's); only edges whose
                estimated Jaccard reaches the threshold go on.
5. ``cc``       rounds of large-star / small-star over hash-partitioned edges until stable.
6. ``clusters`` labels joined with signatures per split, shuffled by label; survivor choice and the
                estimated similarity of every removed member to its representative.
7. ``write``    per split: kept rows into shards (and removed rows into ``--removed``), the signature
                index, per-split statistics; the driver writes the manifest last.

A document's key is ``split << 32 | ordinal`` (input order), every reduce sorts, and shards are cut
per split, so the result does not depend on CPUs, partitions or nodes. Each task writes its
results and then a completion record under ``OUTPUT/_work``; a rerun skips what is recorded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.format import (
    CORPUS_SCHEMA,
    JOB_FINGERPRINT_KEY,
    REJECT_KINDS,
    REJECT_SCHEMA,
    REMOVED_SCHEMA,
    Corpus,
    CorpusError,
    ShardInfo,
    ShardWriter,
    index_schema,
    open_fs,
    remove_unlisted,
    write_manifest,
)
from pipeline.format.signature_index import (
    INDEX_FOLDER,
    IndexParams,
    ParamsError,
    fixed_list,
    list_matrix,
    params_for,
)
from pipeline.job import components
from pipeline.job.folders import FolderError, check_disjoint, claim
from pipeline.job.inputs import (
    KEY_BITS,
    Doc,
    InputFile,
    ReadOptions,
    Reject,
    Split,
    generated_id,
    plan_splits,
    read_file,
    resolve_inputs,
)
from pipeline.job.workdir import WorkDir, partition_of

log = logging.getLogger("gristmill.dedup")

STAGES = ("read", "exact", "sign", "buckets", "verify", "cc", "clusters", "write")
REJECTS_FOLDER = "_rejects"
WORK_FOLDER = "_work"
BYTES_PER_TOKEN = 4  # the approximate-token statistic: UTF-8 bytes / 4
CC_ROWS_PER_PARTITION = 8_000_000  # band rows (documents x bands) per connected-components partition
# Arrow's mimalloc pool kept ~60 MB per worker of freed pages after each split; purging them at once
# costs ~6% more CPU in the stages. (Arrow's system pool with glibc's mmap threshold fixed kept ~110 MB
# less, but page faults on every fresh buffer cost ~30% more CPU; docs/PIPELINE.md, memory.) Set for
# the local Ray the job starts; deploy/Dockerfile sets it for clusters.
WORKER_ALLOCATOR_ENV = {"MIMALLOC_PURGE_DELAY": "0"}
# Text per batch, one row group of a split's documents: a worker holds one at a time (8 MiB cost
# 47 MB more per worker at the same CPU).
BATCH_BYTES = 4 * 1024 * 1024
PARTITION_INPUT_BYTES = 256 * 1024 * 1024  # input per shuffle partition (by default)

DOC_SCHEMA = pa.schema([
    ("key", pa.int64()), ("id", pa.string()), ("text", pa.string()), ("source", pa.string()),
    ("domain", pa.string()), ("language", pa.string()), ("fetch_time", pa.timestamp("ms", tz="UTC")),
    ("content_hash", pa.string()), ("length", pa.int64()), ("origin", pa.string()),
])
EXACT_SCHEMA = pa.schema([
    ("content_hash", pa.string()), ("key", pa.int64()), ("id", pa.string()), ("length", pa.int64()),
    ("existing", pa.bool_()),
])
EXACT_OUT_SCHEMA = pa.schema([
    ("key", pa.int64()), ("rep_key", pa.int64()), ("rep_id", pa.string()), ("copies", pa.int64()),
])
BUCKET_SCHEMA = pa.schema([("hash", pa.uint64()), ("key", pa.int64())])
CANDIDATE_SCHEMA = pa.schema([("left", pa.int64()), ("right", pa.int64())])
CLUSTER_OUT_SCHEMA = pa.schema([
    ("key", pa.int64()), ("cluster_id", pa.string()), ("cluster_size", pa.int64()), ("rep_key", pa.int64()),
    ("rep_id", pa.string()), ("similarity", pa.float64()),
])
EXACT_BY_REP_SCHEMA = pa.schema([("key", pa.int64()), ("rep_key", pa.int64())])
EXACT_CLUSTER_SCHEMA = pa.schema([("key", pa.int64()), ("cluster_id", pa.string()), ("cluster_size", pa.int64())])


def _sig_schema(num_perm: int, bands: int) -> pa.Schema:
    return pa.schema([
        ("key", pa.int64()), ("id", pa.string()), ("content_hash", pa.string()), ("length", pa.int64()),
        ("copies", pa.int64()), ("existing", pa.bool_()),
        ("signature", pa.list_(pa.uint64(), num_perm)), ("bands", pa.list_(pa.uint64(), bands)),
    ])


class DedupError(Exception):
    """The job cannot run as configured (bad options, an incompatible --against corpus)."""


@dataclass
class DedupConfig:
    """Everything ``gristmill dedup`` takes; the TOML job file holds the same keys."""

    inputs: list[str]
    output: str
    threshold: float = 0.8
    num_perm: int = 128
    ngram: int = 5
    bands: int | None = None  # with rows: override the (bands, rows) choose_bands picks
    rows: int | None = None
    verify: bool = True  # link a candidate pair only when its estimated Jaccard reaches the threshold
    seed: int | None = None
    text_column: str = "text"
    id_column: str = "id"
    max_doc_bytes: int = 10 * 1024 * 1024
    split_bytes: int = 64 * 1024 * 1024
    num_partitions: int | None = None  # hash partitions per shuffle; default: one per split, 2 to 64
    removed: str | None = None
    against: str | None = None
    shard_bytes: int = 256 * 1024 * 1024
    row_group_bytes: int = 4 * 1024 * 1024
    keep_work: bool = False
    overwrite: bool = False  # replace a committed corpus another job wrote in output/removed
    storage_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> DedupConfig:
        """Build from a TOML job file's table (unknown keys are an error naming them)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise DedupError(f"unknown job option(s): {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        return cls(**dict(values))


def _params(config: DedupConfig) -> IndexParams:
    """The hashing parameters of the job (its signature index records them); DedupError when impossible."""
    try:
        return params_for(config.threshold, config.num_perm, config.ngram, bands=config.bands, rows=config.rows,
                          seed=config.seed, verify=config.verify)
    except ParamsError as exc:
        raise DedupError(str(exc)) from None


# -- context shared by every task ----------------------------------------------------------------
@dataclass
class _Job:
    config: DedupConfig
    params: IndexParams
    work: WorkDir
    splits: list[Split]  # new input, numbered after the existing index's pseudo-splits
    index_files: list[str]  # --against: one pseudo-split per index file
    fingerprint: str

    num_partitions: int

    @property
    def split_indices(self) -> list[int]:
        return [s.index for s in self.splits]

    @property
    def all_split_indices(self) -> list[int]:
        return list(range(len(self.index_files))) + self.split_indices

    def split(self, index: int) -> Split:
        return self.splits[index - len(self.index_files)]


def _hash_partition(hashes: Sequence[str], num_partitions: int) -> np.ndarray:
    return np.fromiter((int(h[:15], 16) % num_partitions for h in hashes), dtype=np.int64, count=len(hashes))


def _json_record(work: WorkDir, marker: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run a task unless its completion record exists; the record is written last."""
    done = work.read_json(marker)
    if done is not None:
        return done
    record = compute()
    work.write_json(marker, record)
    return record


# -- stage 1: read -------------------------------------------------------------------------------
def _read_split(job: _Job, split_index: int) -> dict[str, Any]:
    return _json_record(job.work, f"read/done/s={split_index:05d}.json", lambda: _read_split_now(job, split_index))


def _read_split_now(job: _Job, split_index: int) -> dict[str, Any]:
    """Parse, hash, sign and write the split one ~BATCH_BYTES batch (one row group) at a time, so a task
    holds a batch of documents, not the split; only the slim shuffle columns and one signature per
    distinct text are kept for the whole split."""
    rejects: list[tuple[Reject, str]] = []
    slims: list[pa.Table] = []
    signed: list[pa.Table] = []
    seen: set[str] = set()  # content hashes of the split already signed
    hasher = job.params.hasher()
    ordinal = 0
    with job.work.table_writer(f"docs/s={split_index:05d}.parquet", DOC_SCHEMA) as writer:
        for batch in _document_batches(job, split_index, rejects):
            table, signatures = _document_table(split_index, ordinal, batch, hasher, seen)
            writer.write_table(table)
            slims.append(table.select(["content_hash", "key", "id", "length"]))
            signed.append(signatures)
            ordinal += table.num_rows
    slim = pa.concat_tables(slims) if slims else EXACT_SCHEMA.empty_table().select(["content_hash", "key", "id", "length"])
    hash_schema = _hash_signature_schema(job.params.num_perm)
    job.work.write_table(f"hash_sigs/s={split_index:05d}.parquet",
                         pa.concat_tables(signed) if signed else hash_schema.empty_table())
    _shuffle_exact(job, split_index, slim, existing=False)
    reject_table = pa.table({
        "source": [r.source for r, _ in rejects], "position": [r.position for r, _ in rejects],
        "kind": [r.kind for r, _ in rejects], "reason": [r.reason for r, _ in rejects],
        "bytes": [r.bytes for r, _ in rejects], "count": [r.count for r, _ in rejects],
        "origin": [o for _, o in rejects],
    }, schema=REJECT_SCHEMA)
    job.work.write_table(f"rejects/s={split_index:05d}.parquet", reject_table)
    return {"docs": ordinal, "rejected": sum(r.count for r, _ in rejects)}


def _document_batches(job: _Job, split_index: int, rejects: list[tuple[Reject, str]]) -> Iterator[list[tuple[Doc, str]]]:
    """The split's documents (with the INPUT that named each) in batches of about BATCH_BYTES of text;
    rejected records go to ``rejects``."""
    config = job.config
    options = ReadOptions(config.text_column, config.id_column, config.max_doc_bytes)
    batch: list[tuple[Doc, str]] = []
    size = 0
    for item in job.split(split_index).files:
        for record in read_file(item, options, config.storage_options):
            if isinstance(record, Reject):
                rejects.append((record, item.origin))
                continue
            if record.id is None:
                record.id = generated_id(item.url, record.position)
            batch.append((record, item.origin))
            size += len(record.text)
            if size >= BATCH_BYTES:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _document_table(split_index: int, first: int, batch: list[tuple[Doc, str]], hasher: Any,
                    seen: set[str]) -> tuple[pa.Table, pa.Table]:
    """One batch as rows of the split's documents file (keys from ``first`` on, content hashes), and
    the MinHash signature of each content hash not in ``seen`` (then added to it).

    Signing here, from the batch normalised for the content hash, spares the sign stage a second read
    and normalisation of every text. Equal content hashes mean equal normalised texts, hence equal
    token sequences and signatures, so one signature per hash serves every exact copy.
    """
    from dedup.normalize import fold_prepared, hashes_of_folded, prefold, utf8_batch

    docs = [d for d, _ in batch]
    texts = [d.text for d in docs]
    prefolded = prefold(texts, hasher.normalize)
    data, offsets = utf8_batch(prefolded)
    hashes = hashes_of_folded(*fold_prepared(data, offsets, hasher.normalize))
    new = []
    for i, content_hash in enumerate(hashes):
        if content_hash not in seen:
            seen.add(content_hash)
            new.append(i)
    if len(new) < len(hashes):
        data, offsets = utf8_batch([prefolded[i] for i in new])
    signatures = hasher.signatures_prepared(data, offsets)[0] if new else np.zeros((0, hasher.num_perm), np.uint64)
    keys = (np.int64(split_index) << np.int64(KEY_BITS)) + np.arange(first, first + len(docs), dtype=np.int64)
    table = pa.table({
        "key": pa.array(keys, pa.int64()), "id": [d.id for d in docs], "text": texts,
        "source": [d.source for d in docs], "domain": [d.domain for d in docs],
        "language": [d.language for d in docs], "fetch_time": [d.fetch_time for d in docs],
        "content_hash": hashes,
        "length": [len(t) for t in texts],  # characters: the survivor policy prefers the longest text
        "origin": [o for _, o in batch],
    }, schema=DOC_SCHEMA)
    signed = pa.table({"content_hash": [hashes[i] for i in new], "signature": fixed_list(signatures)},
                      schema=_hash_signature_schema(hasher.num_perm))
    return table, signed


def _hash_signature_schema(num_perm: int) -> pa.Schema:
    return pa.schema([("content_hash", pa.string()), ("signature", pa.list_(pa.uint64(), num_perm))])


def _shuffle_exact(job: _Job, split_index: int, slim: pa.Table, existing: bool) -> None:
    table = slim.append_column("existing", pa.array(np.full(slim.num_rows, existing), pa.bool_()))
    partition = _hash_partition(table["content_hash"].to_pylist(), job.num_partitions)
    job.work.write_partitioned("exact_in", f"s={split_index:05d}", table, partition, job.num_partitions)


def _read_index_split(job: _Job, split_index: int) -> dict[str, Any]:
    """--against: an existing corpus's index file enters the exact and band shuffles as a pseudo-split."""

    def compute() -> dict[str, Any]:
        index = _read_index_file(job, job.index_files[split_index])
        keys = (np.int64(split_index) << np.int64(KEY_BITS)) + np.arange(index.num_rows, dtype=np.int64)
        slim = pa.table({"content_hash": index["content_hash"], "key": pa.array(keys, pa.int64()),
                         "id": index["id"], "length": index["length"]})
        _shuffle_exact(job, split_index, slim, existing=True)
        sigs = pa.table({
            "key": pa.array(keys, pa.int64()), "id": index["id"], "content_hash": index["content_hash"],
            "length": index["length"], "copies": pa.array(np.ones(index.num_rows, np.int64)),
            "existing": pa.array(np.ones(index.num_rows, bool)), "signature": index["signature"],
            "bands": index["bands"],
        }, schema=_sig_schema(job.params.num_perm, job.params.bands))
        job.work.write_table(f"sigs/s={split_index:05d}.parquet", sigs)
        _shuffle_bands(job, split_index, keys, list_matrix(index["bands"], job.params.bands))
        return {"docs": index.num_rows}

    return _json_record(job.work, f"read/done/s={split_index:05d}.json", compute)


def _read_index_file(job: _Job, url: str) -> pa.Table:
    import pyarrow.parquet as pq

    fs, path = open_fs(url, job.config.storage_options)
    with fs.open(path, "rb") as handle:
        return pq.read_table(handle, schema=index_schema(job.params.num_perm, job.params.bands))


# -- stage 2: exact ------------------------------------------------------------------------------
def _exact_partition(job: _Job, part: int) -> dict[str, Any]:
    def compute() -> dict[str, Any]:
        from dedup.cluster import choose_representatives

        table = job.work.read_folder(f"exact_in/p={part:05d}", EXACT_SCHEMA)
        table = table.sort_by([("content_hash", "ascending"), ("key", "ascending")])
        hashes = table["content_hash"].combine_chunks() if table.num_rows else pa.array([], pa.string())
        n = table.num_rows
        starts = np.ones(n, bool)
        if n > 1:
            starts[1:] = pc.not_equal(hashes[1:], hashes[:-1]).to_numpy(zero_copy_only=False)
        groups = np.cumsum(starts) - 1
        sizes = np.bincount(groups) if n else np.zeros(0, np.int64)
        in_dup = sizes[groups] > 1 if n else np.zeros(0, bool)
        sub = table.filter(pa.array(in_dup))
        labels = groups[in_dup]
        keys = sub["key"].to_numpy()
        is_rep, rep_index = choose_representatives(
            labels, sub["length"].to_numpy(), sub["id"], priority=sub["existing"].to_numpy(zero_copy_only=False))
        rep_index = np.asarray(rep_index)
        ids = sub["id"].to_pylist()
        out = pa.table({
            "key": pa.array(keys, pa.int64()), "rep_key": pa.array(keys[rep_index], pa.int64()),
            "rep_id": [ids[i] for i in rep_index], "copies": pa.array(sizes[labels], pa.int64()),
        }, schema=EXACT_OUT_SCHEMA)
        _write_by_split(job, "exact_out", part, out)
        # the copies again, by their survivor's split: the clusters stage tells them its final cluster
        copies = out.filter(pc.not_equal(out["key"], out["rep_key"])).select(["key", "rep_key"])
        _route_by_split(job, "exact_by_rep", part, copies, "rep_key")
        return {"duplicates": int(len(keys) - np.count_nonzero(is_rep))}

    return _json_record(job.work, f"exact/done/p={part:05d}.json", compute)


def _write_by_split(job: _Job, folder: str, part: int, table: pa.Table) -> None:
    """Route a reducer's rows back to the split their key belongs to: ``folder/s=S/p=P.parquet``."""
    _route_by_split(job, folder, part, table, "key")


def _route_by_split(job: _Job, folder: str, part: int, table: pa.Table, column: str) -> None:
    """Rows to the split of the key in ``column``: ``folder/s=S/p=P.parquet``."""
    splits = table[column].to_numpy() >> KEY_BITS if table.num_rows else np.zeros(0, np.int64)
    for split in np.unique(splits):
        job.work.write_table(f"{folder}/s={int(split):05d}/p={part:05d}.parquet",
                             table.filter(pa.array(splits == split)))


# -- stage 3: sign -------------------------------------------------------------------------------
def _sign_split(job: _Job, split_index: int) -> dict[str, Any]:
    """The exact survivors' signatures (computed by ``read``, one per content hash) with their band
    hashes, and the map side of the band shuffle; no text is read."""

    def compute() -> dict[str, Any]:
        from dedup.lsh import band_hashes

        docs = job.work.read_table(f"docs/s={split_index:05d}.parquet", ["key", "id", "content_hash", "length"])
        exact = job.work.read_folder(f"exact_out/s={split_index:05d}", EXACT_OUT_SCHEMA)
        removed = exact.filter(pc.not_equal(exact["key"], exact["rep_key"]))["key"].combine_chunks()
        docs = docs.filter(pc.invert(pc.is_in(docs["key"], value_set=removed)))
        survivors = exact.filter(pc.equal(exact["key"], exact["rep_key"]))
        copies = np.ones(docs.num_rows, np.int64)
        where = pc.index_in(docs["key"], value_set=survivors["key"].combine_chunks())  # null: no exact copies
        copies[where.is_valid().to_numpy(zero_copy_only=False)] = survivors["copies"].to_numpy()[
            where.drop_null().to_numpy()]
        signed = job.work.read_table(f"hash_sigs/s={split_index:05d}.parquet")
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
        }, schema=_sig_schema(job.params.num_perm, job.params.bands))
        job.work.write_table(f"sigs/s={split_index:05d}.parquet", sigs)
        _shuffle_bands(job, split_index, sigs["key"].to_numpy(), bands)
        return {"signed": sigs.num_rows}

    return _json_record(job.work, f"sign/done/s={split_index:05d}.json", compute)


def _shuffle_bands(job: _Job, split_index: int, keys: np.ndarray, bands: np.ndarray) -> None:
    """Every (band hash, key) row goes to the partition of its band hash (hashes are salted per band)."""
    hashes = bands.reshape(-1)
    repeated = np.repeat(keys, bands.shape[1])
    table = pa.table({"hash": pa.array(hashes, pa.uint64()), "key": pa.array(repeated, pa.int64())})
    job.work.write_partitioned("buckets_in", f"s={split_index:05d}", table,
                               partition_of(hashes, job.num_partitions), job.num_partitions)


# -- stage 4: buckets ----------------------------------------------------------------------------
def _bucket_partition(job: _Job, part: int, cc_partitions: int) -> dict[str, Any]:
    def compute() -> dict[str, Any]:
        from dedup.lsh import bucket_edges

        table = job.work.read_folder(f"buckets_in/p={part:05d}", BUCKET_SCHEMA)
        keys = table["key"].to_numpy()
        hashes = table["hash"].to_numpy()
        left, right = bucket_edges(keys, hashes.reshape(-1, 1))
        if job.params.verify:  # to the split of the left key, where its signature is
            _route_by_split(job, "verify_in", part, pa.table({"left": left, "right": right}, schema=CANDIDATE_SCHEMA), "left")
        else:
            components.write_edges(job.work, "cc/r000", f"from-{part:05d}", left, right, components.round_op(0),
                                   cc_partitions)
        return {"edges": len(left)}

    return _json_record(job.work, f"buckets/done/p={part:05d}.json", compute)


# -- stage 4b: verify ----------------------------------------------------------------------------
def _signatures_of(job: _Job, split_index: int, keys: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The signatures of ``keys`` (all of one split's signed documents), in the order of ``keys``."""
    sigs = job.work.read_table(f"sigs/s={split_index:05d}.parquet", ["key", "signature"])
    where = pc.index_in(keys, value_set=sigs["key"].combine_chunks())
    if where.null_count:
        raise DedupError(f"split {split_index}: a candidate edge names a document without a signature")
    column = sigs["signature"].take(where)
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _verify_left(job: _Job, split_index: int) -> dict[str, Any]:
    """Hop 1: candidate edges whose left key is in this split get its signature, then go to the right key's split."""

    def compute() -> dict[str, Any]:
        edges = job.work.read_folder(f"verify_in/s={split_index:05d}", CANDIDATE_SCHEMA)
        edges = edges.sort_by([("left", "ascending"), ("right", "ascending")])
        edges = edges.append_column("left_signature", _signatures_of(job, split_index, edges["left"]))
        _route_by_split(job, "verify_right", split_index, edges, "right")
        return {"candidates": edges.num_rows}

    return _json_record(job.work, f"verify/left/s={split_index:05d}.json", compute)


def _verify_right(job: _Job, split_index: int, cc_partitions: int) -> dict[str, Any]:
    """Hop 2: the right key's signature; edges at or above the threshold enter connected components."""

    def compute() -> dict[str, Any]:
        from dedup.lsh import estimated_jaccard

        num_perm = job.params.num_perm
        schema = CANDIDATE_SCHEMA.append(pa.field("left_signature", pa.list_(pa.uint64(), num_perm)))
        edges = job.work.read_folder(f"verify_right/s={split_index:05d}", schema)
        left, right = edges["left"].to_numpy(), edges["right"].to_numpy()
        if edges.num_rows:
            similar = estimated_jaccard(list_matrix(edges["left_signature"], num_perm),
                                        list_matrix(_signatures_of(job, split_index, edges["right"]), num_perm))
            close = similar >= job.params.threshold  # the test dedup.verify_edges applies
            left, right = left[close], right[close]
        components.write_edges(job.work, "cc/r000", f"from-{split_index:05d}", left, right, components.round_op(0),
                               cc_partitions)
        return {"candidates": edges.num_rows, "edges": int(left.size)}

    return _json_record(job.work, f"verify/right/s={split_index:05d}.json", compute)


def _verify(job: _Job, cc_partitions: int) -> dict[str, int]:
    indices = job.all_split_indices  # --against pseudo-splits hold signatures too
    _map_splits(_verify_left, job, indices)
    records = _map_splits(lambda j, i: _verify_right(j, i, cc_partitions), job, indices)
    return {"candidates": sum(r["candidates"] for r in records), "verified": sum(r["edges"] for r in records)}


# -- stage 6: clusters ---------------------------------------------------------------------------
def _cluster_map(job: _Job, split_index: int) -> dict[str, Any]:
    def compute() -> dict[str, Any]:
        labels = job.work.read_folder(f"labels/s={split_index:05d}", components.LABEL_SCHEMA)
        sig_schema = _sig_schema(job.params.num_perm, job.params.bands)
        if labels.num_rows == 0:
            rows = sig_schema.empty_table().append_column("label", pa.array([], pa.int64()))
        else:
            sigs = job.work.read_table(f"sigs/s={split_index:05d}.parquet")
            where = pc.index_in(labels["key"], value_set=sigs["key"].combine_chunks())
            rows = sigs.take(where).append_column("label", labels["label"])
        rows = rows.select(["key", "id", "length", "copies", "existing", "signature", "label"])
        job.work.write_partitioned("reps_in", f"s={split_index:05d}", rows,
                                   partition_of(rows["label"].to_numpy(), job.num_partitions), job.num_partitions)
        return {"members": rows.num_rows}

    return _json_record(job.work, f"clusters/map/s={split_index:05d}.json", compute)


def _cluster_reduce(job: _Job, part: int) -> dict[str, Any]:
    def compute() -> dict[str, Any]:
        from dedup.cluster import choose_representatives
        from dedup.lsh import estimated_jaccard

        schema = pa.schema([("key", pa.int64()), ("id", pa.string()), ("length", pa.int64()),
                            ("copies", pa.int64()), ("existing", pa.bool_()),
                            ("signature", pa.list_(pa.uint64(), job.params.num_perm)), ("label", pa.int64())])
        table = job.work.read_folder(f"reps_in/p={part:05d}", schema)
        table = table.sort_by([("label", "ascending"), ("key", "ascending")])
        labels = table["label"].to_numpy()
        keys = table["key"].to_numpy()
        is_rep, rep_index = choose_representatives(
            labels, table["length"].to_numpy(), table["id"], priority=table["existing"].to_numpy(zero_copy_only=False))
        rep_index = np.asarray(rep_index, dtype=np.int64)
        signatures = list_matrix(table["signature"], job.params.num_perm)
        similarity = estimated_jaccard(signatures, signatures[rep_index]) if len(keys) else np.zeros(0)
        _, inverse = np.unique(labels, return_inverse=True)
        sizes = np.bincount(inverse, weights=table["copies"].to_numpy()).astype(np.int64) if len(keys) else inverse
        ids = table["id"].to_pylist()
        out = pa.table({
            "key": pa.array(keys, pa.int64()), "cluster_id": [ids[i] for i in rep_index],
            "cluster_size": pa.array(sizes[inverse] if len(keys) else sizes, pa.int64()),
            "rep_key": pa.array(keys[rep_index], pa.int64()), "rep_id": [ids[i] for i in rep_index],
            "similarity": pa.array(similarity, pa.float64()),
        }, schema=CLUSTER_OUT_SCHEMA)
        _write_by_split(job, "clusters_out", part, out)
        return {"clusters": int(np.count_nonzero(is_rep)), "near_duplicates": int(len(keys) - np.count_nonzero(is_rep))}

    return _json_record(job.work, f"clusters/done/p={part:05d}.json", compute)


def _exact_clusters(job: _Job, split_index: int) -> dict[str, Any]:
    """Exact copies of this split's survivors that ended in a near cluster: that cluster's id and size.

    Routed to the copy's split (``exact_clusters/s=S/p=R.parquet``), so an exact copy of a document
    that was itself removed as a near duplicate names the final representative, not its twin.
    """

    def compute() -> dict[str, Any]:
        copies = job.work.read_folder(f"exact_by_rep/s={split_index:05d}", EXACT_BY_REP_SCHEMA)
        clusters = job.work.read_folder(f"clusters_out/s={split_index:05d}", CLUSTER_OUT_SCHEMA)
        members = clusters["key"].combine_chunks()
        copies = copies.filter(pc.is_in(copies["rep_key"], value_set=members))
        copies = copies.sort_by([("key", "ascending")])
        where = pc.index_in(copies["rep_key"], value_set=members)
        out = pa.table({"key": copies["key"], "cluster_id": clusters["cluster_id"].take(where),
                        "cluster_size": clusters["cluster_size"].take(where)}, schema=EXACT_CLUSTER_SCHEMA)
        _route_by_split(job, "exact_clusters", split_index, out, "key")
        return {"copies": out.num_rows}

    return _json_record(job.work, f"clusters/exact/s={split_index:05d}.json", compute)


def _clusters(job: _Job, run_tasks: Callable[..., list[Any]]) -> list[dict[str, Any]]:
    _map_splits(_cluster_map, job, job.all_split_indices)
    reduced = run_tasks(_cluster_reduce, [(job, p) for p in range(job.num_partitions)])
    _map_splits(_exact_clusters, job, job.all_split_indices)
    return reduced


# -- stage 7: write ------------------------------------------------------------------------------
def _write_split(job: _Job, split_index: int) -> dict[str, Any]:
    return _json_record(job.work, f"write/done/s={split_index:05d}.json", lambda: _write_split_now(job, split_index))


def _write_split_now(job: _Job, split_index: int) -> dict[str, Any]:
    config = job.config
    docs_file = f"docs/s={split_index:05d}.parquet"
    docs = job.work.read_table(docs_file, ["key", "id", "origin", "domain", "language"])  # no text
    exact = job.work.read_folder(f"exact_out/s={split_index:05d}", EXACT_OUT_SCHEMA)
    clusters = job.work.read_folder(f"clusters_out/s={split_index:05d}", CLUSTER_OUT_SCHEMA)
    n = docs.num_rows
    keys = docs["key"].to_numpy()
    ids = docs["id"].to_pylist()
    status = np.zeros(n, np.int8)  # 0 kept, 1 exact duplicate, 2 near duplicate
    cluster_id = list(ids)
    cluster_size = np.ones(n, np.int64)
    duplicate_of: list[str | None] = [None] * n
    similarity = np.full(n, np.nan)

    exact_pos = _positions(keys, exact["key"].to_numpy())
    rep_keys = exact["rep_key"].to_numpy()
    rep_ids = exact["rep_id"].to_pylist()
    copies = exact["copies"].to_numpy()
    for row, pos in enumerate(exact_pos):
        cluster_size[pos] = copies[row]  # the exact group, unless a near cluster holds its survivor (below)
        if rep_keys[row] != keys[pos]:
            status[pos] = 1
            duplicate_of[pos] = cluster_id[pos] = rep_ids[row]
            similarity[pos] = 1.0
    cluster_pos = _positions(keys, clusters["key"].to_numpy())
    c_rep = clusters["rep_key"].to_numpy()
    c_id = clusters["cluster_id"].to_pylist()
    c_size = clusters["cluster_size"].to_numpy()
    c_sim = clusters["similarity"].to_numpy()
    c_rep_id = clusters["rep_id"].to_pylist()
    for row, pos in enumerate(cluster_pos):
        cluster_id[pos] = c_id[row]
        cluster_size[pos] = c_size[row]
        if c_rep[row] != keys[pos]:
            status[pos] = 2
            duplicate_of[pos] = c_rep_id[row]
            similarity[pos] = c_sim[row]
    # exact copies whose survivor is in a near cluster: that cluster's representative and size
    # (duplicate_of stays the exact twin, the document the copy's text is identical to)
    resolved = job.work.read_folder(f"exact_clusters/s={split_index:05d}", EXACT_CLUSTER_SCHEMA)
    resolved_ids = resolved["cluster_id"].to_pylist()
    resolved_sizes = resolved["cluster_size"].to_numpy()
    for row, pos in enumerate(_positions(keys, resolved["key"].to_numpy())):
        cluster_id[pos] = resolved_ids[row]
        cluster_size[pos] = resolved_sizes[row]

    kept_mask = status == 0

    def shard_writer(url: str, schema: pa.Schema, prefix: str) -> ShardWriter:
        # kept and removed shards never share a name, even if both folders were one
        return ShardWriter(url, schema, shard_bytes=config.shard_bytes, row_group_bytes=config.row_group_bytes,
                           name_prefix=f"{prefix}-{split_index:05d}", run_id=job.fingerprint[:12],
                           storage_options=config.storage_options)

    writer = shard_writer(config.output, CORPUS_SCHEMA, "part")
    removed_writer = shard_writer(config.removed, REMOVED_SCHEMA, "removed") if config.removed else None
    from dedup.core import STATUSES

    removed_as = np.array(STATUSES)[status]
    text_bytes = np.zeros(n, np.int64)
    start = 0
    # the text one row group (one read batch) at a time: a task never holds the split's texts
    for group in job.work.read_row_groups(docs_file, ["id", "text", "source", "domain", "language", "fetch_time",
                                                      "content_hash"]):
        rows = slice(start, start + group.num_rows)
        start += group.num_rows
        text_bytes[rows] = pc.binary_length(group["text"]).to_numpy()
        base = group.append_column("cluster_id", pa.array(cluster_id[rows], pa.string()))
        base = base.append_column("cluster_size", pa.array(cluster_size[rows], pa.int32()))
        keep = kept_mask[rows]
        writer.write(base.filter(pa.array(keep)).append_column(
            "is_representative", pa.array(np.ones(int(keep.sum()), bool))))
        if removed_writer is not None:
            gone = ~keep
            removed = base.filter(pa.array(gone))
            removed = removed.append_column("is_representative", pa.array(np.zeros(int(gone.sum()), bool)))
            removed = removed.append_column("removed_as", pa.array(removed_as[rows][gone].tolist(), pa.string()))
            removed = removed.append_column("duplicate_of", pa.array(
                [d for d, g in zip(duplicate_of[rows], gone, strict=True) if g], pa.string()))
            removed = removed.append_column("similarity", pa.array(similarity[rows][gone], pa.float64()))
            removed_writer.write(removed)
    shards = [s.to_dict() for s in writer.close()]
    removed_shards = [s.to_dict() for s in removed_writer.close()] if removed_writer is not None else []
    _write_index(job, split_index, keys[kept_mask])
    return {"shards": shards, "removed_shards": removed_shards,
            "stats": _split_stats(job, split_index, docs, status, cluster_size, text_bytes)}


def _positions(keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row of each wanted key in the (sorted) key column of a split's documents."""
    return np.searchsorted(keys, wanted)


def _write_index(job: _Job, split_index: int, kept_keys: np.ndarray) -> None:
    """The signature index of the kept rows, beside the corpus, for later ``--against`` runs."""
    sigs = job.work.read_table(f"sigs/s={split_index:05d}.parquet")
    sigs = sigs.filter(pc.is_in(sigs["key"], value_set=pa.array(kept_keys, pa.int64())))
    index = sigs.select(["id", "content_hash", "length", "signature", "bands"])
    name = f"{INDEX_FOLDER}/index-{split_index:05d}-{job.fingerprint[:12]}.parquet"
    WorkDir(job.config.output, job.config.storage_options).write_table(name, index)


def _split_stats(job: _Job, split_index: int, docs: pa.Table, status: np.ndarray,
                 cluster_size: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
    """Counts, bytes and breakdowns of one split (``lengths``: UTF-8 bytes per document); the driver adds them up."""
    from dedup.core import STATUSES

    rejects = job.work.read_table(f"rejects/s={split_index:05d}.parquet")
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


# -- driver --------------------------------------------------------------------------------------
def _merge(total: dict[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    """Add nested count dicts key by key."""
    for key, value in part.items():
        if isinstance(value, Mapping):
            total[key] = _merge(dict(total.get(key, {})), value)
        else:
            total[key] = total.get(key, 0) + value
    return total


def _fingerprint(config: DedupConfig, params: IndexParams, splits: list[Split], index_files: list[str]) -> str:
    """What the result depends on; a work folder from another job is discarded, not mixed in."""
    payload = {
        "files": [[f.url, f.size] for s in splits for f in s.files], "splits": [len(s.files) for s in splits],
        "params": dataclasses.asdict(params), "index": index_files, "text_column": config.text_column,
        "id_column": config.id_column, "max_doc_bytes": config.max_doc_bytes, "removed": config.removed,
        "shard_bytes": config.shard_bytes, "row_group_bytes": config.row_group_bytes,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _against(config: DedupConfig, params: IndexParams) -> list[str]:
    """The index files of an existing corpus, after checking it was hashed the same way."""
    try:
        corpus = Corpus.open(config.against, config.storage_options)
    except CorpusError as exc:
        raise DedupError(f"--against: {exc}") from None
    index = corpus.manifest.extra.get("signature_index")
    if not isinstance(index, Mapping) or not isinstance(index.get("params"), Mapping):
        raise DedupError(f"--against {config.against}: the corpus has no signature index (not built by gristmill dedup)")
    theirs = index["params"]
    ours = dataclasses.asdict(params)
    for name in ("num_perm", "ngram", "bands", "rows", "seed"):
        if theirs.get(name) != ours[name]:
            hint = ""
            if name in ("bands", "rows") and bool(theirs.get("verify", False)) != params.verify:
                # the default bands differ with and without verification; the index's own are what matter
                hint = (f" (the index was built {'with' if theirs.get('verify') else 'without'} edge verification: "
                        f"pass --bands {theirs.get('bands')} --rows {theirs.get('rows')}"
                        f"{'' if theirs.get('verify') else ', or --no-verify'})")
            raise DedupError(f"--against {config.against}: its index was built with {name}={theirs.get(name)}, "
                             f"this job uses {name}={ours[name]}; use the same settings{hint}")
    files = index.get("files")
    if not isinstance(files, list):
        raise DedupError(f"--against {config.against}: its manifest's signature index lists no files")
    try:
        paths = [corpus.member_path(name, "signature index file") for name in files]
    except CorpusError as exc:
        raise DedupError(f"--against: {exc}") from None
    protocol = config.against.split("://", 1)[0] + "://" if "://" in config.against else ""
    return [path if not protocol or path.startswith(protocol) else protocol + path for path in paths]


def _make_runner(ray: Any) -> Callable[..., list[Any]]:
    """Ray tasks for the shuffle reducers: one task per partition, retried when a node dies."""

    def run_tasks(function: Callable[..., Any], argument_lists: list[tuple[Any, ...]]) -> list[Any]:
        remote = ray.remote(num_cpus=1, max_retries=5, retry_exceptions=False)(function)
        return ray.get([remote.remote(*arguments) for arguments in argument_lists])

    return run_tasks


def _map_splits(function: Callable[[_Job, int], dict[str, Any]], job: _Job, indices: list[int]) -> list[dict[str, Any]]:
    """A per-split stage: one Ray task per split, retried when its node dies.

    Plain tasks rather than Ray Data: each split is one opaque unit whose data goes through the work
    folder, and Ray Data's executor cost 3 s of start-up and two helper actors (~240 MB) per job here
    for nothing it does (docs/BENCHMARKS.md, pipeline).
    """
    import ray

    return _make_runner(ray)(function, [(job, i) for i in indices]) if indices else []


def job_stages(config: DedupConfig) -> tuple[str, ...]:
    """The stages ``run_dedup`` runs for ``config``, in order (``verify`` only when verifying)."""
    return STAGES if config.verify else tuple(stage for stage in STAGES if stage != "verify")


def run_dedup(config: DedupConfig, on_stage: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the whole job (initialising local Ray if nothing is connected); returns the manifest stats.

    ``on_stage(name)`` is called as each stage of ``job_stages(config)`` finishes or is found finished (resume),
    for progress bars.
    """
    import ray

    if (config.num_partitions is not None and config.num_partitions < 1) or config.split_bytes < 1:
        raise DedupError("num_partitions and split_bytes must be positive")
    started = time.time()
    params = _params(config)
    files = resolve_inputs(config.inputs, config.storage_options)
    index_files = _against(config, params) if config.against else []
    splits = plan_splits(files, config.split_bytes, first_index=len(index_files))
    # Shuffles carry ~100 bytes per document, not text: size them by input bytes, not by splits (one
    # partition per split made splits x partitions tiny files, about a millisecond of CPU each).
    input_bytes = sum(s.bytes for s in splits)
    partitions = config.num_partitions or max(2, min(64, -(-input_bytes // PARTITION_INPUT_BYTES) + len(index_files)))
    fingerprint = _fingerprint(config, params, splits, index_files)  # names the output files
    finished = _claim_folders(config, files, fingerprint)
    if finished is not None:  # this very job committed already: re-running it is an idempotent resume
        _remove_stale(config, finished)
        if on_stage is not None:
            for name in job_stages(config):
                on_stage(name)
        return finished.stats
    work = WorkDir(posixpath.join(config.output.rstrip("/"), WORK_FOLDER), config.storage_options)
    previous = work.read_json("job.json")
    identity = {"fingerprint": fingerprint, "partitions": partitions}  # the shuffles depend on both
    if previous is not None and previous != identity:
        log.info("work folder %s belongs to a different job; starting afresh", work.url)
        work.remove("")
    work.write_json("job.json", identity)
    job = _Job(config, params, work, splits, index_files, fingerprint, partitions)

    if not ray.is_initialized():
        # RAY_ADDRESS (set by `ray job submit`) joins that cluster; otherwise start a private local Ray
        # rather than attach to whatever cluster this machine happens to run.
        address = os.environ.get("RAY_ADDRESS") or "local"
        local = {"include_dashboard": False} if address == "local" else {}  # the dashboard costs seconds
        if address == "local":
            for name, value in WORKER_ALLOCATOR_ENV.items():  # inherited by the workers this starts
                os.environ.setdefault(name, value)
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False, **local)
    run_tasks = _make_runner(ray)
    timings: dict[str, float] = dict(work.read_json("timings.json") or {})
    resumed: list[str] = []

    def stage(name: str, body: Callable[[], Any]) -> Any:
        record = work.read_json(f"stage-{name}.json")
        if record is not None:
            resumed.append(name)
            result = record["result"]
        else:
            begin = time.time()
            result = body()
            timings[name] = round(time.time() - begin, 3)
            work.write_json("timings.json", timings)
            work.write_json(f"stage-{name}.json", {"result": result})
        if on_stage is not None:
            on_stage(name)
        return result

    parts = list(range(job.num_partitions))
    stage("read", lambda: _map_splits(_read_index_split, job, list(range(len(index_files))))
          + _map_splits(_read_split, job, job.split_indices))
    stage("exact", lambda: run_tasks(_exact_partition, [(job, p) for p in parts]))
    signed = sum(r["signed"] for r in stage("sign", lambda: _map_splits(_sign_split, job, job.split_indices)))
    # Edges are few next to documents: size the components' partitions by the band rows they can come
    # from, so small jobs do not pay for many tiny tasks per round (the labels do not depend on it).
    cc_parts = max(1, min(job.num_partitions, -(-signed * params.bands // CC_ROWS_PER_PARTITION)))
    buckets = stage("buckets", lambda: run_tasks(_bucket_partition, [(job, p, cc_parts) for p in parts]))
    edges = {"candidates": sum(r["edges"] for r in buckets)}
    if params.verify:
        edges = stage("verify", lambda: _verify(job, cc_parts))
    cc = stage("cc", lambda: components.connected_components(work, cc_parts, run_tasks, KEY_BITS))
    stage("clusters", lambda: _clusters(job, run_tasks))
    written = stage("write", lambda: _map_splits(_write_split, job, job.split_indices))

    totals: dict[str, Any] = {}
    for record in written:
        _merge(totals, record["stats"])
    stats = _final_stats(totals, timings, resumed, {**cc, **edges}, params, config, time.time() - started)
    shards = [ShardInfo.from_dict(s) for record in written for s in record["shards"]]
    index_names = [f"{INDEX_FOLDER}/index-{i:05d}-{fingerprint[:12]}.parquet" for i in job.split_indices]
    extra = {"signature_index": {"files": index_names, "params": dataclasses.asdict(params)},
             "rejects": f"{REJECTS_FOLDER}/rejects-{fingerprint[:12]}.parquet", "job": _job_summary(config),
             JOB_FINGERPRINT_KEY: fingerprint}
    _collect_rejects(job, extra["rejects"])
    if config.removed:
        removed_shards = [ShardInfo.from_dict(s) for record in written for s in record["removed_shards"]]
        write_manifest(config.removed, removed_shards, REMOVED_SCHEMA, stats=stats,
                       extra={"removed_from": config.output, JOB_FINGERPRINT_KEY: fingerprint},
                       storage_options=config.storage_options)
    committed = write_manifest(config.output, shards, CORPUS_SCHEMA, stats=stats, extra=extra,
                               storage_options=config.storage_options)
    _remove_stale(config, Corpus(config.output, committed, *open_fs(config.output, config.storage_options)))
    if not config.keep_work:
        work.remove("")
    return stats


def _claim_folders(config: DedupConfig, files: list[InputFile], fingerprint: str) -> Corpus | None:
    """Check the folders before any work (``pipeline.job.folders``); the committed corpus if this job finished."""
    outputs = {"-o": config.output, "--removed": config.removed, "--against": config.against}
    # a folder INPUT is walked (and a ** glob's fixed prefix is): nothing may be written inside it
    inputs = [(spec, _walked_folder(spec)) for spec in config.inputs]
    inputs = [(spec, folder) for spec, folder in inputs if folder and _is_folder(folder, config)]
    inputs += [(f.origin, f.url) for f in files]
    try:
        check_disjoint(outputs, inputs, config.storage_options)
        finished = claim(config.output, fingerprint, config.overwrite, "-o", config.storage_options)
        if config.removed:
            claim(config.removed, fingerprint, config.overwrite, "--removed", config.storage_options)
    except FolderError as exc:
        raise DedupError(str(exc)) from None
    return finished


def _walked_folder(spec: str) -> str | None:
    """The folder an INPUT makes the job search: itself, or the part of a ``**`` glob before the pattern."""
    if not any(ch in spec for ch in "*?["):
        return spec
    if "**" not in spec:
        return None
    return spec[: min(spec.index(ch) for ch in "*?[" if ch in spec)].rsplit("/", 1)[0] or "."


def _is_folder(url: str, config: DedupConfig) -> bool:
    fs, root = open_fs(url, config.storage_options)
    return fs.isdir(root)


def _remove_stale(config: DedupConfig, corpus: Corpus) -> None:
    """After the commit: files of ours that the new manifests do not list (an earlier job's) go."""
    removed = remove_unlisted(config.output, corpus.manifest, config.storage_options)
    if config.removed:
        removed_corpus = Corpus.open(config.removed, config.storage_options)
        removed += remove_unlisted(config.removed, removed_corpus.manifest, config.storage_options)
    if removed:
        log.info("removed %d files no manifest lists (an earlier job's)", len(removed))


def _collect_rejects(job: _Job, name: str) -> None:
    """All rejected records in one Parquet file beside the corpus (file, position, reason)."""
    tables = [job.work.read_table(f"rejects/s={i:05d}.parquet") for i in job.split_indices]
    table = pa.concat_tables(tables) if tables else REJECT_SCHEMA.empty_table()
    WorkDir(job.config.output, job.config.storage_options).write_table(name, table)


def _job_summary(config: DedupConfig) -> dict[str, Any]:
    summary = dataclasses.asdict(config)
    summary.pop("storage_options")
    return summary


def _final_stats(totals: dict[str, Any], timings: Mapping[str, float], resumed: list[str], cc: Mapping[str, Any],
                 params: IndexParams, config: DedupConfig, wall: float) -> dict[str, Any]:
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
