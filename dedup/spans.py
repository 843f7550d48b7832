"""Spans of a document for span-level dedup: where each span lies, and the hash of its normalised text.

A span is a piece of a document that boilerplate repeats whole across otherwise different pages:

- ``line``: each line (what extracted web text calls a paragraph; CCNet's unit);
- ``paragraph``: each run of text between blank lines;
- ``sentences:N``: N sentences at a time, counted from the start of each line (sentences never
  cross a line break), so a repeated block that starts a line is cut the same wherever it occurs.
  Unlike a sliding window (datatrove's ``SentenceDedup``) the spans never overlap, which is what lets
  a repeated span be kept in exactly one document.

A span's extent (``start``, ``end``: code point offsets into the document) takes in the separator
that follows it (the newline, the blank lines, the space after a sentence), except the newline after
sentences that start inside their line (cutting that would join the rest of the line to the next),
and a paragraph starts at the start of its first line (with its indent), so cutting spans leaves the rest
of the document with its line breaks and order. Its hash is XXH64 (seed 0) of its UTF-8 text after the
job's normalisation (``gristmill.dedup.normalize``), so two spans that differ only in case, punctuation
or spacing hash alike. A span whose normalised text has fewer than ``min_chars`` characters (a "Home"
link, a date, "Yes.") gets no hash and is never cut: short lines repeat by chance, not as boilerplate.

Sentences end at ``.``, ``!``, ``?``, ``…``, ``;`` is not an end; the CJK full stops ``。！？``, the
Devanagari danda ``।``, the Arabic ``؟`` and ``۔`` end one too, with or without the space after them
(Chinese and Japanese put none). Closing quotes and brackets stay with their sentence. A fixed rule,
not a trained model: ``Dr. Smith`` splits in two, which only makes spans shorter.

The work runs compiled over a whole batch (``_span_kernels``; the plain per-span code it must equal is
``tests/span_reference.py``): the spans are found in the UTF-8 bytes, and each span is normalised on its
own in one pass (``normalize.normalize_ranges``) and hashed. A document with a span that holds a
character NFKC folds with its neighbours (a combining mark, a Hangul jamo) is normalised whole instead,
once, with a newline inserted at every span boundary that has none (a newline never takes part in
NFKC, case folding or the removal of ignorables, so each span normalises exactly as it would on its
own), and each of its spans is folded and hashed where it lies in the normalised text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from .normalize import (
    DEFAULT_NORMALIZE,
    NormalizeOptions,
    Texts,
    as_strings,
    class_table,
    normalize_ranges,
    prefold_batch,
    utf8_batch,
    utf8_buffers,
)

MIN_SPAN_CHARS = 20  # normalised characters below which a span is never cut
SPAN_HASH = "xxh64"  # of the normalised span; recorded beside a span index, which only jobs of the same hash read
MODES = ("line", "paragraph", "sentences:N")


class SpanModeError(ValueError):
    """A ``--spans`` value that is none of the modes."""


@dataclass(frozen=True)
class SpanMode:
    """A parsed ``--spans`` value: ``kind`` is line, paragraph or sentences, ``sentences`` N for the last."""

    kind: str
    sentences: int = 0

    @classmethod
    def parse(cls, text: str) -> SpanMode:
        """``line``, ``paragraph`` or ``sentences:N`` (N >= 1); SpanModeError naming the value otherwise."""
        if text in ("line", "paragraph"):
            return cls(text)
        name, _, count = text.partition(":")
        if name == "sentences" and count.isdigit() and int(count) >= 1:
            return cls("sentences", int(count))
        raise SpanModeError(f"--spans {text!r}: expected one of line, paragraph, sentences:N (N >= 1)")


def span_bounds(text: str, mode: SpanMode) -> list[tuple[int, int]]:
    """The (start, end) extent of every span of ``text``, in order, each with its trailing separator.

    Blank stretches (white space only) belong to no span: they are never cut.
    """
    _, bounds = _scan(*utf8_batch(as_strings([text])), mode)
    return [(int(start), int(end)) for start, end in bounds[:, 2:]]


@dataclass(frozen=True)
class DocumentSpans:
    """The spans of a batch of documents: one row per span long enough to cut, in document order."""

    doc: np.ndarray  # position of the span's document in the batch
    start: np.ndarray  # code point offsets into that document
    end: np.ndarray
    hash: np.ndarray  # uint64: XXH64 of the normalised span


def document_spans(texts: Texts, mode: SpanMode, options: NormalizeOptions = DEFAULT_NORMALIZE,
                   min_chars: int = MIN_SPAN_CHARS) -> DocumentSpans:
    """Every span of every text that has at least ``min_chars`` normalised characters, hashed."""
    from . import _span_kernels

    data, offsets = _utf8(texts)
    doc, bounds = _scan(data, offsets, mode)
    first = offsets[doc]
    folded, folded_offsets, context = normalize_ranges(data, first + bounds[:, 0], first + bounds[:, 1], options)
    hashes, chars = _span_kernels.xxh64(folded, folded_offsets)
    if context.any():  # documents with a span that NFKC folds with its neighbours: normalised whole
        rows = np.unique(doc[context])
        again = np.isin(doc, rows)
        hashes[again], chars[again] = _hashes_in_context(_take(data, offsets, rows), mode, options)
    chosen = chars >= min_chars
    return DocumentSpans(doc[chosen], bounds[chosen, 2], bounds[chosen, 3], hashes[chosen])


def _hashes_in_context(texts: pa.LargeStringArray, mode: SpanMode,
                       options: NormalizeOptions) -> tuple[np.ndarray, np.ndarray]:
    """The hash and normalised length of every span of ``texts``, each document normalised once with a
    newline inserted at every span boundary that has none (see the module's docstring)."""
    from . import _kernels, _span_kernels

    data, offsets = utf8_buffers(texts)
    doc, bounds = _scan(data, offsets, mode)
    marked, marked_offsets, lines, inserted = _span_kernels.mark(data, offsets, doc, bounds)
    batch = pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(marked_offsets), pa.py_buffer(marked))
    normal, normal_offsets = prefold_batch(batch, options)
    starts, ends = _span_kernels.locate(normal, normal_offsets, doc, lines, inserted)
    folded, folded_offsets = _kernels.fold_ranges(normal, starts, ends, class_table(), options.punctuation,
                                                  options.digits, options.whitespace)
    return _span_kernels.xxh64(folded, folded_offsets)


