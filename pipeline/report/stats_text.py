"""A dedup run's statistics as text for people: what ``gristmill stats`` and ``gristmill dedup`` print.

The same statistics as an HTML page with charts are :mod:`gristmill.pipeline.report.html_report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

TOP = 10  # rows shown per breakdown table


def human_bytes(count: float) -> str:
    """1536 -> '1.5 KiB'; for people reading summaries."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def key_count(stats: Mapping[str, Any], breakdown: str) -> int:
    """How many keys a breakdown has: the manifest keeps only the top ones and says how many there are."""
    return int((stats.get("breakdown_keys") or {}).get(breakdown, len(stats.get(breakdown) or {})))


def _table(title: str, rows: Mapping[str, Mapping[str, int]], keys: int) -> list[str]:
    """One breakdown (by source, domain or language) of ``keys`` keys, its ``TOP`` largest rows."""
    if not rows:
        return []
    ordered = sorted(rows.items(), key=lambda kv: (-kv[1].get("input", 0), kv[0]))
    lines = [f"{title:<40} {'input':>10} {'kept':>10} {'exact':>10} {'near':>10} {'rejected':>10}"]
    for name, row in ordered[:TOP]:
        lines.append(f"  {name[:38]:<38} {row.get('input', 0):>10,} {row.get('kept', 0):>10,} "
                     f"{row.get('exact_duplicate', 0):>10,} {row.get('near_duplicate', 0):>10,} "
                     f"{row.get('rejected', 0):>10,}")
    shown = min(TOP, len(ordered))
    if keys > shown:
        lines.append(f"  ... and {keys - shown:,} more")
    return lines


def _lost_to(stats: Mapping[str, Any]) -> list[str]:
    """Which domains lost documents to which (``lost_to``: "loser -> survivor" pairs), most first,
    under the survivor policy that chose."""
    pairs = stats.get("lost_to") or {}
    if not pairs:
        return []
    ordered = sorted(pairs.items(), key=lambda kv: (-kv[1].get("input", 0), kv[0]))
    lines = [f"prefer     {stats.get('survivor_policy', 'longest')}  (which copy survives)",
             f"{'lost to: loser -> survivor domain':<58} {'removed':>10} {'exact':>10} {'near':>10}"]
    for pair, row in ordered[:TOP]:
        lines.append(f"  {pair[:56]:<56} {row.get('input', 0):>10,} {row.get('exact_duplicate', 0):>10,} "
                     f"{row.get('near_duplicate', 0):>10,}")
    keys = key_count(stats, "lost_to")
    if keys > min(TOP, len(ordered)):
        lines.append(f"  ... and {keys - min(TOP, len(ordered)):,} more pairs")
    return lines


def _spans(stats: Mapping[str, Any]) -> list[str]:
    """What ``--spans`` cut: bytes and spans, documents removed for it, and the most repeated spans (the
    boilerplate list a user reads to judge the pass)."""
    spans = stats.get("spans")
    if not spans:
        return []
    size = spans.get("bytes", {})
    lines = [f"spans      {spans.get('spans')}: {spans.get('spans_cut', 0):,} cut from {spans.get('documents_cut', 0):,} "
             f"documents, {human_bytes(spans.get('bytes_cut', 0))}; {spans.get('documents_removed', 0):,} documents "
             f"removed (under {spans.get('min_chars')} characters once cut)",
             f"  bytes in {size.get('input_documents', 0):,} = kept {size.get('kept', 0):,} + cut as spans "
             f"{size.get('cut_as_spans', 0):,} + removed documents {size.get('removed_documents', 0):,}"]
    top = spans.get("top") or []
    if top:
        lines.append(f"{'most repeated spans':<58} {'documents':>10}  hash")
        for span in top[:TOP]:
            text = " ".join(str(span.get("text", "")).split())
            lines.append(f"  {text[:56]:<56} {span.get('docs', 0):>10,}  {span.get('hash')}")
    return lines


def render(stats: Mapping[str, Any]) -> str:
    """People-readable lines for the statistics ``run_dedup`` puts in a manifest."""
    docs = stats.get("documents", {})
    total = docs.get("input", 0) or 1
    lines = [f"documents  {docs.get('input', 0):,} in"]
    for name in ("kept", "exact_duplicate", "near_duplicate", *(["spans"] if "spans" in docs else []), "rejected"):
        lines.append(f"  {name:<16} {docs.get(name, 0):>12,}  {100 * docs.get(name, 0) / total:5.1f}%")
    rejected = {k: v for k, v in stats.get("rejected", {}).items() if v}
    if rejected:
        lines.append("rejected   " + ", ".join(f"{k} {v:,}" for k, v in rejected.items()))
    size = stats.get("bytes", {})
    tokens = stats.get("approx_tokens", {})
    lines.append(f"bytes      {human_bytes(size.get('input_documents', 0))} in, {human_bytes(size.get('kept', 0))} kept; "
                 f"~{tokens.get('input_documents', 0):,} -> ~{tokens.get('kept', 0):,} tokens (bytes/4)")
    sizes = stats.get("cluster_sizes", {})
    if sizes:
        lines.append("clusters   size:count " + " ".join(f"{k}:{v}" for k, v in sizes.items()))
    for breakdown in ("by_source", "by_domain", "by_language"):
        lines += _table(breakdown.replace("_", " "), stats.get(breakdown, {}), key_count(stats, breakdown))
    lines += _lost_to(stats)
    lines += _spans(stats)
    if "splits" in stats:
        lines.append(f"splits     {stats['splits']:,} (read tasks)")
    seconds = stats.get("stage_seconds", {})
    if seconds:
        lines.append("stages     " + ", ".join(f"{k} {v:.1f}s" for k, v in seconds.items())
                     + (f"  (total {stats['wall_seconds']:.1f}s)" if "wall_seconds" in stats else ""))
    if stats.get("resumed_stages"):
        lines.append("resumed    " + ", ".join(stats["resumed_stages"]))
    return "\n".join(lines)
