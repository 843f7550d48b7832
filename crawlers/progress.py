"""The crawl's progress report as one line a person can read (logged, or printed by the command).

Why the words: "pages" alone beside HTTP status counts read as a contradiction (32 pages, 112 status
200) when most fetched pages were still waiting for text extraction; the line says what each number
counts: documents stored, pages processed (stored, empty, duplicate or rejected), pages waiting for
extraction, and responses by HTTP status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def duration(seconds: float) -> str:
    """``3725`` -> ``"1 h 02 min"``: an ETA to the nearest unit that matters."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def progress_line(report: Mapping[str, Any]) -> str:
    """One line from :meth:`crawlers.crawler.Crawler` 's progress report: documents stored (out of
    ``max_pages`` with an ETA when there is one), pages processed and waiting, responses, queue."""
    documents, total = report["documents"], report["max_pages"]
    line = f"crawl: {documents:,} documents stored"
    if total:
        line += f" of {total:,} ({100 * min(documents, total) / total:.0f}%)"
    line += f", {report['documents_per_s']:,.1f}/s this run"
    if total and report["documents_per_s"] > 0:
        line += f", ETA {duration(max(0, total - documents) / report['documents_per_s'])}"
    line += (f"; {report['fetched']:,} pages processed ({report['pages_per_s']:,.1f}/s), "
             f"{report['waiting']:,} waiting for extraction; {report['requests']:,} requests")
    if report["status_counts"]:
        statuses = sorted(report["status_counts"].items(), key=lambda item: -item[1])
        line += " (" + ", ".join(f"{status}: {count:,}" for status, count in statuses) + ")"
    line += f", {report['bytes'] / 1e6:,.1f} MB; {report['queued']:,} URLs queued"
    slowest = next(iter(report["slowest_hosts"].items()), None)
    if slowest is not None and slowest[1]["delay_s"] > 0:
        origin, host = slowest
        line += f"; slowest host {origin} ({host['delay_s']:g} s between requests, {host['failures']} failures)"
    return line
