"""A self-contained HTML report of a corpus's dedup statistics: charts a person would rather look at.

Why inline SVG drawn here rather than a charting library: the report must open anywhere, offline,
years later (no CDN, no script, no network), and the charts are simple bars. One file holds the
funnel (in -> exact -> near -> rejected -> kept), the cluster-size histogram, the duplicate rate by
domain and by language, the similarity distribution of removed documents (from the ``--removed``
corpus, when the job kept one) and the stage timings, with the numbers in tables beside them.

``python -m pipeline.report.html_report CORPUS -o report.html`` writes one; ``write_report`` is the same in Python.
"""

from __future__ import annotations

import argparse
import html
import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.report.stats_text import human_bytes, key_count

OUTCOMES = ("kept", "exact_duplicate", "near_duplicate", "rejected")
LABELS = {"kept": "kept", "exact_duplicate": "exact duplicate", "near_duplicate": "near duplicate",
          "rejected": "rejected"}
PLURALS = {"exact_duplicate": "exact duplicates", "near_duplicate": "near duplicates", "rejected": "rejected"}
COLORS = {"kept": "#2e7d32", "exact_duplicate": "#1565c0", "near_duplicate": "#ef6c00", "rejected": "#c62828",
          "bar": "#5e35b1", "remaining": "#90a4ae"}
WIDTH = 760
TOP = 12

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


def _vertical_bars(bins: Sequence[tuple[str, Mapping[str, int]]], series: Sequence[str], label: str,
                   x_title: str, marker: tuple[float, str] | None = None) -> str:
    """Stacked vertical bars; ``marker`` draws a dashed line at a fraction of the x axis."""
    height, top, bottom, left = 260, 16, 44, 48
    plot_w, plot_h = WIDTH - left - 16, height - top - bottom
    highest = max((sum(counts.get(s, 0) for s in series) for _, counts in bins), default=0)
    tick_step = _nice_step(highest / 5)
    ticks = max(1, math.ceil(highest / tick_step))
    peak = ticks * tick_step
    step = plot_w / max(len(bins), 1)
    body = [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#90a4ae"/>']
    for tick in range(ticks + 1):
        y = top + plot_h - plot_h * tick / ticks
        body.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#eceff1"/>')
        body.append(_text(left - 6, y + 4, f"{tick * tick_step:,}", "end"))
    every = max(1, math.ceil(len(bins) / 16))
    for index, (name, counts) in enumerate(bins):
        x = left + index * step + step * 0.12
        y = top + plot_h
        for s in series:
            h = plot_h * counts.get(s, 0) / peak
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
    body.append(_text(left + plot_w / 2, height - 6, x_title, "middle"))
    return _svg(height, body, label)


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


def similarity_bins(similarities: Sequence[float], removed_as: Sequence[str], threshold: float,
                    width: float = 0.02) -> tuple[list[tuple[str, dict[str, int]]], float]:
    """Histogram of removed documents' similarity to their representative, from just below the threshold to 1.

    Returns the bins and where the threshold falls on the axis (0..1) for the marker line.
    """
    finite = [s for s in similarities if not math.isnan(s)]
    low = math.floor(min([threshold - 0.1, *finite]) / width) * width
    count = max(1, round((1.0 - low) / width))
    bins = [{"exact_duplicate": 0, "near_duplicate": 0} for _ in range(count)]
    for similarity, kind in zip(similarities, removed_as, strict=True):
        if math.isnan(similarity) or kind not in bins[0]:
            continue
        index = min(count - 1, int((similarity - low) / width + 1e-9))
        bins[index][kind] += 1
    named = [(f"{low + i * width:.2f}", b) for i, b in enumerate(bins)]
    return named, (threshold - low) / (1.0 - low + 1e-12)


def similarity_chart(similarities: Sequence[float], removed_as: Sequence[str], threshold: float) -> str:
    bins, marker = similarity_bins(similarities, removed_as, threshold)
    return _vertical_bars(bins, ["exact_duplicate", "near_duplicate"], "similarity of removed documents",
                          "estimated Jaccard similarity to the representative (bin start)",
                          marker=(marker, f"threshold {threshold:g}"))


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


def render_html(stats: Mapping[str, Any], *, similarities: Sequence[float] | None = None,
                removed_as: Sequence[str] | None = None, title: str = "gristmill corpus report",
                subtitle: str = "", top: int = TOP) -> str:
    """The whole report as one HTML string (inline CSS and SVG, no scripts, no external references).

    ``stats`` is the dict ``gristmill dedup`` stores in the manifest; ``similarities``/``removed_as``
    (one entry per removed document, from the ``--removed`` corpus) add the similarity chart.
    """
    documents = stats.get("documents", {})
    params = stats.get("params", {})
    threshold = float(params.get("threshold", 0.8))
    sections = [
        "<section><h2>What happened to every document</h2><div class='row'>"
        + _figure("chart-funnel", funnel_chart(documents),
                  "Every input document ends in exactly one of: exact duplicate, near duplicate, rejected, kept.",
                  ("remaining", "exact_duplicate", "near_duplicate", "rejected", "kept"))
        + _funnel_table(documents, stats) + "</div></section>",
    ]
    sizes = stats.get("cluster_sizes") or {}
    if sizes:
        clustered = sum(int(k) * v for k, v in sizes.items())
        sections.append(
            "<section><h2>Duplicate clusters</h2>"
            + _figure("chart-cluster-sizes", cluster_chart(sizes),
                      f"{sum(sizes.values()):,} clusters with more than one member hold {clustered:,} documents; "
                      "one representative of each is kept. `gristmill clusters CORPUS` lists them.")
            + "</section>")
    if similarities:
        near = [s for s, k in zip(similarities, removed_as or [], strict=False) if k == "near_duplicate"]
        caption = (f"{len(similarities):,} removed documents by similarity to the document they lost to; the dashed "
                   f"line is the threshold ({threshold:g}). Near duplicates piled against the threshold suggest "
                   "raising it; none near it suggests there is room to lower it.")
        if near:
            caption += f" Lowest near-duplicate similarity: {min(near):.3f}."
        sections.append("<section><h2>How similar were the removed documents?</h2>"
                        + _figure("chart-similarity", similarity_chart(similarities, removed_as or [], threshold),
                                  caption, ("exact_duplicate", "near_duplicate")) + "</section>")
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
    seconds = stats.get("stage_seconds") or {}
    if seconds:
        resumed = stats.get("resumed_stages") or []
        note = f" Resumed from an earlier run: {', '.join(resumed)}." if resumed else ""
        sections.append("<section><h2>Stage timings</h2>"
                        + _figure("chart-stages", stage_chart(seconds),
                                  f"Seconds per stage of the dedup job (wall {stats.get('wall_seconds', 0):.1f} s).{note}")
                        + "</section>")
    setting = ", ".join(f"{k} {v}" for k, v in params.items() if v is not None)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{_e(title)}</title>"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><style>{CSS}</style></head>"
            f"<body><header><h1>{_e(title)}</h1><p>{_e(subtitle)}</p></header><main>{_cards(stats)}"
            + "".join(sections)
            + (f"<p class='note'>Parameters: {_e(setting)}</p>" if setting else "")
            + "</main></body></html>\n")