def _take(data: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> pa.LargeStringArray:
    """Documents ``rows`` of a batch given as its UTF-8 bytes and offsets."""
    batch = pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets - offsets[0]),
                                             pa.py_buffer(data[offsets[0]:]))
    return batch.take(pa.array(rows))


def _utf8(texts: Texts) -> tuple[np.ndarray, np.ndarray]:
    """The batch's UTF-8 bytes and offsets: straight from Arrow's buffers when it is an Arrow column."""
    if not isinstance(texts, pa.Array | pa.ChunkedArray):
        return utf8_batch(as_strings(texts))
    array = texts.cast(pa.large_string())
    array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    if array.null_count:
        as_strings(array)  # the error naming the first null document
    return utf8_buffers(array)


def _scan(data: np.ndarray, offsets: np.ndarray, mode: SpanMode) -> tuple[np.ndarray, np.ndarray]:
    from . import _span_kernels

    code = {"line": _span_kernels.LINE, "paragraph": _span_kernels.PARAGRAPH}.get(mode.kind, _span_kernels.SENTENCES)
    return _span_kernels.scan(data, offsets, class_table(), code, max(mode.sentences, 1))


def cut_batch(texts: Texts, doc: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[pa.LargeStringArray, np.ndarray]:
    """Every text of a batch, in one compiled pass, without the (``start``, ``end``) code
    point extents of document ``doc`` (sorted by document, disjoint and in order within one), and the
    UTF-8 bytes each cut took."""
    from . import _span_kernels

    data, offsets = _utf8(texts)
    out, out_offsets, taken = _span_kernels.cut(data, offsets, doc, start, end)
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(out_offsets), pa.py_buffer(out)), taken
