"""``gristmill stats CORPUS --html FILE``: a real dedup run's corpus in, a self-contained HTML report with charts out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_pipeline_data import documents, write_parquet

from gristmill.pipeline.cli import main

pytestmark = pytest.mark.timeout(240)


def test_stats_html_writes_the_report_of_a_real_corpus(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                       ray_local: None) -> None:
    write_parquet(tmp_path / "in.parquet", documents(12), prefix="x")  # urls on three domains, a language
    out, removed, page = tmp_path / "corpus", tmp_path / "removed", tmp_path / "report.html"
    assert main(["dedup", str(tmp_path / "in.parquet"), "-o", str(out), "--removed", str(removed)]) == 0
    capsys.readouterr()
    assert main(["stats", str(out), "--json", "--html", str(page)]) == 0
    captured = capsys.readouterr()
    stats = json.loads(captured.out)  # --json stays plain JSON; the note about the file goes to stderr
    assert str(page) in captured.err
    html = page.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and "<script" not in html
    charts = set(re.findall(r'<figure class="chart" id="([^"]+)"', html))
    lost_to = {"chart-lost-to"} if stats.get("lost_to") else set()  # which domains lost to which, when recorded
    assert charts == {"chart-funnel", "chart-cluster-sizes", "chart-similarity", "chart-pairs", "chart-lengths",
                      "chart-tokens", "chart-domains", "chart-languages", "chart-sources", "chart-stages"} | lost_to
    pairs = json.loads((out / "_manifest.json").read_text())["extra"]["pairs"]
    assert f"{pairs['floor']:g}, by estimate" in html  # the stored pairs, drawn down to the floor
    docs = stats["documents"]
    assert docs["exact_duplicate"] > 0 and docs["near_duplicate"] > 0
    assert f"{docs['near_duplicate']} near duplicates removed" in html
    # an unwritable target is a clear error, not a traceback
    assert main(["stats", str(out), "--html", str(tmp_path / "missing" / "x.html")]) == 2
    assert "--html" in capsys.readouterr().err
