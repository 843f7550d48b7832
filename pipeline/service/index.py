"""The live index: exact and LSH lookups over columns (:mod:`gristmill.pipeline.service.columns`), filled from a
corpus's signature index without a loading peak, and exported back as one.

A candidate is a near duplicate when its estimated Jaccard similarity (share of equal signature
values) reaches the index's threshold, the same test the batch job applies; the signatures of the
few candidates are read from the memory-mapped rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.dedup.lsh import band_hashes
from gristmill.pipeline.format.manifest import MANIFEST_NAME, CorpusError
from gristmill.pipeline.format.reader import Corpus
from gristmill.pipeline.format.schemas import index_schema
from gristmill.pipeline.format.signature_index import (
    IndexParams,
    SignatureTable,
    list_matrix,
    listed_index_files,
    params_from_dict,
)
from gristmill.pipeline.service.columns import (
    BUCKET_SHIFT,
    BUCKETS,
    MAX_DOCS,
    ROW_HEAD,
    IdColumn,
    KeyTable,
    RowStore,
    Run,
    hash_hex,
    hash_words,
)

MAX_NEAR_DUPLICATES = 10
LOAD_BATCH_ROWS = 16_384  # rows of an index file read at once (~20 MB): the loading peak above the index itself
EXPORT_ROWS = 1 << 20  # documents per exported index file


class LiveIndex:
    """Exact hashes plus LSH band keys over every document the service knows; see the module doc."""

    def __init__(self, params: IndexParams, rows: RowStore, *, bands: KeyTable | None = None,
                 exact: KeyTable | None = None, ids: IdColumn | None = None, base_count: int = 0) -> None:
        self.params = params
        self.rows = rows
        self.bands = bands or KeyTable()
        self.exact = exact or KeyTable()
        self.ids = ids or IdColumn()
        self.base_count = base_count
        if len(self.ids) != rows.count:
            raise ValueError(f"{len(self.ids)} ids but {rows.count} rows")

    def __len__(self) -> int:
        return self.rows.count

    def lookup(self, digest: str, bands: np.ndarray, signature: np.ndarray) -> tuple[int | None, list[tuple[int, float]]]:
        """The exact twin (if any) and the near duplicates at or above the threshold, most similar first."""
        words = hash_words([digest])[0]
        rows = self.rows.rows
        exact = None
        same_top = self.exact.find(words[:1])
        if same_top.size:
            held = rows[same_top, :2]
            match = same_top[(held[:, 0] == words[0]) & (held[:, 1] == words[1])]
            exact = int(match.min()) if match.size else None
        docs = np.unique(self.bands.find(bands))
        if exact is not None:
            docs = docs[docs != exact]
        if docs.size == 0:
            return exact, []
        sims = (rows[docs, ROW_HEAD:] == signature).mean(axis=1)
        close = sims >= self.params.threshold
        docs, sims = docs[close], sims[close]
        order = np.lexsort((docs, -sims))[:MAX_NEAR_DUPLICATES]
        return exact, [(int(docs[i]), float(sims[i])) for i in order]

    def insert(self, doc_id: str, content_hash: str, length: int, signature: np.ndarray, bands: np.ndarray) -> int:
        """Add one document; returns its position."""
        doc = len(self)
        if doc >= MAX_DOCS:
            raise OverflowError(f"one index holds at most {MAX_DOCS:,} documents; run more shards")
        words = hash_words([content_hash])[0]
        row = np.empty((1, self.rows.width), np.uint64)
        row[0, :2], row[0, 2], row[0, ROW_HEAD:] = words, length, signature
        self.rows.append(row)
        self.bands.add(bands, doc)
        self.exact.add(words[:1], doc)
        self.ids.fresh.append(doc_id)
        return doc

    def truncate(self, size: int) -> None:
        """Take out every document inserted at position ``size`` or later (a batch whose log append
        failed); they are all in the active deltas, since deltas are only frozen between batches."""
        count = len(self) - size
        if count < 0 or count > len(self.ids.fresh):
            raise ValueError(f"cannot truncate to {size}: only the {len(self.ids.fresh)} newest documents can go")
        self.bands.remove_last(count * self.params.bands)
        self.exact.remove_last(count)
        del self.ids.fresh[len(self.ids.fresh) - count :]
        self.rows.truncate(size)

    def freeze(self) -> None:
        """Close the deltas and seal the ids: what a background step or a snapshot starts from."""
        self.bands.freeze()
        self.exact.freeze()
        self.ids.seal()

    def tables(self, chunk: int = EXPORT_ROWS) -> Iterator[SignatureTable]:
        """Everything known, in the persisted index's shape, ``chunk`` documents at a time."""
        self.ids.seal()
        for start in range(0, len(self), chunk):
            stop = min(len(self), start + chunk)
            rows = np.asarray(self.rows.rows[start:stop])
            signatures = np.ascontiguousarray(rows[:, ROW_HEAD:])
            yield SignatureTable(
                ids=self.ids.slice(start, stop).to_pylist(),
                content_hashes=hash_hex(rows[:, :2]),
                lengths=rows[:, 2].astype(np.int64),
                signatures=signatures,
                bands=band_hashes(signatures, self.params.bands, self.params.rows),
            )


