"""Stage ``spans`` (``--spans MODE``): a span repeated in several documents is kept in one and cut from
the others, after document dedup and through the job's shuffle (``gristmill.dedup.spans`` splits and
hashes the spans).

- Map, per split: the spans of the split's kept documents (``spans/rows``: key, offsets, hash), and
  one row per distinct (document, span hash) with the document's survivor keys, shuffled by span
  hash (``spans_in``): no task holds more than its partition of the corpus's span hashes.
- Reduce, per span-hash partition: a hash found in at least ``--span-min-docs`` documents keeps its
  best document by the survivor policy (``--prefer``, as for whole documents: ``gristmill.dedup.cluster.survivors``);
  every other document holding it is sent the cut (``spans_out``, by split), and the survivor of the
  most repeated hashes is sent the hash too, so that ``write`` can show the span's text.
- ``write`` then cuts (:func:`split_cuts`): the rest of each document stays, line breaks and order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.pipeline.format import Corpus, CorpusError
from gristmill.pipeline.format.sorted_parquet import range_partition
from gristmill.pipeline.format.span_index import SPAN_INDEX_SCHEMA, span_index_urls, spans_held
from gristmill.pipeline.job.config import DedupConfig, DedupError
from gristmill.pipeline.job.datasets import (
    DOCS,
    EXACT_CLUSTERS,
    EXACT_OUT,
    SPAN_ROWS,
    SPANS_DONE,
    SPANS_IN,
    SPANS_MAP_DONE,
    SPANS_OUT,
    split_name,
)
from gristmill.pipeline.job.outcomes import KEPT, document_outcomes
from gristmill.pipeline.job.tasks import Job, map_splits, route_by_split, run_once

SPAN_ROWS_SCHEMA = pa.schema([("key", pa.int64()), ("start", pa.int64()), ("end", pa.int64()),
                              ("hash", pa.uint64())])
SPANS_IN_SCHEMA = pa.schema([("hash", pa.uint64()), ("key", pa.int64()), ("id", pa.string()),
                             ("length", pa.int64()), ("prefer", pa.int64())])
# ``cut``: the document loses the span; otherwise it keeps it for all (``shown``: one of the most repeated)
SPANS_OUT_SCHEMA = pa.schema([("key", pa.int64()), ("hash", pa.uint64()), ("kept_by", pa.string()),
                              ("docs", pa.int64()), ("cut", pa.bool_()), ("shown", pa.bool_())])
SPAN_IN_ROW_BYTES = 64  # hash, key, id, length, preference
TYPICAL_SPAN_BYTES = 64  # input bytes per span, to size the shuffle before the spans are counted
TOP_SPANS = 20  # the most repeated spans the statistics show


def span_partitions(input_bytes: int, override: int | None, partition_bytes: int) -> int:
    """Partitions of the span-hash shuffle: about ``partition_bytes`` of rows each, at one span per
    TYPICAL_SPAN_BYTES of input (an upper bound for web text, whose lines are longer)."""
    if override is not None:
        return override
    return max(1, -(-input_bytes // TYPICAL_SPAN_BYTES * SPAN_IN_ROW_BYTES // partition_bytes))


def span_settings(config: DedupConfig) -> dict[str, Any]:
    """What two jobs must share for one's spans to be compared with the other's (``--against``): the
    span hash too, since an index of other hashes would match nothing."""
    from gristmill.dedup.spans import SPAN_HASH

    return {"spans": config.spans, "span_min_chars": config.span_min_chars, "span_hash": SPAN_HASH}


def earlier_span_indexes(config: DedupConfig) -> list[str]:
    """With ``--spans --against``: every earlier corpus's span index files (DedupError when one has none
    or split its spans otherwise)."""
    if config.spans is None:
        return []
    try:
        return [url for corpus in config.against
                for url in span_index_urls(Corpus.open(corpus, config.storage_options), span_settings(config))]
    except CorpusError as exc:
        raise DedupError(f"--against: {exc}") from None


def _earlier_holders(job: Job, wanted: np.ndarray) -> pa.Table:
    """Of the sorted span hashes ``wanted``, those an earlier corpus keeps, with the id of its keeper
    (the first earlier corpus, then the lowest id, when several hold one)."""
    tables = [spans_held(url, wanted, job.config.storage_options) for url in job.span_index_urls]
    if not tables:
        return SPAN_INDEX_SCHEMA.empty_table()
    held = pa.concat_tables(tables)
    order = np.lexsort((np.arange(held.num_rows), held["hash"].to_numpy()))
    hashes = held["hash"].to_numpy()[order]
    first = order[np.r_[True, hashes[1:] != hashes[:-1]]] if len(hashes) else order
    return held.take(pa.array(first, pa.int64()))


def span_map(job: Job, split_index: int, partitions: int) -> dict[str, Any]:
    """Map, once: the spans of the split's kept documents, to ``spans/rows`` and to the shuffle."""
    from gristmill.dedup.spans import SpanMode, document_spans

    def compute() -> dict[str, Any]:
        mode = SpanMode.parse(job.config.spans or "")
        docs = job.work.read_table(DOCS.file(split_index), ["key", "id", "content_hash", "length", "prefer"])
        kept = document_outcomes(job, split_index, docs).status == KEPT
        keys = docs["key"].to_numpy()
        pieces, start = [], 0
        for group in job.work.read_row_groups(DOCS.file(split_index), ["text"]):
            first, start = start, start + group.num_rows
            rows = np.flatnonzero(kept[first:start])  # the batch's kept documents
            if not len(rows):
                continue
            texts = group["text"].take(pa.array(rows))
            found = document_spans(texts, mode, job.params.hasher().normalize, job.config.span_min_chars)
            pieces.append(pa.table({"key": keys[first + rows[found.doc]], "start": found.start, "end": found.end,
                                    "hash": found.hash}, schema=SPAN_ROWS_SCHEMA))
        spans = pa.concat_tables(pieces) if pieces else SPAN_ROWS_SCHEMA.empty_table()
        job.work.write_table(SPAN_ROWS.file(split_index), spans)
        distinct = spans.group_by(["key", "hash"], use_threads=False).aggregate([]).sort_by([("key", "ascending"),
                                                                                             ("hash", "ascending")])
        where = np.searchsorted(keys, distinct["key"].to_numpy())
        rows = pa.table({"hash": distinct["hash"], "key": distinct["key"], "id": docs["id"].take(pa.array(where)),
                         "length": docs["length"].take(pa.array(where)),
                         "prefer": docs["prefer"].take(pa.array(where))}, schema=SPANS_IN_SCHEMA)
        job.work.write_partitioned(SPANS_IN, split_name(split_index), rows,
                                   range_partition(rows["hash"].to_numpy(), partitions), partitions)
        return {"spans": spans.num_rows}

    return run_once(job.work, SPANS_MAP_DONE.split(split_index), compute)


