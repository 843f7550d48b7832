"""``gristmill dedup --spans``: on a real local Ray, a span repeated across documents is kept in exactly
one of them and cut from the rest, whatever the files and splits; a span in one document is never cut;
input bytes = kept + cut as spans + removed documents; without ``--spans`` nothing changes."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gristmill.dedup.normalize import normalize
from gristmill.dedup.spans import SpanMode, span_bounds
from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job import DedupConfig, DedupError, run_dedup
from gristmill.pipeline.job.config import index_params
from gristmill.pipeline.job.inputs import plan_splits, resolve_inputs
from gristmill.pipeline.job.plan import job_fingerprint

pytestmark = pytest.mark.timeout(600)
# each example is two Ray jobs: no shrinking, which would run dozens more
JOBS = settings(max_examples=4, deadline=None, phases=(Phase.explicit, Phase.reuse, Phase.generate),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SAME = ("id", "text", "content_hash", "cluster_id", "cluster_size", "removed_as", "duplicate_of")  # not the source
BOILERPLATE = ["Home | News | Sport | Weather | Contact us", "Subscribe to our newsletter for daily updates",
               "Copyright 2026 Example Media Group. All rights reserved.", "Share this article on social media now",
               "Cookies help us deliver our services to you."]
WORDS = ("river stone lantern orbit violet marble canyon harbor willow ember falcon meadow quartz summit "
         "thistle glacier copper saffron tundra beacon walnut cobalt prairie").split()


def _documents(seed: int, count: int, boiler_rate: float) -> list[dict[str, str]]:
    """Documents of unique lines of random words with boilerplate lines drawn from a small pool."""
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        lines = []
        for j in range(rng.randint(2, 6)):
            if rng.random() < boiler_rate:
                lines.append(rng.choice(BOILERPLATE))
            else:
                lines.append(f"doc {i} line {j}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))))
        docs.append({"id": f"d{i:03d}", "text": "\n".join(lines) + rng.choice(["", "\n"])})
    return docs


def _write(docs: list[dict[str, str]], folder: Path, files: int) -> list[str]:
    folder.mkdir(parents=True)
    paths = []
    for f in range(files):
        path = folder / f"part{f}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs[f::files]))
        paths.append(str(path))
    return paths


def _rows(url: str) -> list[dict[str, Any]]:
    corpus = Corpus.open(url)
    tables = [pq.read_table(Path(url) / shard.path) for shard in corpus.manifest.shards]
    rows = pa.concat_tables(tables).to_pylist() if tables else []
    return sorted(({k: v for k, v in row.items() if k in SAME} for row in rows), key=lambda r: r["id"])


def _hashes(text: str, mode: SpanMode) -> set[str]:
    """The spans of a text as the job compares them (normalised), long enough to be cut."""
    return {n for s, e in span_bounds(text, mode) if len(n := normalize(text[s:e])) >= 20}


def _run(paths: list[str], out: Path, mode: str | None, **options: Any) -> dict[str, Any]:
    return run_dedup(DedupConfig(inputs=paths, output=str(out / "corpus"), removed=str(out / "removed"), spans=mode,
                                 **options))


def _check(docs: list[dict[str, str]], out: Path, stats: dict[str, Any], mode: str) -> None:
    """Every repeated span in exactly one output document, every unique one where it was, bytes add up."""
    parsed = SpanMode.parse(mode)
    kept = {r["id"]: r["text"] for r in _rows(str(out / "corpus"))}
    removed = {r["id"]: r["removed_as"] for r in _rows(str(out / "removed"))}
    assert set(kept) | set(removed) == {d["id"] for d in docs} and not set(kept) & set(removed)
    holders = defaultdict(set)  # span -> the documents that reached the span pass holding it
    for d in docs:
        if d["id"] in kept or removed[d["id"]] == "spans":
            for span in _hashes(d["text"], parsed):
                holders[span].add(d["id"])
    after = defaultdict(set)
    for doc_id, text in kept.items():
        for span in _hashes(text, parsed):
            after[span].add(doc_id)
    for span, where in holders.items():
        if len(where) > 1:
            assert len(after[span]) == 1, (span, where, after[span])
        elif next(iter(where)) in kept:
            assert after[span] == where  # a span in one document is never cut
    identity = stats["spans"]["bytes"]
    assert identity["input_documents"] == identity["kept"] + identity["cut_as_spans"] + identity["removed_documents"]
    assert identity["kept"] == sum(len(t.encode()) for t in kept.values())
    assert identity["input_documents"] == sum(len(d["text"].encode()) for d in docs)
    cut = pa.concat_tables([pq.read_table(out / "removed" / name) for name in
                            Corpus.open(str(out / "removed")).manifest.extra["spans_cut"]["files"]])
    assert sum(cut["bytes"].to_pylist()) == identity["cut_as_spans"] == stats["spans"]["bytes_cut"]
    assert set(cut["kept_by"].to_pylist()) <= set(kept)


@JOBS
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(2, 14), rate=st.floats(0.1, 0.9),
       mode=st.sampled_from(["line", "paragraph", "sentences:2"]))
def test_repeated_spans_are_kept_once_in_one_file_or_three(ray_local: None, tmp_path_factory: pytest.TempPathFactory,
                                                           seed: int, count: int, rate: float, mode: str) -> None:
    docs = _documents(seed, count, rate)
    root = tmp_path_factory.mktemp("spans")
    one = _run(_write(docs, root / "one", 1), root / "one-out", mode)
    _check(docs, root / "one-out", one, mode)
    three = _run(_write(docs, root / "three", 3), root / "three-out", mode, split_bytes=200)
    assert three["splits"] > 1
    assert _rows(str(root / "one-out" / "corpus")) == _rows(str(root / "three-out" / "corpus"))
    assert _rows(str(root / "one-out" / "removed")) == _rows(str(root / "three-out" / "removed"))
    assert one["spans"] == three["spans"]


def test_the_survivor_policy_picks_the_document_that_keeps_a_span(ray_local: None, tmp_path: Path) -> None:
    nav = "Home | News | Sport | Weather | Contact us\n"
    docs = [{"id": "a", "text": nav + "a short story about a river and its stones", "rank": 1},
            {"id": "b", "text": nav + "a much longer story about a lantern in orbit around violet marble", "rank": 5},
            {"id": "c", "text": nav, "rank": 0}]
    paths = _write(docs, tmp_path / "in", 1)  # type: ignore[arg-type]
    stats = _run(paths, tmp_path / "longest", "line", min_chars=10)
    kept = {r["id"]: r["text"] for r in _rows(str(tmp_path / "longest" / "corpus"))}
    assert [i for i, t in kept.items() if nav in t] == ["b"]  # the longest document keeps the span
    # c is all navigation: left empty once cut, it is removed for its spans
    assert {r["id"]: r["removed_as"] for r in _rows(str(tmp_path / "longest" / "removed"))} == {"c": "spans"}
    assert stats["documents"]["spans"] == stats["spans"]["documents_removed"] == 1
    assert stats["spans"]["top"] == [{"hash": stats["spans"]["top"][0]["hash"], "docs": 3, "text": nav.strip()}]
    _run(paths, tmp_path / "lowest", "line", prefer="column:-rank", min_chars=10)
    kept = {r["id"]: r["text"] for r in _rows(str(tmp_path / "lowest" / "corpus"))}
    assert [i for i, t in kept.items() if nav in t] == ["c"]  # c keeps it, so c is never removed as short
    assert kept["a"] == docs[0]["text"].removeprefix(nav) and kept["b"] == docs[1]["text"].removeprefix(nav)


def test_span_min_docs_leaves_spans_found_in_fewer_documents(ray_local: None, tmp_path: Path) -> None:
    docs = _documents(7, 10, 0.5)
    paths = _write(docs, tmp_path / "in", 1)
    stats = _run(paths, tmp_path / "out", "line", span_min_docs=1000)
    assert stats["spans"]["spans_cut"] == 0
    assert {r["id"]: r["text"] for r in _rows(str(tmp_path / "out" / "corpus"))} == {d["id"]: d["text"] for d in docs}


def test_without_spans_the_job_is_the_job_it_was(ray_local: None, tmp_path: Path) -> None:
    """Span options left at their defaults or changed do nothing without --spans: the fingerprint (which
    names every output file) and the manifest are the ones a job written before spans existed had."""
    docs = _documents(3, 8, 0.6)
    paths = _write(docs, tmp_path / "in", 1)
    plain = DedupConfig(inputs=paths, output=str(tmp_path / "a"))
    tuned = DedupConfig(inputs=paths, output=str(tmp_path / "a"), span_min_docs=9, min_chars=1, span_min_chars=3)
    splits = plan_splits(resolve_inputs(paths, {}), plain.split_bytes)
    assert job_fingerprint(plain, index_params(plain), splits, []) == job_fingerprint(tuned, index_params(tuned),
                                                                                      splits, [])
    stats = run_dedup(plain)
    manifest = Corpus.open(str(tmp_path / "a")).manifest
    assert "spans" not in stats and "spans" not in stats["documents"]
    assert not {"spans", "span_min_docs", "span_min_chars", "min_chars"} & set(manifest.extra["job"])
    assert "spans" not in stats["stage_seconds"]
    assert {r["id"]: r["text"] for r in _rows(str(tmp_path / "a"))} == {d["id"]: d["text"] for d in docs}


@pytest.mark.parametrize("options", [{"spans": "lines"}, {"spans": "line", "span_min_docs": 1},
                                     {"spans": "line", "min_chars": -1}])
def test_bad_span_options_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(DedupError, match="--span|--min-chars"):
        DedupConfig(inputs=["x"], output="y", **options)


def test_a_document_that_keeps_a_span_is_not_removed_as_short(ray_local: None, tmp_path: Path) -> None:
    """c keeps the navigation (longer than a) and loses the footer (to b): what is left is under
    --min-chars, but removing c would leave the navigation in no document at all."""
    nav, footer = "Home | News | Sport | Weather | Contact us\n", "Copyright 2026 Example Media Group. All rights reserved.\n"
    tale = "a short tale of a walnut and a falcon in a cold meadow"  # over --min-chars, a still shorter than c
    docs = [{"id": "a", "text": nav + tale}, {"id": "c", "text": nav + footer},
            {"id": "b", "text": footer + "a much longer story about a lantern in orbit around violet marble stones"}]
    stats = _run(_write(docs, tmp_path / "in", 1), tmp_path / "out", "line")
    kept = {r["id"]: r["text"] for r in _rows(str(tmp_path / "out" / "corpus"))}
    assert len(tale) >= 50 and len(docs[0]["text"]) < len(docs[1]["text"]) < len(docs[2]["text"])
    assert kept == {"a": tale, "c": nav, "b": docs[2]["text"]}
    assert stats["spans"]["documents_removed"] == 0


def test_cli_spans_then_stats_html_and_one_span(ray_local: None, tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    from gristmill.pipeline.cli import main

    nav = "Home | News | Sport | Weather | Contact us"
    docs = [{"id": f"p{i}", "text": f"{nav}\nstory {i}: " + " ".join(WORDS[i:i + 9]) + "\nShare this with friends"}
            for i in range(6)]
    paths = _write(docs, tmp_path / "in", 1)
    out, removed = str(tmp_path / "out"), str(tmp_path / "removed")
    assert main(["dedup", *paths, "-o", out, "--removed", removed, "--spans", "sentences:3", "--span-min-chars",
                 "5", "--min-chars", "10", "--quiet"]) == 0
    assert "most repeated spans" in capsys.readouterr().out
    assert main(["stats", out, "--json"]) == 0
    spans = json.loads(capsys.readouterr().out)["spans"]
    assert (spans["spans"], spans["span_min_chars"], spans["spans_cut"]) == ("sentences:3", 5, 10)
    assert sorted((s["text"], s["docs"]) for s in spans["top"]) == [(nav, 6), ("Share this with friends", 6)]
    top = next(s for s in spans["top"] if s["text"] == nav)
    html = tmp_path / "report.html"
    assert main(["stats", out, "--html", str(html)]) == 0
    assert "Spans cut (sentences:3)" in html.read_text() and top["hash"] in html.read_text()
    capsys.readouterr()
    assert main(["clusters", out, "--span", top["hash"][:6]]) == 0
    shown = capsys.readouterr().out
    kept_by = next(r["id"] for r in _rows(out) if nav in r["text"])
    assert f"kept in {kept_by}" in shown and nav in shown and shown.count("[0:43]") == 5
    assert main(["clusters", out, "--span", top["hash"][:6], "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["cut_from"]) == 5
    assert main(["clusters", out, "--span", "zz"]) == 1
    assert "no cut span" in capsys.readouterr().err


def test_against_cuts_the_spans_an_earlier_corpus_keeps(ray_local: None, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    nav = "Home | News | Sport | Weather | Contact us"
    first = [{"id": "old", "text": f"{nav}\nan old story about a copper beacon on the prairie"}]
    second = [{"id": "new1", "text": f"{nav}\na new story about a walnut frozen deep in the blue glacier"},
              {"id": "new2", "text": f"a second story about thistle, saffron and cobalt in the meadow\n{nav}"}]
    _run(_write(first, tmp_path / "a", 1), tmp_path / "first", "line")
    earlier = str(tmp_path / "first" / "corpus")
    assert Corpus.open(earlier).manifest.extra["span_index"]["spans"] == "line"
    stats = _run(_write(second, tmp_path / "b", 1), tmp_path / "second", "line", against=[earlier])
    kept = {r["id"]: r["text"] for r in _rows(str(tmp_path / "second" / "corpus"))}
    assert kept == {"new1": "a new story about a walnut frozen deep in the blue glacier",
                    "new2": "a second story about thistle, saffron and cobalt in the meadow\n"}
    cut = pq.read_table(tmp_path / "second" / "removed" / Corpus.open(str(tmp_path / "second" / "removed"))
                        .manifest.extra["spans_cut"]["files"][0])
    assert set(cut["kept_by"].to_pylist()) == {"old"} and stats["spans"]["spans_cut"] == 2
    with pytest.raises(DedupError, match="span_min_chars"):  # spans split otherwise cannot be compared
        _run(_write(second, tmp_path / "c", 1), tmp_path / "third", "line", against=[earlier], span_min_chars=5)
    monkeypatch.setattr("gristmill.dedup.spans.SPAN_HASH", "xxh3-64")  # as a job hashing otherwise would
    with pytest.raises(DedupError, match="span_hash=xxh64, this job uses span_hash=xxh3-64"):
        _run(_write(second, tmp_path / "d", 1), tmp_path / "fourth", "line", against=[earlier])
