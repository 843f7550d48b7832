"""MinHasher behaviour: golden vectors, determinism across processes, shingle modes, edge cases."""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from gristmill import dedup

GOLDEN_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "我们今天在北京的公园里散步，天气非常好。",
    "two words",
    "",
]
# Signatures of GOLDEN_TEXTS with MinHasher() defaults: first three values and xxh3-64 of all 128.
GOLDEN = [
    ([980373920431093422, 381304124087137738, 215063516431006428], "167e3230b10e6a43"),
    ([188122673876579444, 233903242551265503, 255942540511593311], "1e1bcac663f31649"),
    ([268211749117065974, 1502145136006272855, 746680978313168712], "909c68e48ca1a6c0"),
    ([dedup.SENTINEL] * 3, "91a9afd3ad9eb82e"),
]


def digest(row: np.ndarray) -> str:
    return xxhash.xxh3_64_hexdigest(row.astype("<u8").tobytes())


def test_golden_vectors() -> None:
    signatures = dedup.MinHasher().signatures(GOLDEN_TEXTS)
    assert [(row[:3].tolist(), digest(row)) for row in signatures] == GOLDEN
    assert dedup.content_hash(GOLDEN_TEXTS[0]) == "e9a1932627d7f46d15c21eead63fa21f"


def test_same_signatures_in_another_process_with_another_hash_seed() -> None:
    code = textwrap.dedent(
        """
        import json, sys
        import xxhash
        from gristmill import dedup
        sig = dedup.MinHasher(num_perm=64, ngram=3).signatures(json.loads(sys.argv[1]))
        print(xxhash.xxh3_64_hexdigest(sig.astype("<u8").tobytes()))
        """
    )
    env = {"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(GOLDEN_TEXTS)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    here = dedup.MinHasher(num_perm=64, ngram=3).signatures(GOLDEN_TEXTS)
    assert out.stdout.strip() == xxhash.xxh3_64_hexdigest(here.astype("<u8").tobytes())


def test_pickled_hasher_gives_identical_signatures() -> None:
    hasher = dedup.MinHasher(num_perm=32, ngram=4, shingle="word", seed=7)
    clone = pickle.loads(pickle.dumps(hasher))
    assert clone == hasher
    np.testing.assert_array_equal(clone.signatures(GOLDEN_TEXTS), hasher.signatures(GOLDEN_TEXTS))


def test_arrow_input_equals_list_input() -> None:
    texts = GOLDEN_TEXTS * 3
    hasher = dedup.MinHasher()
    expected = hasher.signatures(texts)
    np.testing.assert_array_equal(hasher.signatures(pa.array(texts)), expected)
    np.testing.assert_array_equal(hasher.signatures(pa.array(texts, pa.large_string())), expected)
    chunked = pa.chunked_array([pa.array(texts[:5]), pa.array(texts[5:])])
    np.testing.assert_array_equal(hasher.signatures(chunked), expected)
    np.testing.assert_array_equal(hasher.signatures(pa.array(texts).slice(2, 5)), expected[2:7])
    assert dedup.content_hashes(pa.array(texts)) == dedup.content_hashes(texts)


def test_seed_and_parameters_change_the_signature() -> None:
    text = GOLDEN_TEXTS[0]
    base = dedup.MinHasher().signatures([text])
    assert not np.array_equal(dedup.MinHasher(seed=1).signatures([text]), base)
    assert not np.array_equal(dedup.MinHasher(ngram=3).signatures([text]), base)
    assert dedup.MinHasher(num_perm=256).signatures([text]).shape == (1, 256)


def test_normalisation_makes_variants_identical() -> None:
    variants = [
        "The Quick brown fox — jumps over the lazy dog!",
        "the quick brown fox jumps over the lazy dog",
        "THE QUICK  BROWN\tFOX\njumps, over the LAZY dog...",
        "Ｔｈｅ ｑｕｉｃｋ brown fox jumps over the lazy dog",  # full-width letters (NFKC)
    ]
    signatures = dedup.MinHasher().signatures(variants)
    assert (signatures == signatures[0]).all()
    raw = dedup.MinHasher(normalize=dedup.NormalizeOptions(False, False, False, False)).signatures(variants)
    assert len({row.tobytes() for row in raw}) == len(variants)


def test_auto_mode_picks_char_shingles_for_scripts_without_spaces() -> None:
    texts = [
        "我们今天在北京的公园里散步，天气非常好。",  # Chinese
        "今日はとても良い天気ですね。散歩に行きましょう。",  # Japanese
        "ภาษาไทยเขียนติดกันโดยไม่มีช่องว่างระหว่างคำ",  # Thai
        "The quick brown fox jumps over the lazy dog.",
        "한국어는 단어 사이에 띄어쓰기를 합니다",  # Korean is written with spaces
        "Kurz gesagt: Peking heißt 北京",  # mostly Latin
    ]
    _, char_mode = dedup.MinHasher().signatures_with_modes(texts)
    assert char_mode.tolist() == [True, True, True, False, False, False]
    _, forced = dedup.MinHasher(shingle="word").signatures_with_modes(texts)
    assert not forced.any()
    _, forced = dedup.MinHasher(shingle="char").signatures_with_modes(texts)
    assert forced.all()


def test_chinese_near_duplicates_are_similar_under_char_shingles() -> None:
    base = "自然语言处理是计算机科学和人工智能的一个分支，研究如何让计算机理解和生成人类语言。" * 3
    edited = base.replace("分支", "领域", 1)
    other = "今天的天气很好，我们决定去公园散步，然后在湖边吃午饭，下午回家休息。" * 3
    sig = dedup.MinHasher(num_perm=256).signatures([base, edited, other])
    assert dedup.estimated_jaccard(sig[0], sig[1])[0] > 0.8
    assert dedup.estimated_jaccard(sig[0], sig[2])[0] < 0.1
    words = dedup.MinHasher(num_perm=256, shingle="word").signatures([base, edited])
    assert dedup.estimated_jaccard(words[0], words[1])[0] < 0.5  # one "word" per sentence: edits hurt


@pytest.mark.parametrize("text", ["", "   ", "\n\t \u3000", "... !!! ---", "\u00a0"])
def test_text_without_tokens_gets_the_sentinel(text: str) -> None:
    signature = dedup.MinHasher().signatures([text, "real words here"])
    assert (signature[0] == dedup.SENTINEL).all()
    assert (signature[1] < dedup.MERSENNE_61).all()


def test_fewer_tokens_than_ngram_is_one_shingle_of_all_tokens() -> None:
    hasher = dedup.MinHasher(ngram=5)
    short = hasher.signatures(["alpha beta", "Alpha, BETA!", "beta alpha", "alpha"])
    assert (short < dedup.MERSENNE_61).all()
    np.testing.assert_array_equal(short[0], short[1])  # normalisation still applies
    assert not np.array_equal(short[0], short[2])  # the shingle keeps token order
    assert not np.array_equal(short[0], short[3])
    exact = dedup.MinHasher(ngram=2).signatures(["alpha beta"])  # one 2-token shingle: the same one
    np.testing.assert_array_equal(short[0], exact[0])


def test_estimate_tracks_exact_jaccard_of_shingle_sets() -> None:
    rng = random.Random(3)
    vocabulary = [f"w{i}" for i in range(5000)]
    base = [rng.choice(vocabulary) for _ in range(600)]
    hasher = dedup.MinHasher(num_perm=512, ngram=1)
    for keep in (0.3, 0.6, 0.9):
        other = [w if rng.random() < keep else rng.choice(vocabulary) for w in base]
        a, b = set(base), set(other)
        truth = len(a & b) / len(a | b)
        sig = hasher.signatures([" ".join(base), " ".join(other)])
        # standard error of the estimate is sqrt(J(1-J)/512) <= 0.023; allow about 3.5 of them
        assert abs(dedup.estimated_jaccard(sig[0], sig[1])[0] - truth) < 0.08


@pytest.mark.timeout(120)
def test_ten_megabyte_text() -> None:
    """A 10 MB document: every shingle counts, so its signature equals that of two periods of it."""
    rng = random.Random(10)
    vocabulary = [f"token{i}" for i in range(3000)]
    paragraph = " ".join(rng.choice(vocabulary) for _ in range(1200))
    repeats = 10_000_000 // len(paragraph) + 1
    huge = " ".join([paragraph] * repeats)
    assert len(huge) > 10_000_000
    hasher = dedup.MinHasher()
    signatures = hasher.signatures([huge, f"{paragraph} {paragraph}"])
    np.testing.assert_array_equal(signatures[0], signatures[1])
    assert (signatures[0] < dedup.MERSENNE_61).all()
    cut = huge.index(" ", len(huge) // 2)  # with unigrams the shingle set is the union of the halves
    halves = dedup.MinHasher(ngram=1).signatures([huge[:cut], huge[cut + 1 :], huge])
    np.testing.assert_array_equal(np.minimum(halves[0], halves[1]), halves[2])
    assert len(dedup.content_hash(huge)) == 32


def test_bad_input_names_the_document() -> None:
    hasher = dedup.MinHasher()
    with pytest.raises(TypeError, match="document 1 is null"):
        hasher.signatures(["fine", None])
    with pytest.raises(TypeError, match="document 0 is a bytes"):
        hasher.signatures([b"bytes"])
    with pytest.raises(ValueError, match="document 2 is not valid Unicode"):
        hasher.signatures(["a", "b", "lone \ud800 surrogate"])
    with pytest.raises(ValueError, match="shingle must be one of"):
        dedup.MinHasher(shingle="bytes")
    with pytest.raises(ValueError, match="ngram must be at least 1"):
        dedup.MinHasher(ngram=0)