def write_report(corpus_url: str, path: str, removed_url: str | None = None, top: int = TOP) -> str:
    """Render the report of the corpus at ``corpus_url`` (every breakdown key, from its statistics
    table) into the local file ``path``; returns ``path``.

    The similarity chart needs the removed documents (``--removed`` of the dedup job); without them
    the report has every other chart and says where the similarity chart went.
    """
    from pipeline.format import Corpus, CorpusError
    from pipeline.format.stats_table import full_stats
    from pipeline.report.duplicates import open_removed, removed_similarities

    corpus = Corpus.open(corpus_url)
    stats = full_stats(corpus)
    if not stats:
        raise CorpusError(f"{corpus_url}: the manifest holds no statistics (not written by gristmill dedup)")
    similarities: list[float] | None = None
    kinds: list[str] | None = None
    subtitle = f"{corpus_url} · committed {corpus.manifest.created}"
    try:
        similarities, kinds = removed_similarities(open_removed(corpus, removed_url))
    except CorpusError as exc:
        if removed_url is not None:
            raise
        subtitle += f" · no similarity chart: {exc}"
    page = render_html(stats, similarities=similarities, removed_as=kinds, subtitle=subtitle, top=top)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.report.html_report", description=__doc__.splitlines()[0])
    parser.add_argument("corpus", help="corpus folder or URL written by gristmill dedup")
    parser.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    parser.add_argument("--removed", help="the job's removed-documents corpus (default: the one its manifest names)")
    parser.add_argument("--top", type=int, default=TOP, help=f"rows per breakdown (default {TOP})")
    args = parser.parse_args(argv)
    from pipeline.format import CorpusError

    try:
        print(write_report(args.corpus, args.output, args.removed, args.top))
    except CorpusError as exc:
        print(f"report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
