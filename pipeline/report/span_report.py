"""One span ``gristmill dedup --spans`` cut, as ``gristmill clusters --span HASH`` shows it: the document
that kept it, its text there, and every document it was cut from (offsets and bytes), read from the
removed corpus's record of cuts (``--removed``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from gristmill.pipeline.format import Corpus, CorpusError
from gristmill.pipeline.format.manifest import SPANS_CUT_KEY
from gristmill.pipeline.format.schemas import SPANS_CUT_SCHEMA


@dataclass
class SpanOccurrences:
    """Where one span was: ``kept_by`` kept it (``text``: the span there), ``cuts`` lost it."""

    hash: str
    kept_by: str
    text: str | None
    cuts: list[dict[str, Any]]

    def summary(self) -> dict[str, Any]:
        return {"hash": self.hash, "kept_by": self.kept_by, "text": self.text, "cut_from": self.cuts}


def find_span(corpus: Corpus, removed: Corpus, wanted: str) -> SpanOccurrences:
    """The span whose hash is ``wanted`` or starts with it; LookupError when none or several match,
    CorpusError when the job cut no spans or kept no record of them."""
    listed = removed.manifest.extra.get(SPANS_CUT_KEY)
    files = listed.get("files") if isinstance(listed, Mapping) else None
    if not isinstance(files, list):
        raise CorpusError(f"{removed.url}: no record of cut spans (the job ran without --spans, or without --removed)")
    table = removed.read_members(files, SPANS_CUT_SCHEMA, "spans cut")
    hashes = pc.unique(table.filter(pc.starts_with(table["span_hash"], wanted.lower()))["span_hash"]).to_pylist()
    if len(hashes) != 1:
        raise LookupError(f"no cut span has a hash starting with {wanted!r}" if not hashes else
                          f"{wanted!r} is the start of {len(hashes)} span hashes; give more digits")
    rows = table.filter(pc.equal(table["span_hash"], hashes[0])).sort_by([("id", "ascending"), ("start", "ascending")])
    kept_by = rows["kept_by"][0].as_py()
    return SpanOccurrences(hashes[0], kept_by, _kept_text(corpus, kept_by, hashes[0]),
                           rows.select(["id", "start", "end", "bytes"]).to_pylist())


def _kept_text(corpus: Corpus, doc_id: str, span_hash: str) -> str | None:
    """The span's text in the document that kept it, found by splitting that document as the job did."""
    from gristmill.dedup.spans import SpanMode, document_spans

    spans = corpus.manifest.stats.get("spans") or {}
    if not isinstance(spans.get("spans"), str):
        return None
    for table in corpus.iter_tables(["id", "text"]):
        found = table.filter(pc.equal(table["id"], doc_id))
        if found.num_rows:
            text = found["text"][0].as_py()
            located = document_spans([text], SpanMode.parse(spans["spans"]), min_chars=0)
            for start, end, value in zip(located.start, located.end, located.hash, strict=True):
                if f"{value:016x}" == span_hash:
                    return text[start:end].strip()
            return None
    return None


def render_span(span: SpanOccurrences) -> str:
    """People-readable lines for one span."""
    lines = [f"span {span.hash}: kept in {span.kept_by}",
             f"  {' '.join((span.text or '(text not found in the corpus)').split())}",
             f"cut from {len(span.cuts):,} documents:"]
    lines += [f"  {cut['id']}  [{cut['start']}:{cut['end']}]  {cut['bytes']:,} bytes" for cut in span.cuts]
    return "\n".join(lines)
