"""Span splitting and hashing (``gristmill.dedup.spans``): where spans lie, what is never cut, and that
cutting leaves the rest of a document as it was."""

from __future__ import annotations

import sys
import unicodedata

import numpy as np
import pyarrow as pa
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from gristmill.dedup.normalize import NormalizeOptions
from gristmill.dedup.spans import SpanMode, SpanModeError, cut_batch, document_spans, span_bounds
from gristmill.dedup.unicode_bounds import DEFAULT_IGNORABLE_RANGES

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from span_reference import reference_bounds, reference_cut, reference_spans  # noqa: E402

MODES = [SpanMode.parse(m) for m in ("line", "paragraph", "sentences:1", "sentences:3")]
TEXTS = st.text(st.sampled_from(list("ab .!?\n\t。！」」 Éé中")), max_size=200)
# every character class the rules and the normalisation treat apart: full stops of both kinds and
# their look-alikes, closers (and the backslash, which is none), ASCII and Unicode white space,
# combining marks and conjoining jamo (which compose with what precedes them), ignorables,
# compatibility forms, letters whose case folding grows, digits
HOSTILE = st.text(st.sampled_from(list(
    "aAbe ZΣß\n\n\t\r\f\v.!?…。！？।؟۔．﹒\"'”’»)]）」』】〕》〉\\(\u00a0\u3000\u2028\x85\x1c"
    "\u0301\u0308\u0338\u3099\u1100\u1161\u11a8\u00ad\u200b\ufeffﬁｆİ<=07中か")), max_size=120)
OPTIONS = st.builds(NormalizeOptions, st.booleans(), st.booleans(), st.booleans(), st.booleans(), st.booleans(),
                    st.booleans())



def cut_spans(text: str, cuts: list[tuple[int, int]]) -> str:
    """One text cut by the compiled batch cut, which must give what the plain reference gives."""
    doc = np.zeros(len(cuts), np.int64)
    start, end = (np.array([c[i] for c in cuts], np.int64) for i in (0, 1))
    cut, taken = cut_batch([text], doc, start, end)
    assert taken.tolist() == [len(text[s:e].encode()) for s, e in cuts]
    assert cut[0].as_py() == reference_cut(text, cuts)
    return cut[0].as_py()


@settings(max_examples=200, deadline=None)
@given(st.lists(HOSTILE, max_size=4), st.sampled_from(MODES), st.data())
def test_a_batch_is_cut_as_each_text_on_its_own(texts: list[str], mode: SpanMode, data: st.DataObject) -> None:
    found = document_spans(texts, mode, min_chars=0)
    chosen = np.array([data.draw(st.booleans()) for _ in found.doc], bool)
    cut, taken = cut_batch(pa.array(texts), found.doc[chosen], found.start[chosen], found.end[chosen])
    for position, text in enumerate(texts):
        mine = (found.doc == position) & chosen
        assert cut[position].as_py() == reference_cut(text, list(zip(found.start[mine], found.end[mine], strict=True)))
    assert taken.tolist() == [len(texts[d][s:e].encode()) for d, s, e in zip(
        found.doc[chosen].tolist(), found.start[chosen].tolist(), found.end[chosen].tolist(), strict=True)]

@settings(max_examples=300, deadline=None)
@given(TEXTS, st.sampled_from(MODES))
def test_spans_are_disjoint_in_order_and_leave_only_blank_text_uncovered(text: str, mode: SpanMode) -> None:
    bounds = span_bounds(text, mode)
    position = 0
    for start, end in bounds:
        assert position <= start < end <= len(text)
        assert text[position:start].isspace() or position == start  # nothing but blank between spans
        assert not text[start:end].isspace()
        position = end
    assert not text[position:].strip()
    assert cut_spans(text, bounds).isspace() or not cut_spans(text, bounds)


@settings(max_examples=200, deadline=None)
@given(TEXTS, st.sampled_from(MODES), st.data())
def test_cutting_keeps_the_rest_in_order(text: str, mode: SpanMode, data: st.DataObject) -> None:
    bounds = span_bounds(text, mode)
    chosen = [b for b in bounds if data.draw(st.booleans())]
    rest = [b for b in bounds if b not in chosen]
    cut = cut_spans(text, chosen)
    assert len(cut) == len(text) - sum(e - s for s, e in chosen)
    for start, end in rest:
        assert text[start:end] in cut
    assert cut_spans(text, []) == text


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(list("ab .!?\n")), max_size=120), st.sampled_from(MODES), st.data())
def test_cutting_never_joins_an_untouched_line_to_another(text: str, mode: SpanMode, data: st.DataObject) -> None:
    """A line that no cut span touches stays a line of its own. (The benchmark found sentences:3 cutting
    the last sentences of a line together with its newline, which joined the rest of that line to
    the next: a unique line, still whole, no longer a line.)"""
    bounds = span_bounds(text, mode)
    chosen = [b for b in bounds if data.draw(st.booleans())]
    kept_lines = cut_spans(text, chosen).split("\n")
    start = 0
    for line in text.split("\n"):
        end = start + len(line)
        if line.strip() and not any(s < end and e > start for s, e in chosen):
            assert line in kept_lines, (line, chosen)
        start = end + 1


