"""The HTML report's charts and the clusters command, on hand-built statistics and a real removed corpus on disk."""

from __future__ import annotations

import argparse
import json
import math
import re
from html.parser import HTMLParser

import numpy as np
import pytest

from gristmill.pipeline.commands import clusters as clusters_cmd
from gristmill.pipeline.format import (
    CORPUS_SCHEMA,
    REMOVED_SCHEMA,
    SOURCE_COLUMN,
    Corpus,
    CorpusError,
    ShardWriter,
)
from gristmill.pipeline.report import cluster_text
from gristmill.pipeline.report.duplicates import (
    find_cluster,
    find_clusters,
    load_texts,
    open_removed,
    similarity_grid,
)
from gristmill.pipeline.report.html_report import (
    ReportData,
    _nice_step,
    cluster_size_bins,
    render_html,
    similarity_bins,
    write_report,
)

pytestmark = pytest.mark.timeout(60)

STATS = {
    "documents": {"input": 100, "kept": 60, "exact_duplicate": 25, "near_duplicate": 10, "rejected": 5},
    "rejected": {"empty": 3, "invalid_utf8": 2},
    "bytes": {"input_documents": 400_000, "kept": 250_000, "rejected_records": 10},
    "approx_tokens": {"input_documents": 100_000, "kept": 62_500},
    "by_domain": {"a.example": {"input": 70, "kept": 30, "exact_duplicate": 25, "near_duplicate": 10, "rejected": 5},
                  "b.example": {"input": 30, "kept": 30, "exact_duplicate": 0, "near_duplicate": 0, "rejected": 0}},
    "by_language": {"en": {"input": 100, "kept": 60, "exact_duplicate": 25, "near_duplicate": 10, "rejected": 5}},
    "cluster_sizes": {"2": 12, "3": 5, "7": 1},
    "stage_seconds": {"read": 1.5, "exact": 0.25},
    "lost_to": {"b.example -> a.example": {"input": 9, "exact_duplicate": 4, "near_duplicate": 5}},
    "survivor_policy": "domains",
    "wall_seconds": 2.0,
    "params": {"threshold": 0.8, "num_perm": 128},
}


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def parse(page: str) -> list[tuple[str, dict[str, str | None]]]:
    collector = _Collect()
    collector.feed(page)
    return collector.tags


def _grid(values: list[float]) -> np.ndarray:
    return similarity_grid(np.array(values, float))


DATA = ReportData(
    similarities={"exact_duplicate": _grid([1.0] * 25), "near_duplicate": _grid([0.82, 0.9, 0.95] * 3 + [math.nan])},
    pairs={"linked": _grid([0.82, 0.9, 0.95] * 3), "below": _grid([0.7] * 2000 + [0.78] * 3)}, pairs_floor=0.6,
    lengths=np.bincount([3, 3, 4, 12], minlength=64), tokens=np.bincount([1, 2, 2, 9], minlength=64),
    crawl={"ok": 120, "http_404": 3, "robots": 9})


def test_report_is_self_contained_and_has_every_chart() -> None:
    page = render_html(STATS, DATA)
    tags = parse(page)
    assert not [t for t, _ in tags if t in ("script", "link", "img", "iframe")]
    assert not [a for _, a in tags for k, v in a.items() if k in ("src", "href") and v and "//" in v]
    ids = [a.get("id") for t, a in tags if t == "figure"]
    assert ids[:2] == ["chart-crawl", "chart-funnel"]  # for crawled input the crawl leads the funnel
    assert set(ids) == {"chart-crawl", "chart-funnel", "chart-cluster-sizes", "chart-similarity", "chart-pairs",
                        "chart-lengths", "chart-tokens", "chart-domains", "chart-languages", "chart-lost-to",
                        "chart-stages"}
    assert sum(t == "svg" for t, _ in tags) == 11
    assert "b.example -&gt; a.example: 9" in page and "--prefer domains" in page
    # the funnel's tooltips carry the real counts and shares
    for text in ("25 exact duplicates removed (25.0%)", "10 near duplicates removed (10.0%)", "60 kept (60.0%)",
                 "5 rejected removed (5.0%)", "65 remain"):
        assert text in page
    assert "a.example: 25 exact duplicate (35.7%)" in page  # per-domain shares are of that domain's input
    assert "146.5 KiB" in page and "~37,500" in page  # text and tokens saved
    assert "rejected: empty 3, invalid_utf8 2" in page
    # pairs below the threshold are drawn, on a log scale (2,000 in one bin beside bins of 3)
    assert "0.70: 2,000 below the threshold (kept apart)" in page and "0.78: 3 below the threshold" in page
    assert 'aria-label="candidate pairs by estimated similarity (log scale)"' in page
    assert "2,003 pairs fell below the threshold" in page
    assert "http_404: 3" in page and 'aria-label="crawl outcomes (log scale)"' not in page  # 120 vs 3: linear
    assert "4k-8k: 1 documents" in page and "8-16: 2 documents" in page  # bins 12 and 3 of the lengths


