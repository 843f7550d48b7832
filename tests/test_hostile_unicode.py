"""Hostile Unicode against normalisation: invisible characters and floods of combining marks.

The promises: a copy sprinkled with default-ignorable characters (soft hyphen, zero-width space,
joiners, BOM, tag characters, ...) hashes like the original, in the library, the dedup job and the
service; a text of nothing but them (and white space) is no document (a reject ``empty`` in the job,
a 400 from the service); normalising a flood of combining marks costs time linear in its length
(UAX #15's stream-safe format before NFKC), checked by counting CPU time of n and 8n characters.
"""

from __future__ import annotations

import dataclasses
import json
import random
import time
import unicodedata
from pathlib import Path

import pytest
import regex
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pipeline_data import real_texts, write_jsonl
from test_service import start_server

from gristmill import dedup
from gristmill.dedup.normalize import DEFAULT_NORMALIZE, content_hashes, is_blank, prefold
from gristmill.dedup.unicode_bounds import CGJ, DEFAULT_IGNORABLE_RANGES, MAX_NON_STARTERS, stream_safe
from gristmill.pipeline.cli import main
from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job.inputs import Doc
from gristmill.pipeline.job.read import _visible
from gristmill.pipeline.service.client import DedupClient, ServiceError

IGNORABLES = [chr(cp) for lo, hi in DEFAULT_IGNORABLE_RANGES for cp in range(lo, hi + 1)]
# every combining mark of planes 0-1, and the characters whose decomposition is marks only
MARKS = [chr(cp) for cp in range(0x20000) if unicodedata.combining(chr(cp))]
MARKS_ONLY = ["\u0f73", "\u0f75", "\u0f81", "\uff9e", "\uff9f", "\u0344"]


def with_invisibles(text: str, inserts: list[tuple[int, str]]) -> str:
    chars = list(text)
    for position, invisible in inserts:
        chars.insert(position % (len(chars) + 1), invisible)
    return "".join(chars)


INSERTS = st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(IGNORABLES)), min_size=1, max_size=20)


def test_the_ignorable_table_is_unicodes_default_ignorable_set() -> None:
    """Checked against the ``regex`` module's own Unicode data, not against a copy of our table."""
    prop = regex.compile(r"\p{Default_Ignorable_Code_Point}")
    assert IGNORABLES == [chr(cp) for cp in range(0x110000) if prop.match(chr(cp))]


@settings(max_examples=200, deadline=None)
@given(text=st.sampled_from(real_texts(20)) | st.text(min_size=1, max_size=200), inserts=INSERTS)
def test_invisible_characters_change_no_hash(text: str, inserts: list[tuple[int, str]]) -> None:
    copy = with_invisibles(text, inserts)
    assert dedup.normalize(copy) == dedup.normalize(text)
    assert dedup.content_hash(copy) == dedup.content_hash(text)
    assert (dedup.MinHasher().signatures([copy]) == dedup.MinHasher().signatures([text])).all()
    assert not set(dedup.normalize(copy)) & set(IGNORABLES)


@given(st.lists(st.sampled_from([*IGNORABLES, " ", "\t", "\n", "\u3000", "\u00a0"]), min_size=1, max_size=50))
def test_a_text_of_invisibles_and_white_space_is_blank(chars: list[str]) -> None:
    assert is_blank(prefold(["".join(chars)], DEFAULT_NORMALIZE)[0])


@pytest.mark.parametrize("text", ["a", "!", "\u0301", "x\u200b", "\U000e0041!"])
def test_a_visible_character_is_not_blank(text: str) -> None:
    assert not is_blank(prefold([text], DEFAULT_NORMALIZE)[0])



BLANKS = st.lists(st.sampled_from([*IGNORABLES, " ", "\t", "\n", "\u3000", "\u00a0", "\u2028", "\x1c"]), max_size=8)


@settings(max_examples=200, deadline=None)
@given(texts=st.lists(BLANKS.map("".join) | st.text(max_size=60) | st.sampled_from(real_texts(5)), min_size=1,
                      max_size=12),
       whitespace=st.booleans(), punctuation=st.booleans())
def test_the_read_stage_rejects_blank_texts_and_hashes_the_rest_as_the_library(texts: list[str], whitespace: bool,
                                                                                punctuation: bool) -> None:
    """The job's read stage (compiled steps 0-2, blanks found from the folded lengths) against the
    interpreter: the same texts rejected as ``empty``, the same steps 0-2 bytes and content hashes."""
    options = dataclasses.replace(DEFAULT_NORMALIZE, whitespace=whitespace, punctuation=punctuation)
    batch = [(Doc(None, t, "in.jsonl", None, None, None, f"line {i + 1}"), "in.jsonl") for i, t in enumerate(texts)]
    rejects: list = []
    kept, prefolded, hashes = _visible(batch, options, rejects)
    reference = prefold(texts, options)
    blank = [i for i, t in enumerate(reference) if is_blank(t)]
    assert [r.position for r, _ in rejects] == [f"line {i + 1}" for i in blank]
    assert {r.kind for r, _ in rejects} <= {"empty"}
    visible = [i for i in range(len(texts)) if i not in blank]
    assert [doc.text for doc, _ in kept] == [texts[i] for i in visible]
    assert prefolded.to_pylist() == [reference[i] for i in visible]
    assert hashes == content_hashes([texts[i] for i in visible], options)