def test_a_paragraph_starts_at_the_start_of_its_line() -> None:
    """Found by CI: with its indent left out, cutting the paragraph of `` ?\\n\\n?`` joined the indent to
    the untouched ``?`` after it."""
    text = " \n  Cookie notice here\n\n  The article\n \n  Read more\n"
    bounds = span_bounds(text, SpanMode.parse("paragraph"))
    assert [text[s:e] for s, e in bounds] == ["  Cookie notice here\n\n", "  The article\n \n", "  Read more\n"]
    assert cut_spans(text, bounds[:1]) == " \n  The article\n \n  Read more\n"
    assert cut_spans(text, bounds[1:2]) == " \n  Cookie notice here\n\n  Read more\n"
    assert cut_spans(" ?\n\n?", span_bounds(" ?\n\n?", SpanMode.parse("paragraph"))[:1]) == "?"


def test_lines_paragraphs_and_sentences_each_take_their_separator() -> None:
    text = "Menu home page link\n\nFirst sentence here. Second one! Third?\nlast line"
    assert [text[s:e] for s, e in span_bounds(text, SpanMode.parse("line"))] == [
        "Menu home page link\n", "First sentence here. Second one! Third?\n", "last line"]
    assert [text[s:e] for s, e in span_bounds(text, SpanMode.parse("paragraph"))] == [
        "Menu home page link\n\n", "First sentence here. Second one! Third?\nlast line"]
    assert [text[s:e] for s, e in span_bounds(text, SpanMode.parse("sentences:2"))] == [
        "Menu home page link\n", "First sentence here. Second one! ", "Third?", "last line"]  # "\n" stays


def test_cjk_sentences_end_without_a_space() -> None:
    text = "今天天气很好。我们去公园吧！你觉得呢？「好的。」"
    assert [text[s:e] for s, e in span_bounds(text, SpanMode.parse("sentences:1"))] == [
        "今天天气很好。", "我们去公园吧！", "你觉得呢？", "「好的。」"]


def test_hashes_follow_the_normalisation_and_short_spans_get_none() -> None:
    found = document_spans(["Subscribe to our Newsletter!\nok\n", "subscribe to our newsletter\n"],
                           SpanMode.parse("line"))
    assert found.doc.tolist() == [0, 1]  # "ok" is under the minimum: never cut
    assert found.hash[0] == found.hash[1]  # case and punctuation do not matter
    assert document_spans(["ok\n"], SpanMode.parse("line"), min_chars=0).hash.size == 1


@pytest.mark.parametrize("value", ["lines", "sentences", "sentences:0", "sentences:x", ""])
def test_a_bad_mode_is_an_error_naming_it(value: str) -> None:
    with pytest.raises(SpanModeError, match=repr(value)):
        SpanMode.parse(value)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(HOSTILE, TEXTS), max_size=4), st.sampled_from(MODES), OPTIONS, st.integers(0, 24))
def test_the_compiled_batch_equals_the_plain_reference(texts: list[str], mode: SpanMode, options: NormalizeOptions,
                                                       min_chars: int) -> None:
    found = document_spans(texts, mode, options, min_chars)
    assert list(zip(found.doc.tolist(), found.start.tolist(), found.end.tolist(), found.hash.tolist(),
                    strict=True)) == reference_spans(texts, mode, options, min_chars)
    for text in texts:
        assert span_bounds(text, mode) == reference_bounds(text, mode)


def test_an_arrow_column_gives_what_its_strings_give() -> None:
    texts = ["Subscribe to our newsletter today.\nA line of its own here\n", "", "x" * 40]
    column = pa.chunked_array([pa.array(texts[:1]), pa.array(texts[1:])])  # a string column in two chunks
    for mode in MODES:
        a, b = document_spans(texts, mode), document_spans(column, mode)
        assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in ("doc", "start", "end", "hash"))
    with pytest.raises(TypeError, match="document 1 is null"):
        document_spans(pa.array(["a", None]), MODES[0])


def test_a_newline_is_a_wall_for_the_normalisation() -> None:
    """What lets a whole document be normalised at once: no character decomposes to or composes with a
    newline, none folds into one, and a newline is neither ignorable nor a combining mark."""
    assert unicodedata.combining("\n") == 0 and not unicodedata.decomposition("\n")
    assert not any(lo <= 0x0A <= hi for lo, hi in DEFAULT_IGNORABLE_RANGES)
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF or cp == 0x0A:
            continue
        ch = chr(cp)
        assert "000A" not in unicodedata.decomposition(ch).split()
        assert "\n" not in unicodedata.normalize("NFKC", ch).casefold()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_the_span_hash_is_xxh64(data: bytes) -> None:
    from gristmill.dedup import _span_kernels

    hashes, _ = _span_kernels.xxh64(np.frombuffer(data, np.uint8), np.array([0, len(data)], np.int64))
    assert int(hashes[0]) == xxhash.xxh64_intdigest(data)