# -- loading a corpus's signature index ---------------------------------------------------------
def load_corpus_index(url: str, rows_path: str, part: tuple[int, int] = (0, 1)) -> tuple[IndexParams, LiveIndex]:
    """A corpus's signature index (what ``gristmill dedup`` writes) as a :class:`LiveIndex` whose rows
    go to a new :class:`RowStore` at ``rows_path``; with ``part`` = (k, K) only the documents whose
    content hash's top 64 bits are k modulo K (one shard's).

    Two passes over the index files, one batch in memory at a time: the first counts the keys of
    each main bucket, the second writes rows to ``rows`` and keys into buckets allocated to their
    final size, then each bucket is sorted on its own. The peak above the finished index is one
    batch plus one bucket's sort order, never a second copy of the index.
    """
    corpus = Corpus.open(url)
    index = corpus.manifest.extra.get("signature_index")
    if not isinstance(index, dict):
        raise CorpusError(f"{url}: the corpus has no signature index (not built by gristmill dedup)")
    params = params_from_dict(index.get("params") or {}, f"{url}/{MANIFEST_NAME}")
    files = [f.url for f in listed_index_files(corpus)]
    schema = index_schema(params.num_perm, params.bands)

    def batches(columns: list[str]) -> Iterator[tuple[str, pa.RecordBatch]]:
        for path in files:
            try:
                with corpus.fs.open(path, "rb") as handle:
                    # streamed through a small buffer: by default pyarrow reads whole column chunks ahead
                    parquet = pq.ParquetFile(handle, pre_buffer=False, buffer_size=1 << 22,
                                             page_checksum_verification=True)
                    for name in columns:
                        have = parquet.schema_arrow.field(name).type if name in parquet.schema_arrow.names else None
                        if have != schema.field(name).type:
                            raise CorpusError(f"{path}: column {name!r} is {have}, not {schema.field(name).type}")
                    for batch in parquet.iter_batches(LOAD_BATCH_ROWS, columns=columns):
                        yield path, batch
            except (OSError, pa.ArrowException) as exc:
                raise CorpusError(f"{path}: cannot read signature index file ({exc})") from None

    band_counts = np.zeros(BUCKETS, np.int64)
    exact_counts = np.zeros(BUCKETS, np.int64)
    total = 0
    shard, shards = np.uint64(part[0]), np.uint64(part[1])
    for path, batch in batches(["content_hash", "bands"]):
        words = _hash_words(batch["content_hash"], path)
        mine = words[:, 0] % shards == shard
        band_counts += np.bincount(_bucket(list_matrix(batch["bands"], params.bands)[mine]), minlength=BUCKETS)
        exact_counts += np.bincount(_bucket(words[mine, 0]), minlength=BUCKETS)
        total += int(mine.sum())
    if total >= MAX_DOCS:
        raise CorpusError(f"{url}: {total:,} documents; one index holds at most {MAX_DOCS:,} (run more shards)")

    band_fill, exact_fill = _Buckets(band_counts), _Buckets(exact_counts)
    rows = RowStore(rows_path, params.num_perm + ROW_HEAD)
    rows.reserve(total)
    ids = IdColumn()
    for path, whole in batches(["id", "content_hash", "length", "signature", "bands"]):
        words = _hash_words(whole["content_hash"], path)
        mine = words[:, 0] % shards == shard
        batch, words = whole.filter(pa.array(mine)), words[mine]
        start, n = rows.count, batch.num_rows
        docs = np.arange(start, start + n, dtype=np.uint32)
        block = np.empty((n, rows.width), np.uint64)
        block[:, :2], block[:, 2] = words, batch["length"].to_numpy(zero_copy_only=False).astype(np.uint64)
        block[:, ROW_HEAD:] = list_matrix(batch["signature"], params.num_perm)
        id_column = batch["id"]
        if id_column.null_count:
            raise CorpusError(f"{path}: a signature index row has no id")
        rows.append(block)
        ids.append_chunk(pa.concat_arrays([id_column]))  # a copy: the batch's other buffers can go
        band_fill.put(list_matrix(batch["bands"], params.bands).reshape(-1), np.repeat(docs, params.bands))
        exact_fill.put(words[:, 0], docs)
    if not (np.array_equal(band_fill.fill, band_counts) and np.array_equal(exact_fill.fill, exact_counts)):
        raise CorpusError(f"{url}: the signature index changed while it was being read")
    live = LiveIndex(params, rows, bands=KeyTable(band_fill.sorted_runs()), exact=KeyTable(exact_fill.sorted_runs()),
                     ids=ids, base_count=rows.count)
    return params, live


