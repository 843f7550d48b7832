"""The crawl's progress report as one line a person can read (logged, or printed by the command).

Why the words: "pages" alone beside HTTP status counts read as a contradiction (32 pages, 112 status
200) when most fetched pages were still waiting for text extraction; the line says what each number
counts: documents stored, pages processed (stored, empty, duplicate or rejected), pages waiting for
extraction, and responses by HTTP status.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

SUMMED = ("documents", "documents_per_s", "pages_per_s", "fetched", "waiting", "bytes", "requests", "queued",
          "in_flight")


def duration(seconds: float) -> str:
    """``3725`` -> ``"1 h 02 min"``: an ETA to the nearest unit that matters."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


def progress_line(report: Mapping[str, Any]) -> str:
    """One line from :meth:`gristmill.crawlers.crawler.Crawler` 's progress report: documents stored (out of
    ``max_pages`` with an ETA when there is one), pages processed and waiting, responses, queue."""
    documents, total = report["documents"], report["max_pages"]
    line = f"crawl: {documents:,} documents stored"
    if total:
        line += f" of {total:,} ({100 * min(documents, total) / total:.0f}%)"
    line += f", {report['documents_per_s']:,.1f}/s this run"
    if total and report["documents_per_s"] > 0 and (eta := max(0, total - documents) / report["documents_per_s"]) < math.inf:
        line += f", ETA {duration(eta)}"
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


def is_report(value: object) -> bool:
    """Whether ``value`` (read back from a partition's progress file) is a progress report
    :func:`merged_report` can add up; anything else is skipped, never trusted further."""
    if not isinstance(value, dict) or not all(type(number := value.get(key)) in (int, float)
                                              and 0 <= number < math.inf for key in SUMMED):
        return False
    statuses, slowest = value.get("status_counts"), value.get("slowest_hosts")
    return (isinstance(statuses, dict) and all(type(count) is int for count in statuses.values())
            and isinstance(slowest, dict) and all(
                isinstance(host, dict) and type(host.get("delay_s")) in (int, float)
                and type(host.get("failures")) is int for host in slowest.values()))


def merged_report(reports: list[Mapping[str, Any]], max_pages: int | None, elapsed: float) -> dict[str, Any]:
    """The latest progress reports of a crawl's partitions as one report of the whole crawl: counts
    and rates added up, the five slowest hosts of all, and its line."""
    report: dict[str, Any] = {key: sum(r[key] for r in reports) for key in SUMMED}
    statuses = Counter[str]()
    for r in reports:
        statuses.update(r["status_counts"])
    slowest = sorted((item for r in reports for item in r["slowest_hosts"].items()),
                     key=lambda item: (item[1]["delay_s"], item[1]["failures"]), reverse=True)[:5]
    report.update(elapsed_s=elapsed, max_pages=max_pages, status_counts=dict(statuses), slowest_hosts=dict(slowest))
    report["line"] = progress_line(report)
    return report
