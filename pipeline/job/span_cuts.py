"""The ``write`` side of ``--spans``: each kept document loses the spans the ``spans`` reducers sent
it (``gristmill.pipeline.job.spans``); one left under ``--min-chars`` is removed (``spans``) unless it
keeps a repeated span for the corpus; with ``--removed`` every cut is recorded."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.pipeline.format.schemas import SPANS_CUT_SCHEMA  # a document removed for spans is kept whole
from gristmill.pipeline.format.span_index import write_span_index
from gristmill.pipeline.job.datasets import SPAN_ROWS, SPANS_OUT, span_index_file, spans_cut_file
from gristmill.pipeline.job.outcomes import KEPT, SPANS
from gristmill.pipeline.job.spans import SPANS_OUT_SCHEMA
from gristmill.pipeline.job.tasks import Job
from gristmill.pipeline.job.workdir import WorkDir


class SpanCutter:
    """One split's cuts, applied a read batch at a time by ``write``."""

    def __init__(self, job: Job, split_index: int) -> None:
        self.job, self.split_index = job, split_index
        sent = job.work.read_partition(SPANS_OUT, split_index, SPANS_OUT_SCHEMA)
        rows = job.work.read_table(SPAN_ROWS.file(split_index))
        order = [("key", "ascending"), ("start", "ascending")]
        cuts = rows.join(sent.filter(sent["cut"]).select(["key", "hash", "kept_by"]), ["key", "hash"],
                         join_type="inner", use_threads=False).sort_by(order)
        # the cuts as columns, by key then start: a batch's are one slice of them
        self.cut_key, self.cut_start, self.cut_end, self.cut_hash = (
            cuts[c].to_numpy().astype(t) for c, t in (("key", np.int64), ("start", np.int64), ("end", np.int64),
                                                       ("hash", np.uint64)))
        self.cut_kept_by = cuts["kept_by"].combine_chunks()
        keeps = sent.filter(pc.invert(sent["cut"]))
        self.keepers = np.unique(keeps["key"].to_numpy())
        self.rows, self.cut_pairs = rows, cuts.select(["key", "hash"])
        self.shown = rows.join(keeps.filter(keeps["shown"]).select(["key", "hash", "docs"]), ["key", "hash"],
                               join_type="inner", use_threads=False).sort_by(order)
        self.records: list[pa.Table] = []
        self.top: list[dict[str, Any]] = []
        self.totals = {"spans_cut": 0, "bytes_cut": 0, "documents_cut": 0}

    def cut(self, group: pa.Table, keys: np.ndarray, status: np.ndarray) -> tuple[pa.Table, np.ndarray]:
        """The batch with each kept document's cuts made (its content hash follows its new text) and the
        status of each row (SPANS where too little is left)."""
        from gristmill.dedup.normalize import hashes_of_folded, normalize_batch
        from gristmill.dedup.spans import cut_batch

        status = status.copy()
        texts = group["text"]
        self._show(keys, texts)
        # the batch's keys are consecutive keys of the split: its cuts are those between its first and last
        first = np.searchsorted(self.cut_key, keys[0]) if len(keys) else 0
        stop = np.searchsorted(self.cut_key, keys[-1], side="right") if len(keys) else 0
        chosen = np.arange(first, stop)
        row = np.searchsorted(keys, self.cut_key[chosen])
        chosen, row = chosen[status[row] == KEPT], row[status[row] == KEPT]
        start, end = self.cut_start[chosen], self.cut_end[chosen]
        left = pc.utf8_length(texts).to_numpy() - np.bincount(row, end - start, len(keys))
        short = (np.bincount(row, minlength=len(keys)) > 0) & (left < self.job.config.min_chars)
        short &= ~np.isin(keys, self.keepers)
        status[short] = SPANS
        chosen, row, start, end = (a[~short[row]] for a in (chosen, row, start, end))
        if not len(chosen):
            return group, status
        cut_texts, taken = cut_batch(texts, row, start, end)
        changed = np.unique(row)
        self.totals["spans_cut"] += len(chosen)
        self.totals["bytes_cut"] += int(taken.sum())
        self.totals["documents_cut"] += len(changed)
        if self.job.config.removed:
            self.records.append(pa.table({
                "id": group["id"].take(pa.array(row)), "start": start, "end": end, "bytes": taken,
                "span_hash": [f"{value:016x}" for value in self.cut_hash[chosen].tolist()],
                "kept_by": self.cut_kept_by.take(pa.array(chosen))}, schema=SPANS_CUT_SCHEMA))
        options = self.job.params.hasher().normalize
        new_hashes = hashes_of_folded(*normalize_batch(cut_texts.take(pa.array(changed)), options))
        hashes = group["content_hash"].to_pylist()
        for position, value in zip(changed.tolist(), new_hashes, strict=True):
            hashes[position] = value
        group = group.set_column(group.schema.get_field_index("text"), "text",
                                 cut_texts.cast(group.schema.field("text").type))
        return group.set_column(group.schema.get_field_index("content_hash"), "content_hash",
                                pa.array(hashes, pa.string())), status

    def _show(self, keys: np.ndarray, texts: pa.ChunkedArray) -> None:
        """The text of the most repeated spans this batch's documents kept, as the statistics show it."""
        shown = self.shown.filter(pc.is_in(self.shown["key"], value_set=pa.array(keys, pa.int64())))
        seen = {span["hash"] for span in self.top}
        for row in shown.to_pylist():
            value = f"{row['hash']:016x}"
            if value not in seen:
                seen.add(value)
                self.top.append({"hash": value, "docs": row["docs"],
                                 "text": texts[int(np.searchsorted(keys, row["key"]))].as_py()[row["start"]: row["end"]].strip()})

    def finish(self, docs: pa.Table, status: np.ndarray) -> dict[str, Any]:
        """The split's span totals and shown spans; its span index written (the spans its kept ``docs``
        still hold, for later ``--against`` jobs); with ``--removed``, its record of cuts."""
        kept = docs.filter(pa.array(status == KEPT))
        held = self.rows.filter(pc.is_in(self.rows["key"], value_set=kept["key"].combine_chunks()))
        held = held.join(self.cut_pairs, ["key", "hash"], join_type="left anti", use_threads=False)
        held = held.sort_by([("hash", "ascending"), ("key", "ascending")])
        hashes = held["hash"].to_numpy()
        first = np.flatnonzero(np.r_[True, hashes[1:] != hashes[:-1]]) if len(hashes) else np.zeros(0, np.int64)
        where = np.searchsorted(docs["key"].to_numpy(), held["key"].to_numpy()[first])
        index_name = span_index_file(self.split_index, self.job.fingerprint)
        write_span_index(self.job.config.output, index_name,
                         pa.table({"hash": pa.array(hashes[first], pa.uint64()),
                                   "id": docs["id"].take(pa.array(where, pa.int64()))}),
                         self.job.config.storage_options)
        result: dict[str, Any] = {"span_totals": self.totals, "top_spans": self.top, "span_index_file": index_name}
        if self.job.config.removed:
            name = spans_cut_file(self.split_index, self.job.fingerprint)
            table = pa.concat_tables(self.records) if self.records else SPANS_CUT_SCHEMA.empty_table()
            WorkDir(self.job.config.removed, self.job.config.storage_options, spread_keys=False).write_table(name,
                                                                                                          table)
            result["spans_cut_file"] = name
        return result
