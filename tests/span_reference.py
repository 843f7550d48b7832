"""The plain reference of ``gristmill.dedup.spans``: regular expressions over one document at a time,
the job's normalisation of every span on its own, one XXH64 call per span. The compiled path must
give exactly these spans, extents and hashes (``tests/test_dedup_spans.py``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import xxhash

from gristmill.dedup.normalize import DEFAULT_NORMALIZE, NormalizeOptions, normalize
from gristmill.dedup.spans import MIN_SPAN_CHARS, SpanMode

LINE = re.compile(r"[^\n]*\n|[^\n]+")
PARAGRAPH = re.compile(r"[^\S\n]*\S.*?(?:\s*\Z|\n[ \t\r\f\v]*\n(?:\s*\n)?)", re.DOTALL)
CLOSERS = "\"'”’»)\\]）」』】〕》〉"
SENTENCE = re.compile(
    rf"[^\n]*?(?:[.!?…]+[{CLOSERS}]*(?:[ \t\r\f\v]+|(?=\n)|\Z)|[。！？।؟۔]+[{CLOSERS}]*[ \t\r\f\v]*|\Z|(?=\n))\n?")


def reference_bounds(text: str, mode: SpanMode) -> list[tuple[int, int]]:
    """The (start, end) extent of every span of ``text``, in order, each with its trailing separator."""
    if mode.kind == "paragraph":
        return [m.span() for m in PARAGRAPH.finditer(text)]
    lines = [m.span() for m in LINE.finditer(text)]
    if mode.kind == "line":
        return [(s, e) for s, e in lines if not text[s:e].isspace()]
    spans = []
    for begin, end in lines:
        ends = [m.end() for m in SENTENCE.finditer(text, begin, end) if m.end() > m.start()]
        starts = [begin, *ends[:-1]]
        for first in range(0, len(ends), mode.sentences):
            start, stop = starts[first], ends[min(first + mode.sentences, len(ends)) - 1]
            if start > begin and text[stop - 1] == "\n":  # starts inside its line: the newline stays
                stop -= 1
            if not text[start:stop].isspace():
                spans.append((start, stop))
    return spans


def reference_spans(texts: Sequence[str], mode: SpanMode, options: NormalizeOptions = DEFAULT_NORMALIZE,
                    min_chars: int = MIN_SPAN_CHARS) -> list[tuple[int, int, int, int]]:
    """(document, start, end, XXH64 of the normalised span) of every span long enough to cut."""
    found = []
    for position, text in enumerate(texts):
        for start, end in reference_bounds(text, mode):
            normal = normalize(text[start:end], options)
            if len(normal) >= min_chars:
                found.append((position, start, end, xxhash.xxh64_intdigest(normal.encode())))
    return found


def reference_cut(text: str, cuts: Sequence[tuple[int, int]]) -> str:
    """``text`` without the (start, end) extents ``cuts`` (disjoint, in order): the rest as it was."""
    kept, position = [], 0
    for start, end in cuts:
        kept.append(text[position:start])
        position = end
    kept.append(text[position:])
    return "".join(kept)
