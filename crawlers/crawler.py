"""A crawl: the fetch loop, admission and the durable side wired together, with progress and a summary.

Why a small composition: each job has its own module (:mod:`gristmill.crawlers.fetch_loop` fetches and
stores pages in the frontier, :mod:`gristmill.crawlers.admission` decides which URLs it takes,
:mod:`gristmill.crawlers.persistence` commits and checkpoints, :mod:`gristmill.crawlers.exchange` talks to
the other partitions); this one only fixes the order a run starts and ends them in, and reports.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

from .config import CrawlConfig, CrawlSummary
from .exchange import PartitionExchange
from .fetch_loop import FetchLoop
from .hub import Hub
from .oracle import DuplicateOracle
from .partitions import Partition
from .persistence import Persistence
from .progress import progress_line

log = logging.getLogger("gristmill.crawl")


class Crawler:
    """A crawl into ``output``; ``run()`` resumes whatever state the output folder already holds.

    With an ``oracle`` (e.g. the dedup service), a page whose text it already holds is not stored.
    """

    def __init__(self, seeds: list[str], output: str, config: CrawlConfig | None = None,
                 on_progress: Callable[[dict[str, Any]], None] | None = None,
                 oracle: DuplicateOracle | None = None, partition: Partition | None = None,
                 hub: Hub | None = None) -> None:
        self.config = config or CrawlConfig()
        if (partition is None) != (hub is None):
            raise ValueError("a partition needs the hub it talks through, and only a partition has one")
        self.partition = partition
        self.hub = hub
        self.output = output
        self.seeds = list(seeds)
        self._errors: list[str] = []
        self.persistence = Persistence(output, self.config, partition, hub)
        incarnation = self.persistence.incarnation  # a partition's: its progress goes to the hub
        self.on_progress = on_progress or (incarnation.progress if incarnation is not None else None)
        self.frontier = self.persistence.frontier
        self.fetching = FetchLoop(self.config, self.frontier, partition, oracle, self._error)
        self.admission = self.fetching.admission

    def stop(self) -> None:
        """Finish what is in flight, commit, and return (SIGINT/SIGTERM call this).

        A second call does not wait for slow pages: it cancels what is in flight (those URLs stay
        queued and are fetched again on resume) and commits what is done.
        """
        self.fetching.stop()

    async def run(self) -> CrawlSummary:
        """Crawl until done or stopped; a partition fenced by its hub (a newer incarnation of it joined)
        halts at the refusal, commits nothing more and raises :class:`~gristmill.crawlers.hub.Fenced`."""
        started = time.monotonic()
        incarnation = self.persistence.incarnation
        self.exchange = None if incarnation is None else PartitionExchange(
            incarnation, self.frontier, self.admission.admit_link, self._error,
            deferred=self.persistence.checkpoint is not None)
        self.commits = self.persistence.start(self.exchange, self._error)
        self._loop = asyncio.get_running_loop()
        if incarnation is not None:
            incarnation.on_fenced = self._halt
        if self.config.retry_parked:
            self.frontier.unpark_all()
        await self.fetching.open()
        background: list[asyncio.Task[None]] = []
        try:
            self.commits.publish()
            self.admission.admit_seeds(self.seeds)
            self.fetching.load_hosts()
            background = [asyncio.create_task(self.commits.run()),
                          asyncio.create_task(self._progress_loop(started))]
            await self.fetching.run(self.commits.stored, self.exchange)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await self.fetching.close()
            try:
                await self.commits.finish()
            finally:
                summary = self._summary(time.monotonic() - started)
                self.persistence.close()
        if self.persistence.fenced is not None:
            raise self.persistence.fenced
        return summary

    def _halt(self, _refusal: Exception) -> None:
        """Fenced (in whichever thread was refused): commit nothing more, at once, and stop fetching."""
        self.commits.halt()
        self._loop.call_soon_threadsafe(self._drop_in_flight)

    def _drop_in_flight(self) -> None:
        """Stop dispatching and cancel the pages in flight: the newer incarnation fetches them."""
        self.fetching.stop()
        self.fetching.stop()

    def enqueue(self, urls: Iterable[str], depth: int = 0) -> int:
        """Admit more URLs (seed-like: in scope, under the trap limits); returns how many were new."""
        return self.admission.enqueue(urls, depth)

    # -- progress, summary ---------------------------------------------------------------------
    async def _progress_loop(self, started: float) -> None:
        """Every ``progress_interval``: the report to ``on_progress`` when given, else a log line."""
        last_time, last_fetched, first_documents = time.monotonic(), 0, self.fetching.documents
        while True:
            await asyncio.sleep(self.config.progress_interval)
            now = time.monotonic()
            report = self._progress(now - started, (self.fetching.fetched - last_fetched) / max(now - last_time, 1e-9),
                                    (self.fetching.documents - first_documents) / max(now - started, 1e-9))
            last_time, last_fetched = now, self.fetching.fetched
            if self.on_progress is not None:
                self.on_progress(report)
            else:
                log.info("%s", report["line"])

    def _progress(self, elapsed: float, pages_per_s: float, documents_per_s: float) -> dict[str, Any]:
        slowest = sorted(self.fetching.scheduler.hosts.values(), key=lambda h: (h.delay, h.failures), reverse=True)[:5]
        report = {"elapsed_s": elapsed, "documents": self.fetching.documents, "max_pages": self.config.max_pages,
                  "documents_per_s": documents_per_s, "pages_per_s": pages_per_s, "fetched": self.fetching.fetched,
                  "waiting": self.fetching.pages.waiting, "bytes": self.fetching.bytes, "requests": self.fetching.requests,
                  "queued": self.frontier.queued_count(), "status_counts": dict(self.fetching.status),
                  "in_flight": self.fetching.inflight,
                  "slowest_hosts": {h.origin: {"delay_s": round(self.fetching.scheduler.delay(h), 3), "failures": h.failures}
                                    for h in slowest}}
        report["line"] = progress_line(report)
        return report

    def _error(self, message: str) -> None:
        log.warning("%s", message)
        if len(self._errors) < 200:
            self._errors.append(message)

    def _summary(self, elapsed: float) -> CrawlSummary:
        counted = self.frontier.outcome_counts()
        outcomes = {kind: count for kind, (count, _example) in counted.items()}
        examples = {kind: example for kind, (_count, example) in counted.items() if example is not None}
        return CrawlSummary(
            output=self.output, documents=self.fetching.documents, fetched_this_run=self.fetching.fetched,
            requests=self.fetching.requests, bytes=self.fetching.bytes, elapsed_s=elapsed,
            pages_per_s=self.fetching.fetched / elapsed if elapsed > 0 else 0.0, status_counts=dict(self.fetching.status),
            outcomes=outcomes, outcome_examples=examples, queued=self.frontier.queued_count(),
            parked_hosts=self.frontier.parked_hosts(),
            hosts={h.origin: {"requests": h.requests, "failures": h.failures, "delay_s": round(self.fetching.scheduler.delay(h), 3),
                              "parked": h.parked} for h in self.fetching.scheduler.hosts.values()},
            proxies=self.fetching.proxies.health(), errors=list(self._errors), dedup_service=dict(self.fetching.pages.dedup_counts))


def run_until_signalled(crawler: Crawler) -> tuple[CrawlSummary, list[signal.Signals]]:
    """Run a crawl on a new event loop with SIGINT/SIGTERM stopping it; returns the signals received."""
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        crawler.stop()

    async def main() -> CrawlSummary:
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, on_signal, sig)
                installed.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
        try:
            return await crawler.run()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    return asyncio.run(main()), received