def span_reduce(job: Job, part: int) -> dict[str, Any]:
    """Reduce, once: each repeated hash's surviving document; the cut to every other one."""
    from gristmill.dedup.cluster import survivors

    def compute() -> dict[str, Any]:
        table = job.work.read_partition(SPANS_IN, part, SPANS_IN_SCHEMA).sort_by([("key", "ascending"),
                                                                                 ("hash", "ascending")])
        if not table.num_rows:
            route_by_split(job, SPANS_OUT, part, SPANS_OUT_SCHEMA.empty_table())
            return {"repeated": 0, "cut": 0}
        hashes = table["hash"].to_numpy()
        distinct, labels = np.unique(hashes, return_inverse=True)
        docs = np.bincount(labels, minlength=len(distinct)).astype(np.int64)
        chosen = survivors(labels, table["length"].to_numpy(), table["id"], preference=table["prefer"].to_numpy())
        best = chosen.row[labels]
        rows = np.arange(table.num_rows)
        ids = table["id"].combine_chunks()
        # spans an earlier corpus keeps (--against): its document is the survivor, every new holder loses them
        earlier = _earlier_holders(job, distinct)
        from_earlier = np.zeros(len(distinct), bool)
        earlier_id = np.full(len(distinct), None, object)
        where = np.searchsorted(distinct, earlier["hash"].to_numpy())
        from_earlier[where] = True
        earlier_id[where] = earlier["id"].to_pylist()
        docs = docs + from_earlier
        repeated = docs[labels] >= job.config.span_min_docs
        cut = repeated & ((rows != best) | from_earlier[labels])
        # each repeated span's survivor learns it keeps it (a document that keeps one is never removed
        # for being short: the span would be kept nowhere), the most repeated (ties by hash) for the stats
        candidates = np.flatnonzero((docs >= job.config.span_min_docs) & ~from_earlier)
        top = candidates[np.lexsort((distinct[candidates], -docs[candidates]))][:TOP_SPANS]
        sent = np.concatenate([rows[cut], chosen.row[candidates]]).astype(np.int64)
        shown = np.zeros(len(distinct), bool)
        shown[top] = True
        out = pa.table({"key": table["key"].take(pa.array(sent)), "hash": table["hash"].take(pa.array(sent)),
                        "kept_by": _keepers(ids, best[sent], earlier_id[labels[sent]]),
                        "docs": pa.array(docs[labels[sent]], pa.int64()),
                        "cut": pa.array(np.arange(len(sent)) < int(cut.sum())),
                        "shown": pa.array(shown[labels[sent]] & (rows[sent] == best[sent]))}, schema=SPANS_OUT_SCHEMA)
        route_by_split(job, SPANS_OUT, part, out)
        return {"repeated": len(candidates), "cut": int(cut.sum())}

    return run_once(job.work, SPANS_DONE.partition(part), compute)


def _keepers(ids: pa.Array, best: np.ndarray, earlier: np.ndarray) -> pa.Array:
    """The id of the document keeping each span: an earlier corpus's where it has one, else the survivor's."""
    ours = ids.take(pa.array(best, pa.int64()))
    return pc.coalesce(pa.array(earlier.tolist(), pa.string()), ours)


def run_spans(job: Job, partitions: int, run_tasks: Callable[..., list[Any]]) -> dict[str, int]:
    """The stage: the map over the new splits, then one reducer per span-hash partition."""
    mapped = map_splits(lambda j, i: span_map(j, i, partitions), job, job.split_indices,
                        receives=[EXACT_OUT, EXACT_CLUSTERS])
    reduced = run_tasks(span_reduce, [(job, p) for p in range(partitions)], receives=[SPANS_IN])
    return {"spans": sum(r["spans"] for r in mapped), "repeated": sum(r["repeated"] for r in reduced)}


def top_spans(records: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The TOP_SPANS most repeated spans over every split's shown spans (ties by hash)."""
    merged = {span["hash"]: span for spans in records for span in spans}
    return sorted(merged.values(), key=lambda s: (-s["docs"], s["hash"]))[:TOP_SPANS]
