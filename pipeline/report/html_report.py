"""A self-contained HTML report of a corpus's dedup statistics: charts a person would rather look at.

Why inline SVG drawn here rather than a charting library: the report must open anywhere, offline,
years later (no CDN, no script, no network), and the charts are simple bars. One file holds, for
crawled input, the crawl's URL outcomes first; then the funnel (in -> exact -> near -> rejected ->
kept), the cluster-size histogram, the similarity distribution of removed documents (from the
``--removed`` corpus, when the job kept one), every stored candidate pair by similarity (below the
threshold too: what a lower one would catch), the kept documents' lengths in characters and words,
the duplicate rate by domain and by language, and the stage timings, with the numbers in tables
beside them. A chart whose counts span two orders of magnitude is drawn on a log scale.

``python -m gristmill.pipeline.report.html_report CORPUS -o report.html`` writes one; ``write_report`` is the same in Python.
"""

from __future__ import annotations

import argparse
import html
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.compute as pc

from gristmill.pipeline.report.duplicates import SIMILARITY_BIN
from gristmill.pipeline.report.progress import Progress
from gristmill.pipeline.report.stats_text import human_bytes, key_count

OUTCOMES = ("kept", "exact_duplicate", "near_duplicate", "rejected")
LABELS = {"kept": "kept", "exact_duplicate": "exact duplicate", "near_duplicate": "near duplicate",
          "rejected": "rejected", "linked": "linked (at or above the threshold)",
          "below": "below the threshold (kept apart)", "documents": "documents"}
PLURALS = {"exact_duplicate": "exact duplicates", "near_duplicate": "near duplicates", "rejected": "rejected"}
COLORS = {"kept": "#2e7d32", "exact_duplicate": "#1565c0", "near_duplicate": "#ef6c00", "rejected": "#c62828",
          "bar": "#5e35b1", "documents": "#5e35b1", "remaining": "#90a4ae", "linked": "#ef6c00", "below": "#b0bec5"}
WIDTH = 760
TOP = 12
# The length histograms read the text column: at most this many row groups (~1 GB at 4 MiB), spread
# evenly over the corpus, so a 10 TB corpus's report reads a sample, not the corpus.
LENGTH_GROUPS = 256

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, "Noto Sans", sans-serif; margin: 0;
       background: #f5f6f8; color: #1d2330; }