def _hash_words(column: pa.Array, path: str) -> np.ndarray:
    values = column.to_pylist()
    try:
        if any(v is None or len(v) != 32 for v in values):
            raise ValueError("not 32 hex digits")
        return hash_words(values)
    except ValueError as exc:
        raise CorpusError(f"{path}: a content_hash is not a 32-hex-digit hash ({exc})") from None


def _bucket(keys: np.ndarray) -> np.ndarray:
    return (np.asarray(keys, np.uint64).reshape(-1) >> BUCKET_SHIFT).astype(np.int64)


class _Buckets:
    """Keys scattered into 256 buckets allocated to their final sizes, then each sorted on its own."""

    def __init__(self, counts: np.ndarray) -> None:
        self.keys = [np.empty(c, np.uint64) for c in counts]
        self.docs = [np.empty(c, np.uint32) for c in counts]
        self.fill = np.zeros(BUCKETS, np.int64)

    def put(self, keys: np.ndarray, docs: np.ndarray) -> None:
        bucket = _bucket(keys)
        order = np.argsort(bucket, kind="stable")
        ends = np.cumsum(np.bincount(bucket, minlength=BUCKETS))
        for b in np.flatnonzero(np.diff(np.concatenate([[0], ends]))):
            part = order[(ends[b - 1] if b else 0) : ends[b]]
            at = self.fill[b]
            if at + len(part) > len(self.keys[b]):
                raise CorpusError("the signature index changed while it was being read")
            self.keys[b][at : at + len(part)], self.docs[b][at : at + len(part)] = keys[part], docs[part]
            self.fill[b] += len(part)

    def sorted_runs(self) -> list[Run]:
        runs = []
        for b in range(BUCKETS):
            order = np.argsort(self.keys[b], kind="stable")
            runs.append(Run(self.keys[b][order], self.docs[b][order]))
            self.keys[b] = self.docs[b] = np.zeros(0)  # let the unsorted bucket go before the next sort
        return runs
