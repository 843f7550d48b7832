"""Span splitting and hashing (``gristmill.dedup.spans``): where spans lie, what is never cut, and that
cutting leaves the rest of a document as it was."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gristmill.dedup.spans import SpanMode, SpanModeError, cut_spans, document_spans, span_bounds

MODES = [SpanMode.parse(m) for m in ("line", "paragraph", "sentences:1", "sentences:3")]
TEXTS = st.text(st.sampled_from(list("ab .!?\n\t。！」」 Éé中")), max_size=200)


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


def test_lines_paragraphs_and_sentences_each_take_their_separator() -> None:
    text = "Menu home page link\n\nFirst sentence here. Second one! Third?\nlast line"
    assert [text[s:e] for s, e in span_bounds(text, SpanMode.parse("line"))] == [
        "Menu home page link\n", "First sentence here. Second one! Third?\n", "last line"]
    assert [text[s:e] for s, e in span_bounds(text, SpanMode.parse("paragraph"))] == [
        "Menu home page link\n\n", "First sentence here. Second one! Third?\nlast line"]
    assert [text[s:e] for s, e in span_bounds(text, SpanMode.parse("sentences:2"))] == [
        "Menu home page link\n", "First sentence here. Second one! ", "Third?\n", "last line"]


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