header { background: #263238; color: #fff; padding: 22px 32px; }
header h1 { margin: 0 0 4px; font-size: 24px; } header p { margin: 0; color: #cfd8dc; }
main { max-width: 1180px; margin: 0 auto; padding: 20px 32px 40px; }
.cards { display: flex; flex-wrap: wrap; gap: 14px; margin: 8px 0 18px; }
.card { background: #fff; border-radius: 8px; padding: 12px 18px; min-width: 150px;
        box-shadow: 0 1px 3px rgba(0,0,0,.12); }
.card b { display: block; font-size: 24px; } .card span { color: #546e7a; font-size: 13px; }
section { background: #fff; border-radius: 8px; padding: 16px 22px; margin: 16px 0;
          box-shadow: 0 1px 3px rgba(0,0,0,.12); }
section h2 { margin: 0 0 10px; font-size: 18px; }
.row { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
figure { margin: 0; } figcaption { color: #546e7a; font-size: 13px; margin-top: 4px; max-width: 760px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eceff1; }
th:first-child, td:first-child { text-align: left; max-width: 320px; overflow-wrap: anywhere; }
.legend span { display: inline-block; margin-right: 14px; font-size: 13px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 5px; vertical-align: -1px;
            border-radius: 2px; }
svg text { font: 12px system-ui, sans-serif; fill: #263238; }
.note { color: #546e7a; font-size: 13px; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "0.0%"


def _legend(series: Sequence[str]) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{COLORS[s]}"></i>{_e(LABELS.get(s, s))}</span>' for s in series) + "</div>"


def _figure(chart_id: str, svg: str, caption: str, legend: Sequence[str] = ()) -> str:
    return (f'<figure class="chart" id="{chart_id}">{_legend(legend) if legend else ""}{svg}'
            f"<figcaption>{caption}</figcaption></figure>")


def _svg(height: float, body: list[str], label: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{_e(label)}" width="{WIDTH}" '
            f'height="{height:.0f}" viewBox="0 0 {WIDTH} {height:.0f}">' + "".join(body) + "</svg>")


def _rect(x: float, y: float, w: float, h: float, color: str, tip: str) -> str:
    return (f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" fill="{color}">'
            f"<title>{_e(tip)}</title></rect>")


def _text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{_e(text)}</text>'


# -- charts --------------------------------------------------------------------------------------
def funnel_chart(documents: Mapping[str, int]) -> str:
    """in -> after exact -> after near -> after rejects (= kept), each step's loss in its colour."""
    total = documents.get("input", 0)
    steps = [("documents in", 0, None)]
    remaining = total
    for outcome in ("exact_duplicate", "near_duplicate", "rejected"):
        removed = documents.get(outcome, 0)
        remaining -= removed
        steps.append((f"- {PLURALS[outcome]}", removed, outcome))
    label_w, bar_w, row_h = 170, WIDTH - 170 - 150, 34
    body: list[str] = []
    left = total
    for index, (label, removed, outcome) in enumerate(steps):
        y = 10 + index * row_h
        scale = bar_w / total if total else 0
        body.append(_text(label_w - 10, y + 19, label, "end"))
        if outcome is None:
            body.append(_rect(label_w, y, total * scale, 24, COLORS["remaining"], f"{total:,} documents in"))
            body.append(_text(label_w + total * scale + 8, y + 17, f"{total:,}"))
            continue
        left -= removed
        body.append(_rect(label_w, y, left * scale, 24, COLORS["remaining"], f"{left:,} remain"))
        body.append(_rect(label_w + left * scale, y, removed * scale, 24, COLORS[outcome],
                          f"{removed:,} {PLURALS[outcome]} removed ({_pct(removed, total)})"))
        body.append(_text(label_w + (left + removed) * scale + 8, y + 17,
                          f"-{removed:,} ({_pct(removed, total)})"))
    y = 10 + len(steps) * row_h
    kept = documents.get("kept", left)
    body.append(_text(label_w - 10, y + 19, "kept", "end", ' font-weight="bold"'))
    body.append(_rect(label_w, y, kept * (bar_w / total if total else 0), 24, COLORS["kept"],
                      f"{kept:,} kept ({_pct(kept, total)})"))
    body.append(_text(label_w + kept * (bar_w / total if total else 0) + 8, y + 17, f"{kept:,} ({_pct(kept, total)})"))
    return _svg(y + 40, body, "dedup funnel")


def _nice_step(raw: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is >= ``raw`` (at least 1): whole-number axis ticks."""
    step = 1
    while step < raw:
        for factor in (2, 5 / 2, 2):
            step = int(step * factor)
            if step >= raw:
                break
    return step


def spans_orders(values: Sequence[float], orders: float = 2) -> bool:
    """True when the nonzero ``values`` span ``orders`` powers of ten or more: then a log scale shows the small ones."""
    nonzero = [v for v in values if v > 0]
    return bool(nonzero) and max(nonzero) >= 10 ** orders * min(nonzero)


def _vertical_bars(bins: Sequence[tuple[str, Mapping[str, int]]], series: Sequence[str], label: str,
                   x_title: str, marker: tuple[float, str] | None = None, log: bool | None = None) -> str:
    """Stacked vertical bars; ``marker`` draws a dashed line at a fraction of the x axis. ``log`` (default:
    when the bar heights span two orders of magnitude) scales heights by log10(1 + count), each bar split
    among its series in proportion to their counts (the tooltips keep the exact counts)."""
    height, top, bottom, left = 260, 16, 44, 56
    plot_w, plot_h = WIDTH - left - 16, height - top - bottom
    totals = [sum(counts.get(s, 0) for s in series) for _, counts in bins]
    highest = max(totals, default=0)
    log = spans_orders(totals) if log is None else log
    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#90a4ae"/>']
    if log:
        peak = math.log10(1 + max(highest, 1))
        ticks = [0] + [10 ** k for k in range(int(math.floor(peak)) + 1)]

        def scale(count: float) -> float:
            return plot_h * math.log10(1 + count) / peak
    else:
        tick_step = _nice_step(highest / 5)
        ticks = [tick * tick_step for tick in range(max(1, math.ceil(highest / tick_step)) + 1)]

        def scale(count: float) -> float:
            return plot_h * count / ticks[-1]
    for tick in ticks:
        y = top + plot_h - scale(tick)
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#eceff1"/>')
        body.append(_text(left - 6, y + 4, f"{tick:,}", "end"))
    step = plot_w / max(len(bins), 1)
    every = max(1, math.ceil(len(bins) / 16))
    for index, ((name, counts), total) in enumerate(zip(bins, totals, strict=True)):
        x = left + index * step + step * 0.12
        y = top + plot_h
        whole = scale(total)
        for s in series:
            h = whole * counts.get(s, 0) / total if total else 0
            if h > 0:
                y -= h
                body.append(_rect(x, y, step * 0.76, h, COLORS[s], f"{name}: {counts.get(s, 0):,} {LABELS.get(s, s)}"))
        if index % every == 0:
            body.append(_text(x + step * 0.38, top + plot_h + 16, name, "middle"))
    if marker is not None:
        x = left + plot_w * marker[0]
        body.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#263238" '
                    'stroke-dasharray="5,4"/>')
        body.append(_text(x + 4, top + 12, marker[1]))
    body.append(_text(left + plot_w / 2, height - 6, x_title + (" · log scale" if log else ""), "middle"))
    return _svg(height, body, label + (" (log scale)" if log else ""))


def cluster_size_bins(cluster_sizes: Mapping[str, int]) -> list[tuple[str, dict[str, int]]]:
    """Exact sizes while there are few; power-of-two bins (9-16, 17-32, ...) past size 8 when there are many."""
    sizes = sorted((int(k), int(v)) for k, v in cluster_sizes.items())
    if len(sizes) <= 20:
        return [(str(size), {"bar": count}) for size, count in sizes]
    bins: dict[str, int] = {}
    for size, count in sizes:
        if size <= 8:
            name = str(size)
        else:
            upper = 1 << math.ceil(math.log2(size))
            name = f"{upper // 2 + 1}-{upper}"
        bins[name] = bins.get(name, 0) + count
    return [(name, {"bar": count}) for name, count in bins.items()]


def cluster_chart(cluster_sizes: Mapping[str, int]) -> str:
    return _vertical_bars(cluster_size_bins(cluster_sizes), ["bar"], "cluster-size histogram",
                          "cluster size (documents, representative included)")


def similarity_bins(grids: Mapping[str, Sequence[int]], threshold: float,
                    width: float = SIMILARITY_BIN) -> tuple[list[tuple[str, dict[str, int]]], float]:
    """Histogram bins (``duplicates.similarity_grid`` per series) from just below the threshold, or the
    lowest counted bin, to 1. Returns the bins and where the threshold falls on the axis (0..1)."""
    size = int(round(1 / width))
    counted = [i for grid in grids.values() for i, count in enumerate(grid) if count]
    first = min([math.floor((threshold - 0.1) / width + 1e-9), *counted])
    bins = [(f"{i * width:.2f}", {name: int(grid[i]) for name, grid in grids.items()}) for i in range(first, size)]
    low = first * width
    return bins, (threshold - low) / (1.0 - low + 1e-12)


def similarity_chart(grids: Mapping[str, Sequence[int]], threshold: float) -> str:
    bins, marker = similarity_bins(grids, threshold)
    return _vertical_bars(bins, ["exact_duplicate", "near_duplicate"], "similarity of removed documents",
                          "estimated Jaccard similarity to the representative (bin start)",
                          marker=(marker, f"threshold {threshold:g}"))


def pairs_chart(grids: Mapping[str, Sequence[int]], threshold: float) -> str:
    """Every stored candidate pair by its estimate: linked (at or above the threshold) and below it."""
    bins, marker = similarity_bins(grids, threshold)
    return _vertical_bars(bins, ["linked", "below"], "candidate pairs by estimated similarity",
                          "estimated Jaccard similarity of a candidate pair (bin start)",
                          marker=(marker, f"threshold {threshold:g}"))


def log2_bins(counts: Sequence[int]) -> list[tuple[str, dict[str, int]]]:
    """``counts[k]`` documents of 2^k up to (not including) 2^(k+1) (k = 0 also holds 0), named ``2^k-2^(k+1)``,
    from the first to the last nonzero bin."""
    nonzero = [k for k, count in enumerate(counts) if count]
    if not nonzero:
        return []

    def short(value: int) -> str:
        return f"{value >> 20}M" if value >= 1 << 20 else f"{value >> 10}k" if value >= 1 << 10 else str(value)

    return [(f"{short(1 << k)}-{short(1 << (k + 1))}", {"documents": int(counts[k])})
            for k in range(nonzero[0], nonzero[-1] + 1)]


def horizontal_bars(rows: Sequence[tuple[str, int]], label: str, color: str = "bar") -> str:
    """One bar per (name, count), longest first as given; log-scaled when the counts span two orders."""
    label_w, right_w, row_h = 190, 110, 24
    bar_w = WIDTH - label_w - right_w
    log = spans_orders([count for _, count in rows])
    peak = max((count for _, count in rows), default=0) or 1

    def scale(count: int) -> float:
        return bar_w * (math.log10(1 + count) / math.log10(1 + peak) if log else count / peak)

    body: list[str] = []
    for index, (name, count) in enumerate(rows):
        y = 6 + index * row_h
        body.append(_text(label_w - 8, y + 14, name if len(name) <= 28 else name[:26] + "…", "end"))
        body.append(_rect(label_w, y, scale(count), 17, COLORS[color], f"{name}: {count:,}"))
        body.append(_text(label_w + scale(count) + 6, y + 14, f"{count:,}"))
    return _svg(10 + len(rows) * row_h, body, label + (" (log scale)" if log else ""))


def rate_chart(breakdown: Mapping[str, Mapping[str, int]], label: str, top: int = TOP) -> str:
    """One 100%-stacked bar per key (the ``top`` largest by input): what share was kept, exact, near, rejected."""
    rows = sorted(breakdown.items(), key=lambda kv: (-kv[1].get("input", 0), kv[0]))[:top]
    label_w, right_w, row_h = 190, 150, 26
    bar_w = WIDTH - label_w - right_w
    body: list[str] = []
    for index, (name, counts) in enumerate(rows):
        total = counts.get("input", 0) or sum(counts.get(o, 0) for o in OUTCOMES) or 1
        y = 6 + index * row_h
        short = name if len(name) <= 28 else name[:26] + "…"
        body.append(_text(label_w - 8, y + 14, short, "end"))
        x = float(label_w)
        for outcome in OUTCOMES:
            w = bar_w * counts.get(outcome, 0) / total
            if w > 0:
                body.append(_rect(x, y, w, 19, COLORS[outcome],
                                  f"{name}: {counts.get(outcome, 0):,} {LABELS[outcome]} ({_pct(counts.get(outcome, 0), total)})"))
                x += w
        duplicates = counts.get("exact_duplicate", 0) + counts.get("near_duplicate", 0)
        body.append(_text(label_w + bar_w + 8, y + 14, f"{_pct(duplicates, total)} dup of {total:,}"))
    return _svg(12 + len(rows) * row_h, body, label)


def stage_chart(stage_seconds: Mapping[str, float]) -> str:
    label_w, row_h = 110, 24
    bar_w = WIDTH - label_w - 90
    peak = max(stage_seconds.values(), default=0) or 1
    body: list[str] = []
    for index, (name, seconds) in enumerate(stage_seconds.items()):
        y = 6 + index * row_h
        body.append(_text(label_w - 8, y + 14, name, "end"))
        body.append(_rect(label_w, y, bar_w * seconds / peak, 17, COLORS["bar"], f"{name}: {seconds:.2f} s"))
        body.append(_text(label_w + bar_w * seconds / peak + 6, y + 14, f"{seconds:.2f} s"))
    return _svg(10 + len(stage_seconds) * row_h, body, "stage timings")


# -- tables and page -----------------------------------------------------------------------------
def _breakdown_table(breakdown: Mapping[str, Mapping[str, int]], first: str, top: int, keys: int) -> str:
    rows = sorted(breakdown.items(), key=lambda kv: (-kv[1].get("input", 0), kv[0]))
    head = "".join(f"<th>{_e(LABELS[o])}</th>" for o in OUTCOMES)
    body = []
    for name, counts in rows[:top]:
        total = counts.get("input", 0)
        dup = counts.get("exact_duplicate", 0) + counts.get("near_duplicate", 0)
        body.append(f"<tr><td>{_e(name)}</td><td>{total:,}</td>"
                    + "".join(f"<td>{counts.get(o, 0):,}</td>" for o in OUTCOMES)
                    + f"<td>{_pct(dup, total)}</td></tr>")
    shown = min(top, len(rows))
    more = f'<p class="note">... and {keys - shown:,} more</p>' if keys > shown else ""
    return (f"<table><tr><th>{_e(first)}</th><th>in</th>{head}<th>dup rate</th></tr>{''.join(body)}</table>{more}")


def _funnel_table(documents: Mapping[str, int], stats: Mapping[str, Any]) -> str:
    total = documents.get("input", 0)
    rows = "".join(f"<tr><td>{_e(LABELS[o])}</td><td>{documents.get(o, 0):,}</td><td>{_pct(documents.get(o, 0), total)}</td></tr>"
                   for o in ("exact_duplicate", "near_duplicate", "rejected", "kept"))
    rejected = {k: v for k, v in (stats.get("rejected") or {}).items() if v}
    reasons = ("<p class='note'>rejected: " + ", ".join(f"{_e(k)} {v:,}" for k, v in rejected.items()) + "</p>"
               if rejected else "")
    return f"<table><tr><th>documents in</th><td>{total:,}</td><td>100%</td></tr>{rows}</table>{reasons}"


def _cards(stats: Mapping[str, Any]) -> str:
    documents = stats.get("documents", {})
    total = documents.get("input", 0)
    removed = documents.get("exact_duplicate", 0) + documents.get("near_duplicate", 0)
    size, tokens = stats.get("bytes", {}), stats.get("approx_tokens", {})
    saved_bytes = size.get("input_documents", 0) - size.get("kept", 0)
    saved_tokens = tokens.get("input_documents", 0) - tokens.get("kept", 0)
    cards = [
        (f"{total:,}", "documents in"),
        (f"{documents.get('kept', 0):,}", f"kept ({_pct(documents.get('kept', 0), total)})"),
        (f"{removed:,}", f"duplicates removed ({_pct(removed, total)})"),
        (f"{documents.get('rejected', 0):,}", "rejected"),
        (human_bytes(saved_bytes), f"text saved ({_pct(saved_bytes, size.get('input_documents', 0))})"),
        (f"~{saved_tokens:,}", "tokens saved (bytes/4)"),
    ]
    if "wall_seconds" in stats:
        cards.append((f"{stats['wall_seconds']:.1f} s", "dedup wall time"))
    return '<div class="cards">' + "".join(f'<div class="card"><b>{_e(v)}</b><span>{_e(k)}</span></div>'
                                           for v, k in cards) + "</div>"


@dataclass
class ReportData:
    """What the report reads besides the statistics, each as a histogram (None: not available)."""

    similarities: dict[str, np.ndarray] | None = None  # removed documents per removed_as, similarity_grid
    pairs: dict[str, np.ndarray] | None = None  # stored candidate pairs: "linked" and "below" grids
    pairs_floor: float = 0.0
    lengths: np.ndarray | None = None  # kept documents per log2 bin of characters
    tokens: np.ndarray | None = None  # kept documents per log2 bin of whitespace-separated words
    crawl: dict[str, int] | None = None  # URL outcomes of the crawls the job read, summed
    length_stride: int = 1  # the lengths come from every length_stride-th row group of the kept corpus
    missing: list[str] = field(default_factory=list)  # why a chart is not there


def _section(title: str, body: str) -> str:
    return f"<section><h2>{_e(title)}</h2>{body}</section>"


def _crawl_section(outcomes: Mapping[str, int], documents_in: int) -> str:
    rows = sorted(outcomes.items(), key=lambda kv: (-kv[1], kv[0]))
    total = sum(outcomes.values())
    return _section("What the crawl fetched", "<div class='row'>" + _figure(
        "chart-crawl", horizontal_bars(rows, "crawl outcomes"),
        f"Every URL the crawl admitted, by outcome ({total:,} in all; from the crawl's manifest): HTTP statuses, "
        f"robots.txt refusals, rejected pages. The stored pages are the {documents_in:,} documents the dedup job "
        "read, where the funnel below starts.") + "</div>")


def _lost_to_section(lost_to: Mapping[str, Mapping[str, int]], policy: str, top: int, keys: int) -> str:
    """Which domains lost documents to which ("loser -> survivor"), most removed first."""
    rows = sorted(lost_to.items(), key=lambda kv: (-kv[1].get("input", 0), kv[0]))[:top]
    table = "".join(f"<tr><td>{_e(pair)}</td><td>{counts.get('input', 0):,}</td>"
                    f"<td>{counts.get('exact_duplicate', 0):,}</td><td>{counts.get('near_duplicate', 0):,}</td></tr>"
                    for pair, counts in rows)
    more = f'<p class="note">... and {keys - len(rows):,} more pairs</p>' if keys > len(rows) else ""
    return _section("Which domains lost documents to which", "<div class='row'>" + _figure(
        "chart-lost-to", horizontal_bars([(pair, counts.get("input", 0)) for pair, counts in rows],
                                         "documents removed, by losing and surviving domain"),
        f"Removed documents by the domain they came from and the domain of the copy that was kept, under the "
        f"survivor policy --prefer {_e(policy)} (the {len(rows)} largest of {keys:,} pairs).")
        + f"<table><tr><th>lost -> kept</th><th>removed</th><th>exact</th><th>near</th></tr>{table}</table>{more}"
        + "</div>")


def _spans_section(spans: Mapping[str, Any], top: int) -> str:
    """What ``--spans`` cut, and the most repeated spans with the documents each was found in."""
    size = spans.get("bytes") or {}
    rows = list(spans.get("top") or [])[:top]
    table = "".join(f"<tr><td>{_e(' '.join(str(span.get('text', '')).split()))}</td><td>{span.get('docs', 0):,}</td>"
                    f"<td><code>{_e(span.get('hash'))}</code></td></tr>" for span in rows)
    return _section(f"Spans cut ({_e(spans.get('spans'))})", "<div class='row'>" + _figure(
        "chart-spans", horizontal_bars([(" ".join(str(s.get("text", "")).split())[:60], int(s.get("docs", 0)))
                                        for s in rows], "documents holding each of the most repeated spans"),
        f"{spans.get('spans_cut', 0):,} spans ({_e(human_bytes(spans.get('bytes_cut', 0)))}) cut from "
        f"{spans.get('documents_cut', 0):,} documents; {spans.get('documents_removed', 0):,} documents removed with "
        f"too little left. Bytes in {size.get('input_documents', 0):,} = kept {size.get('kept', 0):,} + cut as spans "
        f"{size.get('cut_as_spans', 0):,} + removed documents {size.get('removed_documents', 0):,}. Each span is "
        "kept in one document; <code>gristmill spans REMOVED HASH</code> lists where it was cut.")
        + f"<table><tr><th>span</th><th>documents</th><th>hash</th></tr>{table}</table></div>")


def _histogram_sections(data: ReportData, threshold: float) -> list[str]:
    sections = []
    if data.similarities:
        near = [i for i, count in enumerate(data.similarities.get("near_duplicate", [])) if count]
        removed = int(sum(int(grid.sum()) for grid in data.similarities.values()))
        caption = (f"{removed:,} removed documents by similarity to the document they lost to; the dashed "
                   f"line is the threshold ({threshold:g}). Near duplicates piled against the threshold suggest "
                   "raising it; none near it suggests there is room to lower it.")
        if near:
            caption += f" Lowest near-duplicate similarity bin: {near[0] * SIMILARITY_BIN:.2f}."
        sections.append(_section("How similar were the removed documents?", _figure(
            "chart-similarity", similarity_chart(data.similarities, threshold), caption,
            ("exact_duplicate", "near_duplicate"))))
    if data.pairs:
        below = int(data.pairs["below"].sum())
        sections.append(_section("What would another threshold catch?", _figure(
            "chart-pairs", pairs_chart(data.pairs, threshold),
            f"Every candidate pair the LSH bands proposed whose estimate reached {data.pairs_floor:g}, by estimate "
            f"(a pair proposed by several bands counts once per band partition). {below:,} pairs fell below the "
            f"threshold: a lower threshold would link them. `gristmill clusters CORPUS --what-if T` recuts the "
            "clusters at T from these pairs; below the job's threshold it sees only the pairs these bands proposed.",
            ("linked", "below"))))
    for grid, chart_id, what in ((data.lengths, "chart-lengths", "characters"),
                                 (data.tokens, "chart-tokens", "words (whitespace-separated: a stand-in for tokens)")):
        bins = log2_bins(grid) if grid is not None else []
        if bins:
            sections.append(_section(f"Kept documents by length in {what.split(' ')[0]}", _figure(
                chart_id, _vertical_bars(bins, ["documents"], f"kept documents by {what}",
                                         f"{what} (power-of-two bins)"),
                f"Kept documents by length in {what}, in power-of-two bins (a bin holds its first value up to "
                "the next bin's)" + (f"; from every {data.length_stride}th row group, a sample spread over the "
                                    "corpus." if data.length_stride > 1 else "."))))
    return sections


def render_html(stats: Mapping[str, Any], data: ReportData | None = None, *, title: str = "gristmill corpus report",
                subtitle: str = "", top: int = TOP) -> str:
    """The whole report as one HTML string (inline CSS and SVG, no scripts, no external references).

    ``stats`` is the dict ``gristmill dedup`` stores in the manifest; ``data`` (:func:`collect`) adds the
    crawl outcomes, the similarity, candidate-pair, length and word-count histograms.
    """
    data = data or ReportData()
    documents = stats.get("documents", {})
    params = stats.get("params", {})
    threshold = float(params.get("threshold", 0.8))
    sections = [_crawl_section(data.crawl, documents.get("input", 0))] if data.crawl else []
    sections.append(
        "<section><h2>What happened to every document</h2><div class='row'>"
        + _figure("chart-funnel", funnel_chart(documents),
                  "Every input document ends in exactly one of: exact duplicate, near duplicate, rejected, kept.",
                  ("remaining", "exact_duplicate", "near_duplicate", "rejected", "kept"))
        + _funnel_table(documents, stats) + "</div></section>")
    sizes = stats.get("cluster_sizes") or {}
    if sizes:
        clustered = sum(int(k) * v for k, v in sizes.items())
        sections.append(
            "<section><h2>Duplicate clusters</h2>"
            + _figure("chart-cluster-sizes", cluster_chart(sizes),
                      f"{sum(sizes.values()):,} clusters with more than one member hold {clustered:,} documents; "
                      "one representative of each is kept. `gristmill clusters CORPUS` lists them.")
            + "</section>")
    sections += _histogram_sections(data, threshold)
    for key, name, chart_id in (("by_domain", "domain", "chart-domains"), ("by_language", "language", "chart-languages"),
                                ("by_source", "source", "chart-sources")):
        breakdown = stats.get(key) or {}
        if not breakdown:
            continue
        keys = key_count(stats, key)
        sections.append(
            f"<section><h2>Duplicate rate by {name}</h2><div class='row'>"
            + _figure(chart_id, rate_chart(breakdown, f"duplicate rate by {name}", top),
                      f"Share of each {name}'s documents kept and removed (the {min(top, len(breakdown))} largest of "
                      f"{keys:,}).", OUTCOMES)
            + _breakdown_table(breakdown, name, top, keys) + "</div></section>")
    lost_to = stats.get("lost_to") or {}
    if lost_to:
        sections.append(_lost_to_section(lost_to, str(stats.get("survivor_policy", "longest")), top,
                                         key_count(stats, "lost_to")))
    if stats.get("spans"):
        sections.append(_spans_section(stats["spans"], top))
    seconds = stats.get("stage_seconds") or {}
    if seconds:
        resumed = stats.get("resumed_stages") or []
        note = f" Resumed from an earlier run: {', '.join(resumed)}." if resumed else ""
        sections.append("<section><h2>Stage timings</h2>"
                        + _figure("chart-stages", stage_chart(seconds),
                                  f"Seconds per stage of the dedup job (wall {stats.get('wall_seconds', 0):.1f} s).{note}")
                        + "</section>")
    setting = ", ".join(f"{k} {v}" for k, v in params.items() if v is not None)
    missing = "".join(f"<p class='note'>{_e(reason)}</p>" for reason in data.missing)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{CSS}</style></head>"
            f"<body><header><h1>{_e(title)}</h1><p>{_e(subtitle)}</p></header><main>{_cards(stats)}"
            + "".join(sections) + missing
            + (f"<p class='note'>Parameters: {_e(setting)}</p>" if setting else "")
            + "</main></body></html>\n")


def _log2_index(values: np.ndarray) -> np.ndarray:
    """Power-of-two bin of each count (0 and 1 in bin 0)."""
    return np.floor(np.log2(np.maximum(values, 1))).astype(np.int64)


def _crawl_outcomes(corpus: Any) -> dict[str, int] | None:
    """The URL outcomes of the raw crawls the job read (each input folder whose manifest has crawl statistics)."""
    from gristmill.pipeline.format import Corpus, CorpusError

    job = corpus.manifest.extra.get("job")
    inputs = job.get("inputs") if isinstance(job, Mapping) else None
    outcomes: dict[str, int] = {}
    for url in inputs if isinstance(inputs, list) else []:
        try:
            crawl = Corpus.open(str(url)).stats.get("crawl")
        except (CorpusError, OSError, ValueError):
            continue  # a file or a folder that is not a corpus: not a crawl
        counts = crawl.get("outcomes") if isinstance(crawl, Mapping) else None
        for kind, count in (counts.items() if isinstance(counts, Mapping) else ()):
            if isinstance(count, int):
                outcomes[str(kind)] = outcomes.get(str(kind), 0) + count
    return outcomes or None


def collect(corpus: Any, removed: Any | None, progress: Progress | None = None) -> ReportData:
    """Every histogram the report draws, each read a row group at a time: the kept documents' lengths
    and words, the removed documents' similarities (``removed``), the stored candidate pairs."""
    from gristmill.pipeline.format.manifest import PAIRS_KEY
    from gristmill.pipeline.format.pairs_table import PairsInfo, iter_pairs
    from gristmill.pipeline.report.duplicates import removed_similarities, row_groups, similarity_grid

    data = ReportData(crawl=_crawl_outcomes(corpus))
    lengths, words = np.zeros(64, np.int64), np.zeros(64, np.int64)
    groups = sum(len(shard.row_groups) for shard in corpus.shards)
    data.length_stride = max(1, -(-groups // LENGTH_GROUPS))
    for table in row_groups(corpus, ["text"], data.length_stride):
        lengths += np.bincount(_log2_index(pc.utf8_length(table["text"]).to_numpy(zero_copy_only=False)),
                               minlength=64)
        counted = pc.count_substring_regex(table["text"], pattern=r"\S+").to_numpy(zero_copy_only=False)
        words += np.bincount(_log2_index(counted), minlength=64)
        if progress is not None:
            progress.update(table.num_rows)
    data.lengths, data.tokens = lengths, words
    if removed is not None:
        data.similarities = removed_similarities(removed, progress)
    if corpus.manifest.extra.get(PAIRS_KEY) is not None:
        info = PairsInfo.of(corpus)
        data.pairs_floor = info.floor
        data.pairs = {"linked": np.zeros(round(1 / SIMILARITY_BIN), np.int64),
                      "below": np.zeros(round(1 / SIMILARITY_BIN), np.int64)}
        for table in iter_pairs(corpus, info):
            similarity = table["matches"].to_numpy().astype(float) / info.num_perm
            linked = similarity >= info.threshold
            data.pairs["linked"] += similarity_grid(similarity[linked])
            data.pairs["below"] += similarity_grid(similarity[~linked])
            if progress is not None:
                progress.update(table.num_rows)
    else:
        data.missing.append("No candidate-pairs chart: the manifest lists no pairs table (an older gristmill, or "
                            "a job run with --no-verify).")
    return data


def write_report(corpus_url: str, path: str, removed_url: str | None = None, top: int = TOP,
                 quiet: bool = False) -> str:
    """Render the report of the corpus at ``corpus_url`` (every breakdown key, from its statistics
    table) into the local file ``path``; returns ``path``. Progress (rows read of the kept and removed
    corpora and the pairs table) goes to stderr unless ``quiet``.

    The similarity chart needs the removed documents (``--removed`` of the dedup job); without them
    the report has every other chart and says where the similarity chart went.
    """
    from gristmill.pipeline.format import Corpus, CorpusError
    from gristmill.pipeline.format.pairs_table import PairsInfo
    from gristmill.pipeline.format.stats_table import full_stats
    from gristmill.pipeline.report.duplicates import open_removed

    corpus = Corpus.open(corpus_url)
    stats = full_stats(corpus)
    if not stats:
        raise CorpusError(f"{corpus_url}: the manifest holds no statistics (not written by gristmill dedup)")
    subtitle = f"{corpus_url} · committed {corpus.manifest.created}"
    removed = None
    try:
        removed = open_removed(corpus, removed_url)
    except CorpusError as exc:
        if removed_url is not None:
            raise
        subtitle += f" · no similarity chart: {exc}"
    try:
        pairs = PairsInfo.of(corpus).rows
    except CorpusError:
        pairs = 0
    groups = sum(len(shard.row_groups) for shard in corpus.shards)
    sampled = corpus.num_rows // max(1, -(-groups // LENGTH_GROUPS))  # about the rows the lengths read
    total = sampled + (removed.num_rows if removed is not None else 0) + pairs
    with Progress("stats --html: rows read", total, "rows", quiet=quiet) as progress:
        data = collect(corpus, removed, progress)
    page = render_html(stats, data, subtitle=subtitle, top=top)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gristmill.pipeline.report.html_report", description=__doc__.splitlines()[0])
    parser.add_argument("corpus", help="corpus folder or URL written by gristmill dedup")
    parser.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    parser.add_argument("--removed", help="the job's removed-documents corpus (default: the one its manifest names)")
    parser.add_argument("--top", type=int, default=TOP, help=f"rows per breakdown (default {TOP})")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    from gristmill.pipeline.format import CorpusError

    try:
        print(write_report(args.corpus, args.output, args.removed, args.top, quiet=args.quiet))
    except CorpusError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