def test_report_without_optional_parts_still_renders() -> None:
    page = render_html({"documents": {"input": 0}})
    ids = {a.get("id") for t, a in parse(page) if t == "figure"}
    assert ids == {"chart-funnel"}


def test_chart_bins() -> None:
    assert [_nice_step(x) for x in (0, 1, 1.2, 3, 7, 11, 120)] == [1, 1, 2, 5, 10, 20, 200]
    assert cluster_size_bins({"2": 3, "3": 1}) == [("2", {"bar": 3}), ("3", {"bar": 1})]
    many = {str(k): 1 for k in range(2, 40)}
    names = [name for name, _ in cluster_size_bins(many)]
    assert names[:7] == ["2", "3", "4", "5", "6", "7", "8"] and names[7:] == ["9-16", "17-32", "33-64"]
    assert sum(b["bar"] for _, b in cluster_size_bins(many)) == 38
    bins, marker = similarity_bins({"exact_duplicate": _grid([1.0, 0.8]), "near_duplicate": _grid([0.81, 0.95])}, 0.8)
    assert bins[0][0] == "0.70" and bins[-1][0] == "0.98"
    assert sum(b["exact_duplicate"] + b["near_duplicate"] for _, b in bins) == 4
    assert bins[-1][1]["exact_duplicate"] == 1 and dict(bins)["0.80"] == {"exact_duplicate": 1, "near_duplicate": 1}
    assert marker == pytest.approx(1 / 3)


def _row(doc_id: str, text: str, source: str, **extra: object) -> dict:
    return {"id": doc_id, "text": text, SOURCE_COLUMN: source, "domain": source.split("/")[2], "language": "en",
            "cluster_id": extra.pop("cluster_id", doc_id), "cluster_size": extra.pop("cluster_size", 1), **extra}


ORIGINAL = "The mill turns again.\nVolunteers cleared the leat by hand over two winters.\nFlour is sold by the door."


@pytest.fixture()
def dedup_output(tmp_path):
    """A kept corpus and its removed corpus as gristmill dedup lays them out (real Parquet, real manifests)."""
    corpus, removed = str(tmp_path / "corpus"), str(tmp_path / "removed")
    kept = ShardWriter(corpus, CORPUS_SCHEMA)
    kept.write([_row("rep", ORIGINAL, "http://a.test/mill", cluster_size=4, is_representative=True),
                _row("solo", "Nothing like it.", "http://b.test/solo", is_representative=True),
                _row("rep2", "Bees on the roof.\nTwo hives.", "http://b.test/bees", cluster_size=2,
                     is_representative=True)])
    kept.commit(stats={"documents": {"input": 7}}, extra={"job": {"removed": removed}})
    gone = ShardWriter(removed, REMOVED_SCHEMA)
    gone.write([  # as the job writes them: cluster_id names the kept row, cluster_size counts every member
        _row("near", ORIGINAL.replace("two winters", "three winters") + "\nFirst published by the Post.",
             "http://wire.test/mill", cluster_id="rep", cluster_size=4, removed_as="near_duplicate",
             duplicate_of="rep", similarity=0.84, is_representative=False),
        _row("copy", ORIGINAL, "http://a.test/print/mill", cluster_id="rep", cluster_size=4,
             removed_as="exact_duplicate", duplicate_of="rep", similarity=1.0, is_representative=False),
        _row("copy-of-near", ORIGINAL.replace("two winters", "three winters") + "\nFirst published by the Post.",
             "http://mirror.test/mill", cluster_id="rep", cluster_size=4, removed_as="exact_duplicate",
             duplicate_of="near", similarity=1.0, is_representative=False),
        _row("bees-copy", "Bees on the roof.\nTwo hives.", "http://mirror.test/bees", cluster_id="rep2",
             cluster_size=2, removed_as="exact_duplicate", duplicate_of="rep2", similarity=1.0,
             is_representative=False),
        _row("seen-before", "An old story.", "http://b.test/old", cluster_id="earlier", cluster_size=2,
             removed_as="near_duplicate", duplicate_of="earlier", similarity=0.9,
             is_representative=False),  # lost to an --against corpus
    ])
    gone.commit(extra={"removed_from": corpus})
    return corpus, removed


