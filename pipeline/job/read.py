"""Stage ``read``, per split: parse the input, reject bad records, normalise and hash each document,
sign each content hash new to the split, write the documents.

An ``--against`` index file enters as a pseudo-split: its rows, with the signatures they already
have, join the exact and band shuffles (from ``sigs/``, as a signed split's do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from gristmill.pipeline.format import REJECT_SCHEMA, index_schema, open_fs
from gristmill.pipeline.format.signature_index import fixed_list
from gristmill.pipeline.job import extras
from gristmill.pipeline.job.datasets import (
    DOC_SCHEMA,
    DOCS,
    HASH_SIGNATURES,
    LINES_DONE,
    READ_DONE,
    REJECTS,
    SIGNATURES,
    hash_signature_schema,
    sig_schema,
)
from gristmill.pipeline.job.inputs import (
    KEY_BITS,
    Doc,
    ReadOptions,
    Reject,
    Split,
    fetch_counted,
    generated_id,
    needs_line_count,
    number_lines,
    read_piece,
)
from gristmill.pipeline.job.keys import check_split_rows
from gristmill.pipeline.job.tasks import Job, job_runner, run_once

# Text per batch, one row group of a split's documents: a worker holds one at a time (8 MiB cost
# 47 MB more per worker at the same CPU).
BATCH_BYTES = 4 * 1024 * 1024


def run_read(job: Job, splits: Sequence[Split]) -> list[dict[str, Any]]:
    """The stage's tasks for the new input: the newlines of cut JSONL files first (a task per split
    holding such a piece, reading only those bytes), so each later piece knows its first line number;
    then one read task per split, each sent its own split and, on an object store, the bytes the count
    fetched (through Ray's object store, which spills to local disk past its size): a cut file is
    downloaded once."""
    counting = [s for s in splits if any(needs_line_count(p) for p in s.pieces)]
    fetched: dict[int, Sequence[Any]]
    if job.in_process:  # a small job: the counts, and the bytes they fetched, right here
        fetched = {s.index: fetch_lines(job, s) for s in counting}
        counted = [results[0] for results in fetched.values()]
    else:
        import ray

        fetch = ray.remote(num_cpus=1, max_retries=5, retry_exceptions=False)(fetch_lines)
        fetched = {s.index: fetch.options(num_returns=1 + sum(map(needs_line_count, s.pieces))).remote(
            job.reference(), s) for s in counting}
        counted = ray.get([refs[0] for refs in fetched.values()])
    numbered = number_lines(splits, {r["split"]: r["newlines"] for r in counted})
    return job_runner(job)(read_split, [(job, split, *fetched.get(split.index, [None])[1:]) for split in numbered])


def fetch_lines(job: Job, split: Split) -> tuple[Any, ...]:
    """Before the read, once: the newlines of the split's pieces that a later piece of their file numbers
    its lines from (``inputs.number_lines``), as ``{"split": index, "newlines": [count or None per
    piece]}``, then the bytes counted of each such piece (None on a local disk, or when the count was
    done by an earlier run: the read fetches them itself)."""
    kept: list[Any] = [None] * sum(map(needs_line_count, split.pieces))

    def compute() -> dict[str, Any]:
        newlines: list[int | None] = []
        for piece in split.pieces:
            count = None
            if needs_line_count(piece):
                count, kept[len(newlines) - newlines.count(None)] = fetch_counted(piece, job.config.storage_options)
            newlines.append(count)
        return {"split": split.index, "newlines": newlines}

    return (run_once(job.work, LINES_DONE.split(split.index), compute), *kept)


def read_split(job: Job, split: Split, *prefetched: Any) -> dict[str, Any]:
    """One split of the input (the task's own argument), once: ``{"docs": read, "rejected": records rejected}``.
    ``prefetched``: the bytes :func:`fetch_lines` counted, one per piece it counted."""
    if prefetched:
        given = iter(prefetched)
        split = dataclasses.replace(split, pieces=tuple(
            dataclasses.replace(p, prefetched=next(given)) if needs_line_count(p) else p for p in split.pieces))
    return run_once(job.work, READ_DONE.split(split.index), lambda: _read_split_now(job, split))


def _read_split_now(job: Job, split: Split) -> dict[str, Any]:
    """Parse, hash, sign and write the split one ~BATCH_BYTES batch (one row group) at a time, so a task
    holds a batch of documents, not the split; only one signature per distinct text is kept for the
    whole split."""
    split_index = split.index
    rejects: list[tuple[Reject, str]] = []
    signed: list[pa.Table] = []
    seen: set[str] = set()  # content hashes of the split already signed
    hasher = job.params.hasher()
    ordinal = 0
    columns = extras.ColumnTypes()  # the input's own columns, carried beside the documents file
    with job.work.table_writer(DOCS.file(split_index), DOC_SCHEMA) as writer:
        number = 0  # batches written: batch ``number`` is row group ``number`` of the documents file
        for batch in _document_batches(job, split, rejects):
            batch, prefolded, hashes = _visible(batch, hasher.normalize, rejects)
            if not batch:
                continue
            check_split_rows(ordinal + len(batch), f"split {split_index} ({split.pieces[0].file.url}, ...)")
            table, signatures = _document_table(split_index, ordinal, batch, prefolded, hashes, hasher, seen,
                                                job.preference.keys)
            writer.write_table(table, row_group_size=table.num_rows)
            extras.write_batch(job.work, split_index, number, extras.batch_table([d for d, _ in batch], columns))
            number += 1
            signed.append(signatures)
            ordinal += table.num_rows
    hash_schema = hash_signature_schema(job.params.num_perm)
    job.work.write_table(HASH_SIGNATURES.file(split_index),
                         pa.concat_tables(signed) if signed else hash_schema.empty_table())
    reject_table = pa.table({
        "source": [r.source for r, _ in rejects], "position": [r.position for r, _ in rejects],
        "kind": [r.kind for r, _ in rejects], "reason": [r.reason for r, _ in rejects],
        "bytes": [r.bytes for r, _ in rejects], "count": [r.count for r, _ in rejects],
        "origin": [o for _, o in rejects],
    }, schema=REJECT_SCHEMA)
    job.work.write_table(REJECTS.file(split_index), reject_table)
    return {"docs": ordinal, "rejected": sum(r.count for r, _ in rejects), "bytes": split.bytes,
            "split": split_index, "columns": extras.save_split_types(job.work, split_index, columns)}


def _document_batches(job: Job, split: Split, rejects: list[tuple[Reject, str]]) -> Iterator[list[tuple[Doc, str]]]:
    """The split's documents (with the INPUT that named each) in batches of about BATCH_BYTES (``_held_bytes``);
    rejected records go to ``rejects``. A document without an id gets one from its file and position,
    which a cut file gives as a whole one does."""
    config = job.config
    options = ReadOptions(config.text_column, config.id_column, config.max_doc_bytes, job.preference.input_column)
    batch: list[tuple[Doc, str]] = []
    size = 0
    for piece in split.pieces:
        item = piece.file
        for record in read_piece(piece, options, config.storage_options):
            if isinstance(record, Reject):
                rejects.append((record, item.origin))
                continue
            if record.id is None:
                record.id = generated_id(item.url, record.position)
            batch.append((record, item.origin))
            size += _held_bytes(record)
            if size >= BATCH_BYTES:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _held_bytes(doc: Doc) -> int:
    """What a document held in a batch costs: its text, its URL and the columns it carries (its share
    of a Parquet slice, a JSONL record's strings), so a file whose small texts come with a 1 MiB URL or
    field each (a dictionary bomb, a compressed JSONL file) makes batches of a few documents, not a
    batch of gigabytes."""
    size = len(doc.text) + len(doc.url or "")
    extra = doc.extra
    if extra is None:
        return size
    if extra.table is not None:
        return size + extra.table.nbytes // max(extra.table.num_rows, 1)
    return size + sum(len(value) for value in (extra.values or {}).values() if isinstance(value, str))


def _visible(batch: list[tuple[Doc, str]], options: Any,
             rejects: list[tuple[Reject, str]]) -> tuple[list[tuple[Doc, str]], pa.LargeStringArray, list[str]]:
    """The batch without the documents that normalise to nothing (only white space and invisible
    characters: ``gristmill.dedup.normalize.is_blank``), each rejected as ``empty``; the kept documents'
    texts after normalisation steps 0-2 (compiled: ``prefold_batch``) and their content hashes."""
    from gristmill.dedup.normalize import fold_prepared, hashes_of_folded, is_blank, prefold_batch

    data, offsets = prefold_batch(pa.array([d.text for d, _ in batch], pa.large_string()), options)
    prefolded = pa.LargeStringArray.from_buffers(len(batch), pa.py_buffer(offsets), pa.py_buffer(data))
    folded, folded_offsets = fold_prepared(data, offsets, options)
    hashes = hashes_of_folded(folded, folded_offsets)
    # a blank text folds to nothing when runs of white space are collapsed; then only those need a look
    maybe_blank = np.flatnonzero(np.diff(folded_offsets) == 0) if options.whitespace else range(len(batch))
    blank = {int(i) for i in maybe_blank if is_blank(prefolded[int(i)].as_py())}
    if not blank:
        return batch, prefolded, hashes
    for i in sorted(blank):
        doc, origin = batch[i]
        rejects.append((Reject(doc.source, doc.position, "empty",
                               "no text once normalised: only white space and invisible characters",
                               len(doc.text.encode("utf-8"))), origin))
    kept = [i for i in range(len(batch)) if i not in blank]
    return [batch[i] for i in kept], prefolded.take(pa.array(kept, pa.int64())), [hashes[i] for i in kept]


def _document_table(split_index: int, first: int, batch: list[tuple[Doc, str]], prefolded: pa.LargeStringArray,
                    hashes: list[str], hasher: Any, seen: set[str],
                    preference: Callable[[list[Doc]], np.ndarray]) -> tuple[pa.Table, pa.Table]:
    """One batch (its texts after ``prefold`` and content hashes: ``_visible``) as rows of the split's
    documents file (keys from ``first`` on, the survivor policy's key of each document by
    ``preference``), and the MinHash signature of each content hash not in ``seen`` (then added to it).

    Signing here, from the batch normalised for the content hash, spares the sign stage a second read
    and normalisation of every text. Equal content hashes mean equal normalised texts, hence equal
    token sequences and signatures, so one signature per hash serves every exact copy.
    """
    from gristmill.dedup.normalize import utf8_buffers

    docs = [d for d, _ in batch]
    texts = [d.text for d in docs]
    new = []
    for i, content_hash in enumerate(hashes):
        if content_hash not in seen:
            seen.add(content_hash)
            new.append(i)
    if len(new) < len(hashes):
        prefolded = prefolded.take(pa.array(new, pa.int64()))
    signatures = (hasher.signatures_prepared(*utf8_buffers(prefolded))[0] if new
                  else np.zeros((0, hasher.num_perm), np.uint64))
    keys = (np.int64(split_index) << np.int64(KEY_BITS)) + np.arange(first, first + len(docs), dtype=np.int64)
    table = pa.table({
        "key": pa.array(keys, pa.int64()), "id": [d.id for d in docs], "text": texts,
        "source": [d.source for d in docs], "domain": [d.domain for d in docs],
        "language": [d.language for d in docs], "fetch_time": [d.fetch_time for d in docs],
        "content_hash": hashes,
        "length": [len(t) for t in texts],  # characters: the survivor choice's tie-break after "prefer"
        "origin": [o for _, o in batch], "prefer": pa.array(preference(docs), pa.int64()),
    }, schema=DOC_SCHEMA)
    signed = pa.table({"content_hash": [hashes[i] for i in new], "signature": fixed_list(signatures)},
                      schema=hash_signature_schema(hasher.num_perm))
    return table, signed


def read_index_split(job: Job, split_index: int) -> dict[str, Any]:
    """--against: an existing corpus's index file as a pseudo-split's signed documents (``sigs/``)."""

    def compute() -> dict[str, Any]:
        url = job.index_files[split_index].url
        index = read_index_file(job, url)
        check_split_rows(index.num_rows, f"--against index file {url}")
        keys = (np.int64(split_index) << np.int64(KEY_BITS)) + np.arange(index.num_rows, dtype=np.int64)
        sigs = pa.table({
            "key": pa.array(keys, pa.int64()), "id": index["id"], "content_hash": index["content_hash"],
            "length": index["length"], "copies": pa.array(np.ones(index.num_rows, np.int64)),
            "existing": pa.array(np.ones(index.num_rows, bool)), "signature": index["signature"],
            "bands": index["bands"],
        }, schema=sig_schema(job.params.num_perm, job.params.bands))
        job.work.write_table(SIGNATURES.file(split_index), sigs)
        return {"docs": index.num_rows}

    return run_once(job.work, READ_DONE.split(split_index), compute)


def read_index_file(job: Job, url: str) -> pa.Table:
    """One ``--against`` signature index file, read with the schema this job's parameters give."""
    import pyarrow.parquet as pq

    fs, path = open_fs(url, job.config.storage_options)
    with fs.open(path, "rb") as handle:
        return pq.read_table(handle, schema=index_schema(job.params.num_perm, job.params.bands))
