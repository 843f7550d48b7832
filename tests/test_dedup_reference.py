"""The compiled normalisation and MinHash against a plain-Python, big-integer reference.

The reference below re-implements docs/DEDUP.md from scratch with ``unicodedata``, ``str.split`` and
unbounded Python integers (so no step can wrap around), and hypothesis feeds both random texts,
options, seeds and sizes.
"""

from __future__ import annotations

import difflib
import textwrap
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gristmill import dedup
from gristmill.dedup import _kernels as K

P = (1 << 61) - 1
MASK = (1 << 64) - 1


def ref_normalize(text: str, opt: dedup.NormalizeOptions) -> str:
    if opt.ignorables:  # Unicode's Default_Ignorable_Code_Point, from the regex module's own data
        text = regex.sub(r"\p{Default_Ignorable_Code_Point}", "", text)
    if opt.nfkc:  # texts this short have no run of over 30 marks, so stream-safe changes nothing
        text = unicodedata.normalize("NFKC", text)
    if opt.casefold:
        text = text.casefold()
    out = []
    for ch in text:
        category = unicodedata.category(ch)
        if opt.punctuation and not ch.isspace() and category[0] in "PS":
            out.append(" ")
        elif opt.digits and not ch.isspace() and category == "Nd":
            out.append("0")
        else:
            out.append(ch)
    text = "".join(out)
    return " ".join(text.split()) if opt.whitespace else text


def fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & MASK
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & MASK
    return h ^ (h >> 33)


def token_hash(token: str) -> int:
    h = 0xCBF29CE484222325
    for byte in token.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & MASK
    return fmix64(h)


def is_nospace_letter(ch: str) -> bool:
    category = unicodedata.category(ch)
    in_range = any(lo <= ord(ch) <= hi for lo, hi in dedup.NO_SPACE_RANGES)
    return in_range and not ch.isspace() and category[0] not in "PS" and category != "Nd"


def ref_signature(text: str, hasher: dedup.MinHasher) -> tuple[list[int], bool]:
    words = ref_normalize(text, hasher.normalize).split()
    chars = list("".join(words))
    if hasher.shingle == "auto":
        char_mode = bool(chars) and sum(map(is_nospace_letter, chars)) >= hasher.nospace_fraction * len(chars)
    else:
        char_mode = hasher.shingle == "char"
    tokens = [token_hash(t) for t in (chars if char_mode else words)]
    if not tokens:
        return [dedup.SENTINEL] * hasher.num_perm, char_mode
    span = min(hasher.char_ngram if char_mode else hasher.ngram, len(tokens))
    shingles = []
    for start in range(len(tokens) - span + 1):
        h = 0x9E3779B97F4A7C15
        for t in tokens[start : start + span]:
            h = fmix64(h ^ t)
        shingles.append(h % P)
    a, b = dedup.minhash.permutations(hasher.num_perm, hasher.seed)
    return [
        min((int(aj) * x + int(bj)) % P for x in shingles) for aj, bj in zip(a, b, strict=True)
    ], char_mode


ALPHABET = list(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    "     \t\n.,;:!?-'\"()[]{}<>/\\|@#$%^&*+=_~`"
    "éÉßẞİıçÇñœŒﬁﬂ"  # accents, case-folding specials, ligatures
    "０１２３ＡＢＣａｂｃ！？"  # full-width forms (NFKC)
    "\u00a0\u2003\u3000\u2028\u0085\u200b"  # exotic spaces and a zero-width space (not white space)
    "中文字词语的了是在我有他这日本語ひらがなカタカナ"
    "ภาษาไทย๑๒๓"  # Thai letters and Thai digits
    "٣٤٥αβγΣσςДЖж€£¥©®™°±×÷—–…“”‘’«»"
)
text_strategy = st.lists(
    st.one_of(st.sampled_from(ALPHABET), st.characters(blacklist_categories=("Cs",))), max_size=120
).map("".join)
options_strategy = st.builds(
    dedup.NormalizeOptions,
    nfkc=st.booleans(),
    casefold=st.booleans(),
    whitespace=st.booleans(),
    punctuation=st.booleans(),
    digits=st.booleans(),
    ignorables=st.booleans(),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=text_strategy, opt=options_strategy)
def test_normalize_matches_reference(text: str, opt: dedup.NormalizeOptions) -> None:
    assert dedup.normalize(text, opt) == ref_normalize(text, opt)


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(text_strategy, min_size=1, max_size=8), opt=options_strategy)
def test_content_hashes_equal_exactly_when_normal_forms_equal(texts: list[str], opt) -> None:
    hashes = dedup.content_hashes(texts, opt)
    forms = [ref_normalize(t, opt) for t in texts]
    assert all(len(h) == 32 and int(h, 16) >= 0 for h in hashes)
    for i in range(len(texts)):
        for j in range(len(texts)):
            assert (hashes[i] == hashes[j]) == (forms[i] == forms[j])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(text_strategy, min_size=1, max_size=4),
    opt=options_strategy,
    num_perm=st.integers(1, 24),
    ngram=st.integers(1, 6),
    char_ngram=st.integers(1, 6),
    shingle=st.sampled_from(["auto", "word", "char"]),
    seed=st.integers(0, (1 << 64) - 1),
)
def test_signatures_match_big_integer_reference(
    texts, opt, num_perm, ngram, char_ngram, shingle, seed
) -> None:
    hasher = dedup.MinHasher(num_perm, ngram, shingle, char_ngram, seed, opt)
    signatures, char_mode = hasher.signatures_with_modes(texts)
    assert signatures.shape == (len(texts), num_perm) and signatures.dtype == np.uint64
    for row, is_char, text in zip(signatures, char_mode, texts, strict=True):
        expected, expected_char = ref_signature(text, hasher)
        assert row.tolist() == expected
        assert bool(is_char) == expected_char


def test_signatures_of_real_text_match_reference_at_full_size() -> None:
    """128 permutations over a few hundred shingles: the vectorised loop's main body, not its tail."""
    texts = [Path(module.__file__).read_text(encoding="utf-8")[:3000] for module in (textwrap, difflib)]
    hasher = dedup.MinHasher()
    signatures = hasher.signatures(texts)
    for row, text in zip(signatures, texts, strict=True):
        assert row.tolist() == ref_signature(text, hasher)[0]


@settings(max_examples=1000, deadline=None)
@given(a=st.integers(0, P - 1), x=st.integers(0, P - 1), b=st.integers(0, P - 1))
def test_mulmod_is_exact_over_the_whole_range(a: int, x: int, b: int) -> None:
    got = K._perm(np.uint64(a & 0xFFFFFFFF), np.uint64(a >> 32), np.uint64(x), np.uint64(b))
    assert int(got) == (a * x + b) % P


@pytest.mark.parametrize("a, x, b", [(P - 1, P - 1, P - 1), (P - 1, 1 << 60, 0), (1 << 60, 1 << 60, P - 1)])
def test_mulmod_extremes_where_plain_uint64_arithmetic_wraps(a: int, x: int, b: int) -> None:
    with np.errstate(over="ignore"):
        naive = int((np.uint64(a) * np.uint64(x) + np.uint64(b)) % np.uint64(P))
    exact = (a * x + b) % P
    assert naive != exact  # the input really overflows 64 bits ...
    got = K._perm(np.uint64(a & 0xFFFFFFFF), np.uint64(a >> 32), np.uint64(x), np.uint64(b))
    assert int(got) == exact  # ... and the kernel still gets it right