def test_clusters_group_by_the_kept_row(dedup_output) -> None:
    corpus_url, removed_url = dedup_output
    corpus = Corpus.open(corpus_url)
    removed = open_removed(corpus)  # found through the manifest's job record
    assert removed.url == removed_url
    clusters = find_clusters(corpus, removed)
    assert [(c.id, c.size, c.exact, c.near) for c in clusters] == [
        ("rep", 4, 2, 1), ("earlier", 2, 0, 1), ("rep2", 2, 1, 0)]
    assert (clusters.count, clusters.held) == (3, 7)
    assert clusters[1].representative is None
    assert clusters[0].representative == "http://a.test/mill"
    assert [c.id for c in find_clusters(corpus, removed, top=2)] == ["rep", "earlier"]
    assert find_clusters(corpus, removed, top=2).count == 3  # the count is of every cluster, not the top
    cluster = find_cluster(corpus, removed, "copy-of")
    assert {m.id for m in cluster.members} == {"near", "copy", "copy-of-near"}
    load_texts(cluster, corpus, removed)
    assert all(m.text for m in cluster.everyone())


def test_removed_corpus_missing_is_a_clear_error(tmp_path) -> None:
    url = str(tmp_path / "plain")
    writer = ShardWriter(url, CORPUS_SCHEMA)
    writer.write([_row("x", "text", "http://a.test/x", is_representative=True)])
    writer.commit(extra={"job": {"removed": None}})
    with pytest.raises(CorpusError, match=r"plain: its dedup job kept no removed documents; rerun"):
        open_removed(Corpus.open(url))


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    clusters_cmd.add_arguments(parser)
    code = clusters_cmd.run(parser.parse_args(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_clusters_command_lists_and_shows_side_by_side(dedup_output, capsys) -> None:
    corpus_url, _ = dedup_output
    code, out, _ = run_cli([corpus_url, "--json"], capsys)
    listed = json.loads(out)
    assert code == 0 and [c["cluster_id"] for c in listed] == ["rep", "earlier", "rep2"]
    assert listed[1]["representative"] is None
    assert listed[0]["min_similarity"] == 0.84 and listed[0]["domains"] == ["a.test", "mirror.test", "wire.test"]
    code, out, _ = run_cli([corpus_url, "--show", "copy-of", "--width", "120"], capsys)  # a member's id prefix
    assert code == 0
    assert out.startswith("cluster rep: 4 documents (2 exact, 1 near duplicates)")
    assert "KEPT  http://a.test/mill" in out and "NEAR DUPLICATE  http://wire.test/mill" in out
    assert "similarity 0.840 (MinHash estimate)" in out
    assert "copy of near" in out  # the exact copy of the near duplicate says whose copy it is
    assert "text identical to the representative" in out  # the print copy
    assert re.search(r"^~ .*\[-two-\].*│ .*\{\+three\+\}", out, re.M)  # the changed word, both sides
    assert re.search(r"^\+ +│ First published by the Post\.$", out, re.M)  # the added paragraph, right only
    assert re.search(r"^= The mill turns again\. +│ The mill turns again\.$", out, re.M)
    assert all(len(line) <= 120 for line in out.splitlines() if "│" in line)
    code, out, _ = run_cli([corpus_url, "--top", "5"], capsys)
    assert code == 0 and "(in an earlier corpus)" in out and out.startswith("3 clusters with removed members, holding 7 of 8")
    code, out, _ = run_cli([corpus_url, "--show", "seen-before"], capsys)
    assert code == 0 and "the representative is not in this corpus" in out and "copy of earlier" in out
    code, _, err = run_cli([corpus_url, "--show", "nope"], capsys)
    assert code == 1 and "no cluster has a document whose id is or starts with 'nope'" in err
    code, _, err = run_cli([corpus_url + "-missing", "--show", "x"], capsys)
    assert code == 2 and "no manifest" in err


def test_side_by_side_keeps_wide_characters_aligned() -> None:
    old = "海沿いの町と山あいの温泉地を結ぶ全長四十キロのローカル線は、一日の利用者が千人を下回っている。"
    new = old.replace("四十", "五十")
    lines = list(cluster_text.side_by_side(old, new, 60))
    assert lines[0].startswith("~ ")
    bars = {cluster_text.display_width(line.split("│")[0]) for line in lines}
    assert len(bars) == 1  # the divider sits in the same column on every line
    assert "[-四-]" in "".join(lines) and "{+五+}" in "".join(lines)
    assert cluster_text.text_ratio(old, new) == pytest.approx(1 - 1 / len(old))


def test_write_report_finds_the_removed_corpus(dedup_output, tmp_path) -> None:
    corpus_url, _ = dedup_output
    path = write_report(corpus_url, str(tmp_path / "r.html"))
    page = open(path, encoding="utf-8").read()
    assert 'id="chart-similarity"' in page and "Lowest near-duplicate similarity bin: 0.84" in page


def test_side_by_side_marks_moved_paragraphs_once_per_side() -> None:
    old = "Title\nFirst paragraph here.\nSecond paragraph here.\nThird paragraph here."
    new = "Title\nFirst paragraph here.\nThird paragraph here.\nSecond paragraph here."
    lines = list(cluster_text.side_by_side(old, new, 80))
    markers = [line[0] for line in lines]
    assert markers.count("m") == 2 and "-" not in markers and "+" not in markers and "~" not in markers
    moved = [line for line in lines if line.startswith("m")]
    assert {"left" if line.split("│")[0][2:].strip() else "right" for line in moved} == {"left", "right"}


def test_report_command_line(dedup_output, tmp_path, capsys) -> None:
    from gristmill.pipeline.report.html_report import main

    corpus_url, removed_url = dedup_output
    target = tmp_path / "out.html"
    assert main([corpus_url, "-o", str(target)]) == 0 and target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert main([removed_url, "-o", str(tmp_path / "x.html")]) == 2  # the removed corpus carries no statistics
    assert "the manifest holds no statistics" in capsys.readouterr().err


def test_progress_lines_off_a_terminal_and_none_when_quiet() -> None:
    import io

    from gristmill.pipeline.report.progress import Progress

    log = io.StringIO()  # not a terminal: plain lines, here every update (every=0)
    with Progress("clusters: removed rows scanned", 200, "rows", stream=log, every=0) as progress:
        progress.update(50)
        progress.update(150)
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].startswith("clusters: removed rows scanned: 50/200 rows (25%), ")
    assert " rows/s, ETA " in lines[0] and lines[1].startswith("clusters: removed rows scanned: 200/200 rows (100%)")
    quiet = io.StringIO()
    with Progress("x", None, "row groups", quiet=True, stream=quiet, every=0) as progress:
        progress.update(3)
    assert quiet.getvalue() == ""


def test_length_histograms_sample_row_groups_spread_over_the_corpus(tmp_path, monkeypatch) -> None:
    from gristmill.pipeline.report import html_report

    url = str(tmp_path / "many")
    with ShardWriter(url, CORPUS_SCHEMA, row_group_bytes=2048, shard_bytes=8192) as writer:
        writer.write([_row(f"d{i:04d}", " ".join(["word"] * (1 << (i % 8))), f"http://a.test/{i}",
                           is_representative=True) for i in range(400)])  # 2^(i % 8) words each
        writer.commit(stats={"documents": {"input": 400, "kept": 400}})
    corpus = Corpus.open(url)
    groups = sum(len(shard.row_groups) for shard in corpus.shards)
    assert len(corpus.shards) > 1 and 8 < groups <= html_report.LENGTH_GROUPS
    whole = html_report.collect(corpus, None)
    assert whole.length_stride == 1 and whole.tokens.sum() == 400
    assert [int(whole.tokens[k]) for k in range(8)] == [50] * 8  # 2^k words land in bin k
    monkeypatch.setattr(html_report, "LENGTH_GROUPS", 4)
    sample = html_report.collect(corpus, None)
    assert sample.length_stride == -(-groups // 4) > 1
    assert 0 < sample.lengths.sum() < 400 and sample.lengths.sum() == sample.tokens.sum()
    page = html_report.render_html({"documents": {"input": 400, "kept": 400}}, sample)
    assert f"from every {sample.length_stride}th row group" in page
    assert "No candidate-pairs chart: the manifest lists no pairs table" in page


def test_crawl_outcomes_come_from_the_crawled_inputs_manifests(tmp_path) -> None:
    from gristmill.pipeline.format import RAW_CRAWL_SCHEMA
    from gristmill.pipeline.report.html_report import _crawl_outcomes

    crawls = []
    for name, outcomes in (("crawl-a", {"ok": 5, "http_404": 2}), ("crawl-b", {"ok": 3, "robots": 4})):
        url = str(tmp_path / name)
        with ShardWriter(url, RAW_CRAWL_SCHEMA) as writer:
            writer.write([{"id": f"{name}-1", "text": "a page", "url": "http://a.test/", "status": 200}])
            writer.commit(stats={"crawl": {"documents": outcomes["ok"], "outcomes": outcomes, "parked_hosts": {}}})
        crawls.append(url)
    plain = tmp_path / "more.jsonl"
    plain.write_text('{"text": "x"}\n')
    url = str(tmp_path / "corpus")
    with ShardWriter(url, CORPUS_SCHEMA) as writer:
        writer.write([_row("x", "text", "http://a.test/x", is_representative=True)])
        writer.commit(stats={"documents": {"input": 1}}, extra={"job": {"inputs": [*crawls, str(plain), 7]}})
    assert _crawl_outcomes(Corpus.open(url)) == {"ok": 8, "http_404": 2, "robots": 4}  # the file is no crawl
