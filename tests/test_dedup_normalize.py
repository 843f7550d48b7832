"""Each normalisation step on its own, switched on and off, and the exact content hash."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gristmill import dedup
from gristmill.dedup.normalize import (
    DEFAULT_NORMALIZE,
    NormalizeOptions,
    fold_prepared,
    normalize_batch,
    prefold_batch,
    prepare,
)

NONE = dedup.NormalizeOptions(nfkc=False, casefold=False, whitespace=False, punctuation=False, digits=False,
                              ignorables=False)


def only(**flags: bool) -> dedup.NormalizeOptions:
    return dedup.NormalizeOptions(**{**NONE.__dict__, **flags})


def test_defaults() -> None:
    options = dedup.NormalizeOptions()
    assert (options.nfkc, options.casefold, options.whitespace, options.punctuation) == (True,) * 4
    assert options.digits is False
    assert dedup.normalize("  Hello,\tWORLD!  Straße ２０２４ ") == "hello world strasse 2024"


def test_all_steps_off_is_the_identity() -> None:
    text = " Ｈｅｌｌｏ,\t WORLD ٣ ! "
    assert dedup.normalize(text, NONE) == text


@pytest.mark.parametrize(
    "step, text, expected",
    [
        ("nfkc", "Ｈｅｌｌｏ ﬁne ½", "Hello fine 1⁄2"),
        ("nfkc", "caf\u0065\u0301", "café"),  # combining accent composed
        ("casefold", "Straße İSTANBUL", "strasse i̇stanbul"),
        ("punctuation", "end.Start a+b=c «x»", "end Start a b c  x "),
        ("digits", "2024 ٣ ٤", "0000 0 0"),
        ("whitespace", " a \t\n b\u3000c\u00a0 ", "a b c"),
    ],
)
def test_each_step_alone(step: str, text: str, expected: str) -> None:
    assert dedup.normalize(text, only(**{step: True})) == expected
    assert dedup.normalize(text, NONE) == text


def test_steps_compose_in_order() -> None:
    # NFKC turns the full-width comma into "," which punctuation folding then removes
    assert dedup.normalize("a，b", only(nfkc=True, punctuation=True)) == "a b"
    assert dedup.normalize("a，b", only(punctuation=True)) == "a b"  # U+FF0C is punctuation already
    # punctuation becomes spaces that whitespace folding then merges
    assert dedup.normalize("a -- b", only(punctuation=True, whitespace=True)) == "a b"
    assert dedup.normalize("a -- b", only(punctuation=True)) == "a    b"


def test_empty_and_whitespace_only() -> None:
    assert dedup.normalize("") == ""
    assert dedup.normalize(" \t\n\u3000 ") == ""
    assert dedup.content_hash("") == dedup.content_hash("  \n ") == dedup.content_hash("!?")


def test_content_hash_is_128_bit_xxh3_of_the_normal_form() -> None:
    import xxhash

    text = "Hello,   World!"
    assert dedup.content_hash(text) == xxhash.xxh3_128_hexdigest(b"hello world")
    assert dedup.content_hash(text, NONE) == xxhash.xxh3_128_hexdigest(text.encode())
    assert dedup.content_hashes(["a", "A", "b"]) == [dedup.content_hash("a")] * 2 + [dedup.content_hash("b")]
    assert dedup.content_hashes([]) == []


def test_options_are_frozen_and_hashable() -> None:
    options = dedup.NormalizeOptions()
    with pytest.raises(AttributeError):
        options.digits = True  # type: ignore[misc]
    assert {options, dedup.NormalizeOptions()} == {options}


def test_class_table_covers_every_code_point() -> None:
    """The table skips planes 4-13 and 15-16 for speed: nothing there is space, punctuation or a digit."""
    import unicodedata

    from gristmill.dedup.normalize import class_table

    table = class_table()
    skipped = (*range(0x40000, 0xE0000), *range(0xE1000, 0x110000))
    assert not any(chr(cp).isspace() or unicodedata.category(chr(cp))[0] in "PSN" for cp in skipped)
    assert table[0x20] == table[0x3000] == 1 and table[ord(",")] == table[ord("€")] == 2
    assert table[ord("7")] == table[0x0663] == 3 and table[ord("中")] == table[ord("ก")] == 4
    assert table[ord("a")] == table[ord("한")] == 0


def _split(data: np.ndarray, offsets: np.ndarray) -> list[bytes]:
    raw = data.tobytes()
    return [raw[offsets[i] - offsets[0]: offsets[i + 1] - offsets[0]] for i in range(len(offsets) - 1)]


def _compiled_and_plain(texts: list[str], options: NormalizeOptions) -> tuple[list[bytes], list[bytes]]:
    """Steps 0-2 of each text by ``prefold_batch`` and by the interpreter's ``prepare``."""
    return _split(*prefold_batch(pa.array(texts, pa.large_string()), options)), _split(*prepare(texts, options))


def _normalised_both_ways(texts: list[str], options: NormalizeOptions) -> tuple[list[bytes], list[bytes]]:
    """Steps 0-5 of each text by ``normalize_batch`` (one compiled pass) and by ``prepare`` then ``fold``."""
    return (_split(*normalize_batch(pa.array(texts, pa.large_string()), options)),
            _split(*fold_prepared(*prepare(texts, options), options)))


OPTIONS = st.builds(NormalizeOptions, nfkc=st.booleans(), casefold=st.booleans(), ignorables=st.booleans())
# what joins, reorders or splits under NFKC: marks of several classes, Hangul jamo and syllables,
# starters that compose with a preceding starter, ignorables between them, compatibility forms
JOINING = st.text(st.sampled_from(list("aeAEoßİΣﬁｆ…\u00a0\u0301\u0308\u0323\u0338\u0345\u094d\u093c\u0915"
                                       "\u1100\u1161\u11a8\uac00\u0b47\u0b3e\u0dd9\u0dcf\u00ad\u200b\u034f<=")),
                  max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(JOINING, st.text(max_size=40)), max_size=5), OPTIONS)
def test_the_compiled_prefold_equals_the_interpreters(texts: list[str], options: NormalizeOptions) -> None:
    compiled, plain = _compiled_and_plain(texts, options)
    assert compiled == plain


def test_every_character_alone_folds_as_the_interpreter_folds_it() -> None:
    texts = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
    compiled, plain = _compiled_and_plain(texts, DEFAULT_NORMALIZE)
    assert compiled == plain
    compiled, plain = _normalised_both_ways([f" {text}A{text}1 " for text in texts], DEFAULT_NORMALIZE)
    assert compiled == plain


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(JOINING, st.text(max_size=40)), max_size=5),
       st.builds(NormalizeOptions, *[st.booleans()] * 6))
def test_the_compiled_normalisation_equals_prefold_then_fold(texts: list[str], options: NormalizeOptions) -> None:
    compiled, plain = _normalised_both_ways(texts, options)
    assert compiled == plain


def test_a_batch_whose_folding_grows_it_elevenfold_is_normalised_whole() -> None:
    texts = ["\ufdfa" * 1000, "ŉ" * 500 + "Ǉ", "\ufdfa"]  # U+FDFA: 3 bytes in, 33 out (NFKC), the most of any
    compiled, plain = _normalised_both_ways(texts, DEFAULT_NORMALIZE)
    assert compiled == plain and len(compiled[0]) > 10 * len(texts[0].encode())
