"""`make demo` end to end in a subprocess: crawl -> Ray dedup -> corpus -> stats -> report -> loader batches.

The HTML report is opened in headless Chromium (Debian's chromium package; `make system-deps`), which
must render its charts: the screenshot has to hold the charts' colours, and the DOM their SVG bars.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from gristmill.pipeline import cli
from gristmill.pipeline.demo.site.content import SITE_HOSTS, build_sites, load_articles
from gristmill.pipeline.format import SOURCE_COLUMN, Corpus
from gristmill.pipeline.report.duplicates import find_clusters, open_removed
from gristmill.pipeline.report.html_report import COLORS

pytestmark = pytest.mark.timeout(300)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, str, dict]:
    """Runs ``python -m gristmill.pipeline.demo`` (what ``make demo`` runs) once; returns (output dir, stdout, summary)."""
    output = tmp_path_factory.mktemp("demo") / "out"
    done = subprocess.run([sys.executable, "-m", "gristmill.pipeline.demo", "--output", str(output)], capture_output=True,
                          text=True, timeout=280, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return output, done.stdout, json.loads((output / "summary.json").read_text(encoding="utf-8"))


def test_demo_writes_a_verified_corpus_whose_statistics_add_up(demo) -> None:
    output, stdout, summary = demo
    corpus = Corpus.open(str(output / "corpus"))
    assert all(result.ok for result in corpus.verify())
    stats = corpus.stats
    docs = stats["documents"]
    assert docs["input"] == docs["kept"] + docs["exact_duplicate"] + docs["near_duplicate"] + docs["rejected"]
    assert docs["input"] == summary["crawl"]["documents"] > 60  # every crawled page went in
    assert docs["exact_duplicate"] > 0 and docs["near_duplicate"] > 0
    assert corpus.num_rows == docs["kept"]
    removed = open_removed(corpus)
    assert removed.num_rows == docs["exact_duplicate"] + docs["near_duplicate"]
    for key in ("by_domain", "by_language", "by_source"):
        for outcome in ("input", "kept", "exact_duplicate", "near_duplicate", "rejected"):
            assert sum(row[outcome] for row in stats[key].values()) == docs[outcome], (key, outcome)
    assert set(stats["by_domain"]) == set(SITE_HOSTS)
    assert {"en", "de", "ja", "pt"} <= set(stats["by_language"])
    clusters = find_clusters(corpus, removed)
    assert sum(int(size) * count for size, count in stats["cluster_sizes"].items()) == sum(c.size for c in clusters)
    assert sum(stats["cluster_sizes"].values()) == len(clusters)
    # Ground truth from the site: each article (origin, print copy, mirror, wire near-copy) survives exactly once.
    sites = build_sites({host: f"http://{host}" for host in SITE_HOSTS})
    survivors: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    for source in corpus.to_table([SOURCE_COLUMN])[SOURCE_COLUMN].to_pylist():
        parts = urlsplit(source)
        page = sites[parts.hostname][unquote(parts.path)]
        if page.kind in ("article", "print", "mirror", "syndicated"):
            survivors[page.original or unquote(parts.path)] += 1
            kinds[page.kind] += 1
    assert len(survivors) == len(load_articles()) and set(survivors.values()) == {1}, survivors
    # --prefer domains:publishers.txt: every story survives on its publisher's site, none on the wire or mirror
    assert set(kinds) <= {"article", "print"}, kinds
    assert stats["survivor_policy"].startswith(f"domains:{output / 'publishers.txt'}")
    assert {pair for pair in stats["lost_to"] if pair.startswith("newswire.test -> ")} == {
        "newswire.test -> lindenpost.test", "newswire.test -> yamakaze.test", "newswire.test -> jornaldovale.test"}
    assert "lost to    " in stdout and "newswire.test -> lindenpost.test: " in stdout
    # and the demo told the user where everything went
    for name in ("corpus", "removed", "report.html", "tokenizer.json", "summary.json"):
        assert str(output / name) in stdout
    assert "gristmill clusters" in stdout and summary["checks"]["shards_verified"]


def test_demo_recuts_its_clusters_at_another_threshold_without_a_rerun(demo) -> None:
    output, stdout, summary = demo
    recut = summary["checks"]["what_if"]
    near = Corpus.open(str(output / "corpus")).stats["documents"]["near_duplicate"]
    assert recut["now"]["near_duplicates"] == near > 0  # the stored pairs agree with the job's own count
    assert recut["then"]["near_duplicates"] < near  # at 0.9 the wire's edited copies no longer all link
    assert recut["then"]["kept"] - recut["now"]["kept"] == near - recut["then"]["near_duplicates"]
    assert f"--what-if {recut['threshold']}" in stdout and "What if the threshold were 0.9?" in stdout


def test_demo_streams_one_epoch_of_packed_batches(demo) -> None:
    _, stdout, summary = demo
    loader = summary["loader"]
    assert loader["batches"] >= 2 and loader["shape"] == [8, 256] and loader["dtype"] == "int32"
    # every batch but the last is full (one process, no step quota: the last holds what is left)
    positions = loader["tokens"] + loader["padding"]
    assert (loader["batches"] - 1) * 8 * 256 < positions <= loader["batches"] * 8 * 256
    assert loader["padding"] < 256  # packing pads only the end of the last row
    assert loader["counters"]["blocks_fetched"] >= 1 and loader["counters"]["batches"] == loader["batches"]
    # a real piece of text: in bytes, since 256 tokens of Japanese are some 80 characters (which one comes
    # first depends on the crawl's timing; a row may end inside a character, decoded as U+FFFD)
    assert len(loader["sample_text"].encode()) > 100
    assert summary["resume"] == {**summary["resume"], "checked": True, "identical": True}
    assert "remaining batches are identical" in stdout


def test_stats_json_is_the_manifest_statistics(demo, capsys) -> None:
    output, _, summary = demo
    assert cli.main(["stats", str(output / "corpus"), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats == Corpus.open(str(output / "corpus")).stats == summary["stats"]


def test_clusters_command_on_the_demo_corpus(demo, capsys) -> None:
    output, _, summary = demo
    example = summary["checks"]["example_cluster"]
    assert cli.main(["clusters", str(output / "corpus"), "--show", example[:10], "--width", "140"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cluster {example}:") and "KEPT  http://" in out
    assert "NEAR DUPLICATE  http://" in out and "difflib ratio" in out


def _chromium() -> str:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "headless Chromium is needed: install Debian's chromium and chromium-driver (make system-deps)"
    return binary


def test_html_report_renders_its_charts_in_headless_chromium(demo, tmp_path) -> None:
    from PIL import Image

    output, _, _ = demo
    report = (output / "report.html").resolve()
    url = report.as_uri()
    dom = subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile-dom'}",
                          "--dump-dom", url], capture_output=True, text=True, timeout=90)
    assert dom.returncode == 0, dom.stderr[-2000:]
    for chart in ("chart-funnel", "chart-cluster-sizes", "chart-similarity", "chart-domains", "chart-languages",
                  "chart-stages"):
        start = dom.stdout.index(f'id="{chart}"')
        figure = dom.stdout[start:dom.stdout.index("</figure>", start)]
        assert "<svg" in figure and figure.count("<rect") >= 3, chart
    shot = tmp_path / "report.png"
    done = subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile-shot'}",
                           "--window-size=1280,2600", f"--screenshot={shot}", url],
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 2600)
    colours = {colour: count for count, colour in image.getcolors(maxcolors=1 << 24)}
    assert len(colours) > 200  # text, bars and anti-aliasing: far from a blank page
    background = max(colours.values())
    assert background < 0.8 * image.size[0] * image.size[1]
    for outcome in ("kept", "exact_duplicate", "near_duplicate"):
        rgb = tuple(int(COLORS[outcome][i:i + 2], 16) for i in (1, 3, 5))
        assert colours.get(rgb, 0) > 500, (outcome, colours.get(rgb, 0))  # the bars were painted
