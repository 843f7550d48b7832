"""Spans of a document for span-level dedup: where each span lies, and the hash of its normalised text.

A span is a piece of a document that boilerplate repeats whole across otherwise different pages:

- ``line``: each line (what extracted web text calls a paragraph; CCNet's unit);
- ``paragraph``: each run of text between blank lines;
- ``sentences:N``: N sentences at a time, counted from the start of each line (sentences never
  cross a line break), so a repeated block that starts a line is cut the same wherever it occurs.
  Unlike a sliding window (datatrove's ``SentenceDedup``) the spans never overlap, which is what lets
  a repeated span be kept in exactly one document.

A span's extent (``start``, ``end``: code point offsets into the document) takes in the separator
that follows it (the newline, the blank lines, the space after a sentence), so cutting it leaves the
rest of the document with its line breaks and order. Its hash is xxh3-64 of its text after the job's
normalisation (``gristmill.dedup.normalize``), so two spans that differ only in case, punctuation or
spacing hash alike. A span whose normalised text has fewer than ``min_chars`` characters (a "Home"
link, a date, "Yes.") gets no hash and is never cut: short lines repeat by chance, not as boilerplate.

Sentences end at ``.``, ``!``, ``?``, ``…``, ``;`` is not an end; the CJK full stops ``。！？``, the
Devanagari danda ``।``, the Arabic ``؟`` and ``۔`` end one too, with or without the space after them
(Chinese and Japanese put none). Closing quotes and brackets stay with their sentence. A regular
expression, not a trained model: ``Dr. Smith`` splits in two, which only makes spans shorter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import xxhash

from .normalize import DEFAULT_NORMALIZE, NormalizeOptions, fold_prepared, prepare

MIN_SPAN_CHARS = 20  # normalised characters below which a span is never cut
MODES = ("line", "paragraph", "sentences:N")

_LINE = re.compile(r"[^\n]*\n|[^\n]+")
_PARAGRAPH = re.compile(r"\S.*?(?:\n[ \t\r\f\v]*\n\s*|\s*\Z)", re.DOTALL)
_CLOSERS = "\"'”’»)\\]）」』】〕》〉"
_SENTENCE = re.compile(
    rf"[^\n]*?(?:[.!?…]+[{_CLOSERS}]*(?:[ \t\r\f\v]+|(?=\n)|\Z)|[。！？।؟۔]+[{_CLOSERS}]*[ \t\r\f\v]*|\Z|(?=\n))\n?")


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
    if mode.kind == "paragraph":
        return [m.span() for m in _PARAGRAPH.finditer(text)]
    lines = [m.span() for m in _LINE.finditer(text)]
    if mode.kind == "line":
        return [(s, e) for s, e in lines if not text[s:e].isspace()]
    spans = []
    for begin, end in lines:
        ends = [m.end() for m in _SENTENCE.finditer(text, begin, end) if m.end() > m.start()]
        ends = [e for e in ends if e <= end]
        starts = [begin, *ends[:-1]]
        for first in range(0, len(ends), mode.sentences):
            start, stop = starts[first], ends[min(first + mode.sentences, len(ends)) - 1]
            if not text[start:stop].isspace():
                spans.append((start, stop))
    return spans


@dataclass(frozen=True)
class DocumentSpans:
    """The spans of a batch of documents: one row per span long enough to cut, in document order."""

    doc: np.ndarray  # position of the span's document in the batch
    start: np.ndarray  # code point offsets into that document
    end: np.ndarray
    hash: np.ndarray  # uint64: xxh3-64 of the normalised span


def document_spans(texts: Sequence[str], mode: SpanMode, options: NormalizeOptions = DEFAULT_NORMALIZE,
                   min_chars: int = MIN_SPAN_CHARS) -> DocumentSpans:
    """Every span of every text that has at least ``min_chars`` normalised characters, hashed."""
    doc, starts, ends, pieces = [], [], [], []
    for position, text in enumerate(texts):
        for start, end in span_bounds(text, mode):
            doc.append(position)
            starts.append(start)
            ends.append(end)
            pieces.append(text[start:end])
    if not pieces:
        empty = np.zeros(0, np.int64)
        return DocumentSpans(empty, empty, empty, np.zeros(0, np.uint64))
    data, offsets = fold_prepared(*prepare(pieces, options), options)
    leading = np.concatenate([[0], np.cumsum((data & 0xC0) != 0x80)])  # code points before each byte
    long_enough = (leading[offsets[1:]] - leading[offsets[:-1]]) >= min_chars
    view, bounds = memoryview(data), offsets.tolist()
    chosen = np.flatnonzero(long_enough)
    hashes = np.fromiter((xxhash.xxh3_64_intdigest(view[bounds[i]: bounds[i + 1]]) for i in chosen), np.uint64,
                         count=len(chosen))
    return DocumentSpans(np.asarray(doc, np.int64)[chosen], np.asarray(starts, np.int64)[chosen],
                         np.asarray(ends, np.int64)[chosen], hashes)


def cut_spans(text: str, cuts: Sequence[tuple[int, int]]) -> str:
    """``text`` without the (start, end) extents ``cuts`` (disjoint, in order): the rest as it was."""
    kept, position = [], 0
    for start, end in cuts:
        kept.append(text[position:start])
        position = end
    kept.append(text[position:])
    return "".join(kept)