def ref_stream_safe(text: str) -> str:
    """UAX #15 section 13's algorithm, character by character, straight from the text of the standard."""
    out, run = [], 0
    for ch in text:
        marks = [unicodedata.combining(c) != 0 for c in unicodedata.normalize("NFKD", ch)]
        leading = next((i for i, m in enumerate(marks) if not m), len(marks))
        trailing = next((i for i, m in enumerate(reversed(marks)) if not m), len(marks))
        if run + leading > MAX_NON_STARTERS:
            out.append(CGJ)
            run = 0
        out.append(ch)
        run = run + leading if leading == len(marks) else trailing
    return "".join(out)


MARKED_TEXT = st.lists(st.one_of(
    st.sampled_from(MARKS), st.sampled_from(MARKS_ONLY), st.sampled_from(["a", "é", "\u1e09", "ǘ", " "]),
    st.lists(st.sampled_from(MARKS + MARKS_ONLY), min_size=25, max_size=80).map("".join),
), max_size=40).map("".join)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(MARKED_TEXT)
def test_stream_safe_matches_the_standards_algorithm(text: str) -> None:
    assert stream_safe(text) == ref_stream_safe(text)


@given(st.text(max_size=200))
def test_stream_safe_changes_no_text_that_already_is(text: str) -> None:
    if CGJ not in ref_stream_safe(text):
        assert stream_safe(text) is text


def cpu_seconds(text: str) -> float:
    """The least CPU time of five normalisations: CPU time, not wall time, so that other processes on
    a shared machine do not count; the least, so a stray pause does not either."""
    times = []
    for _ in range(5):
        start = time.process_time()
        dedup.content_hash(text)
        times.append(time.process_time() - start)
    return min(times)


# the marks are in decreasing canonical class, so NFKC must reorder the whole run
HIGH = [m for m in MARKS if unicodedata.combining(m) == 230][:40]
LOW = [m for m in MARKS if 0 < unicodedata.combining(m) < 230][:40]


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(high=st.sampled_from(HIGH), low=st.sampled_from(LOW),
       between=st.sampled_from(["", "\u200b", "\u0f73", "\u00ad\u034f"]), base=st.sampled_from(["a", "", "ǘ", "字"]))
def test_normalising_a_flood_of_marks_takes_linear_time(high: str, low: str, between: str, base: str) -> None:
    """n and 8n repetitions: linear time gives a ratio near 8, the insertion sort of NFKC without the
    stream-safe bound ~64; 24 leaves room for noise and fixed costs without letting a square pass."""
    unit = high + between + low
    n = 2000
    dedup.content_hash(base + unit)  # compile and build the tables outside the measurement
    small, large = cpu_seconds(base + unit * n), cpu_seconds(base + unit * 8 * n)
    assert large < 24 * max(small, 1e-4), (small, large)


# -- the same normalisation in the library, the job and the service ------------------------------------
def test_the_library_keeps_one_of_a_text_and_its_invisibly_altered_copy() -> None:
    original = real_texts(1)[0]
    result = dedup.deduplicate([original, with_invisibles(original, [(5, "\u00ad"), (40, "\u200d")])])
    assert sorted(result.table["status"].to_pylist()) == ["exact_duplicate", "kept"]


def test_the_job_removes_invisible_copies_and_rejects_invisible_texts(ray_local: None, tmp_path: Path) -> None:
    rng = random.Random(3)
    texts = real_texts(6)
    copies = [with_invisibles(t, [(rng.randrange(len(t)), rng.choice(IGNORABLES)) for _ in range(8)]) for t in texts]
    blank = ["".join(rng.choices([*IGNORABLES, " ", "\n"], k=40)) for _ in range(3)]
    flood = "x" + "\u0301\u0316" * 20_000  # one visible letter under a flood of marks: a document
    source = tmp_path / "in.jsonl"
    write_jsonl(source, [*texts, *copies, *blank, flood])
    out = tmp_path / "corpus"
    assert main(["dedup", str(source), "-o", str(out)]) == 0
    stats = Corpus.open(str(out)).stats["documents"]
    assert stats["rejected"] == len(blank)
    assert stats["exact_duplicate"] == len(copies)
    assert stats["kept"] + stats["near_duplicate"] == len(texts) + 1  # the texts and the flood


def test_the_rejects_name_each_invisible_text(ray_local: None, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.jsonl"
    write_jsonl(source, [real_texts(1)[0], "\u200b\u2060 \ufeff", "\U000e0068\U000e0069"])
    out = tmp_path / "corpus"
    assert main(["dedup", str(source), "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["rejects", str(out), "--json"]) == 0
    rejects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["position"], r["kind"]) for r in rejects] == [("line 2", "empty"), ("line 3", "empty")]
    assert all("only white space and invisible characters" in r["reason"] for r in rejects)


def test_the_service_finds_invisible_copies_and_refuses_invisible_texts(tmp_path: Path) -> None:
    server = start_server(tmp_path / "state")
    try:
        client = DedupClient(server.url)
        original = real_texts(1)[0]
        assert client.add([("original", original)])[0].added
        copy = with_invisibles(original, [(3, "\u2060"), (30, "\ufeff"), (60, "\U000e0041")])
        assert client.check([copy])[0].exact_duplicate_of == "original"
        with pytest.raises(ServiceError, match="400: document 1 of the request has no text once normalised"):
            client.check([copy, "\u200b \u00ad\u200c"])
        assert client.stats()["documents"] == 1
    finally:
        server.stop()
