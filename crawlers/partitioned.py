"""A crawl as K partitions in local processes: each owns the hosts hashing to it (crawlers.partitions).

Why processes: one event loop tops out at one core (parsing links, bookkeeping), so a second core
needs a second crawler; giving each its own hosts keeps politeness and robots.txt per host exact
with no coordination between them. The coordinator here only starts them, restarts one that dies
(it resumes from its own frontier), publishes one manifest from their segments, and decides when
the crawl is over: every live partition idle, twice in a row with the same epochs, and no links
waiting for any of them. All of it goes through a hub (:mod:`gristmill.crawlers.hub`): files in the
state folder for local processes, one actor for Ray partitions on nodes that share no disk.

Why partitions die with their coordinator: the coordinator alone publishes the manifest and restarts
partitions; after ``kill -9`` of it, partitions that ran on went on storing pages that a rerun's new
partitions fetched again from the same frontiers. Each partition watches a pipe only the coordinator
holds open (EOF: it is gone) and then stops as on SIGTERM, or exits after :data:`ORPHAN_GRACE_S`.
Each frontier has one owner (:mod:`gristmill.crawlers.locks`), and so has the crawl's state folder (the
coordinator, and forked partitions inherit its lock): a rerun waits for a dying run's processes to
go, and refuses to run beside a live one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, Protocol

from .commits import publish_due, publish_segments
from .hub import FolderHub, Hub
from .locks import hold
from .oracle import DuplicateOracle
from .partitions import Partition, deal, read_layout, write_layout
from .progress import is_report, merged_report
from .state import holds_frontier, local_folder, state_url

log = logging.getLogger("gristmill.crawl")
POLL_S = 0.1
HEARTBEAT_S = 3.0  # an idle partition rewrites its status every 0.5 s; older than this, it is not idle
MAX_RESTARTS = 3
ORPHAN_GRACE_S = 5.0  # an orphaned partition stops gracefully within this, or exits (its frontier is crash-safe)
COORDINATOR_LOCK = "coordinator.lock"


def run_partition(seeds: list[str], output: str, config: Any, partition: Partition, hub: Hub,
                  oracle: DuplicateOracle | None, level: int) -> dict[str, Any]:
    """One partition: crawl its hosts (resuming its frontier) until told to stop; its summary
    (:class:`~gristmill.crawlers.hub.Fenced` when a newer incarnation of it joined meanwhile)."""
    from .crawler import Crawler, run_until_signalled

    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s p{partition.index} %(message)s", force=True)
    summary, received = run_until_signalled(Crawler(seeds, output, config, None, oracle, partition, hub))
    if received:
        summary.stopped_by = received[0].name
    return summary.to_dict()


class PartitionLauncher(Protocol):
    """Where partitions run: :class:`ProcessLauncher` here; the top floor plugs in Ray actors.

    ``open`` prepares ``count`` partitions and returns the :class:`~crawlers.hub.Hub` they and the
    coordinator talk through (``root``: the crawl's local state folder on this machine); ``start``
    runs ``run`` (a picklable call returning the partition's summary) as partition ``index``; ``poll`` returns, since its last call, the summaries of partitions that finished and
    why others died; ``signal`` passes SIGINT/SIGTERM on; ``close`` ends whatever still runs.
    """

    def open(self, count: int, root: str) -> Hub: ...

    def start(self, index: int, run: Callable[[], dict[str, Any]]) -> None: ...

    def poll(self) -> tuple[dict[int, dict[str, Any]], dict[int, str]]: ...

    def running(self) -> set[int]: ...

    def signal(self, number: int) -> None: ...

    def close(self) -> None: ...


def _process_main(run: Callable[[], dict[str, Any]], results: Connection, lifeline: Connection,
                  coordinators_end: Connection | None) -> None:
    # A forked partition inherits the coordinator's handlers; until its event loop installs its own,
    # a signal acts as in a fresh interpreter.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if coordinators_end is not None:
        coordinators_end.close()  # a fork's copy: the lifeline ends when the coordinator's own does
    threading.Thread(target=_stop_when_orphaned, args=(lifeline,), name="gristmill-lifeline", daemon=True).start()
    results.send(run())


def _stop_when_orphaned(lifeline: Connection) -> None:
    """Wait for the coordinator to go (EOF on the lifeline), then stop as on SIGTERM, and exit for
    good if that takes longer than :data:`ORPHAN_GRACE_S`."""
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv_bytes()
    log.warning("the coordinator is gone; stopping this partition")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(ORPHAN_GRACE_S)
    os._exit(1)


class ProcessLauncher:
    """Partitions as local processes, forked from this one when it runs no other Python thread, else
    from a fork server that has imported the crawler once.

    Why: a spawned partition imported the crawler itself (aiohttp, pyarrow, the public suffix list),
    start-up every partition paid again. This process has imported it already, so a plain fork is
    free; the fork server costs 0.6 s of imports while the crawl waits. But a fork copies the locks
    of other threads in whatever state they are, so a process running Python threads (a notebook's,
    a Ray driver's) forks from the fork server, a fresh process with no threads (the native threads
    Arrow and jemalloc start on import register their own fork handlers). If this process's fork
    server already runs (it started for extraction workers), partitions fork from it and import
    what it lacks themselves.
    """

    def __init__(self) -> None:
        self.processes: dict[int, tuple[Any, Connection]] = {}
        # never written: a partition reads EOF from it once this process, the only holder of the
        # writing end, is gone (see the module doc)
        self.lifeline = multiprocessing.Pipe(duplex=False)

    def open(self, count: int, root: str) -> Hub:
        """Partitions on this machine talk through files in its state folder."""
        return FolderHub(root, count)

    def start(self, index: int, run: Callable[[], dict[str, Any]]) -> None:
        context = multiprocessing.get_context("fork" if threading.active_count() == 1 else "forkserver")
        forked = context.get_start_method() == "fork"
        if not forked:
            context.set_forkserver_preload(["gristmill.crawlers._partition_preload"])
        receive, send = context.Pipe(duplex=False)
        watch, held = self.lifeline
        # a fork inherits the writing end and must close it; the fork server passes only what it is given
        process = context.Process(target=_process_main, args=(run, send, watch, held if forked else None),
                                  name=f"gristmill-crawl-p{index}")
        process.start()
        send.close()
        self.processes[index] = (process, receive)

    def running(self) -> set[int]:
        return set(self.processes)

    def poll(self) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
        finished, died = {}, {}
        for index, (process, results) in list(self.processes.items()):
            try:
                if results.poll():
                    finished[index] = results.recv()
            except EOFError:  # the process ended without sending a summary
                pass
            if process.is_alive() and index not in finished:
                continue
            process.join()
            del self.processes[index]
            if index not in finished:
                died[index] = f"exit code {process.exitcode}"
        return finished, died

    def signal(self, number: int) -> None:
        for process, _ in self.processes.values():
            if process.is_alive():
                os.kill(process.pid, number)

    def close(self) -> None:
        for process, _ in self.processes.values():
            process.terminate()
            process.join()
        self.processes.clear()
        for end in self.lifeline:
            end.close()


def check_partitions(state: str, count: int, storage_options: Mapping[str, Any] | None = None) -> None:
    """Refuse (ValueError) to resume with another number of partitions: hosts would change owners."""
    layout = read_layout(state, storage_options)
    if layout is None:
        if count > 1 and holds_frontier(state, storage_options):
            raise ValueError(f"{state} holds a crawl with 1 partition, not {count}; resume it without --partitions")
        return
    found = layout["partitions"]
    if found != count:
        raise ValueError(f"{state} holds a crawl with {found} partitions, not {count}; resume it with the same "
                         "--partitions")


def partition_config(config: Any, partition: Partition) -> Any:
    """A partition's share of the crawl's limits: connections, extraction workers and pages split K ways
    (pages exactly, so that ``max_pages`` caps the whole crawl; one at least, when it is below K)."""
    count = partition.count
    return replace(config, partitions=1, state_dir=None,
                   concurrency=max(1, config.concurrency // count),
                   extract_workers=max(1, config.extract_workers // count),
                   max_pages=None if config.max_pages is None else max(1, share(config.max_pages, count,
                                                                                  partition.index)))


def share(total: int, count: int, index: int) -> int:
    """Partition ``index``'s part of ``total`` split ``count`` ways: the parts add up to ``total``."""
    return total // count + (index < total % count)


class Coordinator:
    """Runs the partitions of one crawl and publishes its manifest."""

    def __init__(self, seeds: list[str], output: str, config: Any, oracle: DuplicateOracle | None,
                 launcher: PartitionLauncher | None = None,
                 on_progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.seeds, self.output, self.config, self.oracle = seeds, output, config, oracle
        self.on_progress = on_progress
        self.launcher = launcher or ProcessLauncher()
        self.state = state_url(output, config.state_dir)
        options = config.storage_options
        check_partitions(self.state, config.partitions, options)
        self.root = local_folder(self.state)
        os.makedirs(self.root, exist_ok=True)
        self._owner = hold(os.path.join(self.root, COORDINATOR_LOCK))  # StateInUse while another run lives here
        layout = read_layout(self.state, options)
        dealt = deal(seeds, config.partitions, layout["dealt"] if layout is not None else None)
        write_layout(self.state, {"partitions": config.partitions, "dealt": dealt}, options)
        self.parts = [Partition(i, config.partitions, self.state, dealt) for i in range(config.partitions)]
        self.hub = self.launcher.open(config.partitions, self.root)
        self.summaries: dict[int, dict[str, Any]] = {}
        self.restarts = Counter[int]()
        self.errors: list[str] = []
        self.received: list[signal.Signals] = []
        self._segments_seen = self.hub.segments()[0]  # what a previous run published stays until changed
        self._published_at = -math.inf
        self._publish_seconds = 0.0

    def _start(self, part: Partition) -> None:
        self.hub.join(part.index)
        self.launcher.start(part.index, partial(run_partition, self.seeds, self.output,
                                                partition_config(self.config, part), part, self.hub, self.oracle,
                                                logging.getLogger().getEffectiveLevel()))

    def _on_signal(self, number: int, _frame: Any) -> None:
        self.received.append(signal.Signals(number))
        self.launcher.signal(number)

    def run(self) -> tuple[dict[str, Any], list[signal.Signals]]:
        """Crawl until every partition is done (or a signal stops them); returns the merged summary."""
        started = time.monotonic()
        self.hub.begin()  # a previous run's stop signal and progress reports
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            for part in self.parts:
                self._start(part)
            quiet_before = None
            next_progress = started + self.config.progress_interval
            while self.launcher.running():
                time.sleep(POLL_S)
                self._collect()
                self._publish()
                if time.monotonic() >= next_progress:
                    next_progress = time.monotonic() + self.config.progress_interval
                    self._progress(time.monotonic() - started)
                quiet = self._quiet()
                if quiet is not None and quiet == quiet_before:
                    self.hub.finish()
                quiet_before = quiet
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.launcher.close()
        try:
            self._publish(force=True)
        finally:
            self._owner.close()
        return self._summary(time.monotonic() - started), self.received

    def _collect(self) -> None:
        """Take finished partitions' summaries; restart a partition that died without one."""
        finished, died = self.launcher.poll()
        self.summaries.update(finished)
        for index, why in died.items():
            why = f"partition {index} died ({why})"
            if self.received or self.restarts[index] >= MAX_RESTARTS:
                self.errors.append(f"{why}; run the crawl again to resume it")
                log.error("%s; run the crawl again to resume it", why)
                continue
            self.restarts[index] += 1
            log.warning("%s; restarting it from its frontier (restart %d)", why, self.restarts[index])
            self._start(self.parts[index])

    def _progress(self, elapsed: float) -> None:
        """The partitions' latest progress reports as one, to ``on_progress`` or else logged as a line."""
        reports = [report for report in self.hub.reports() if is_report(report)]
        if not reports:
            return
        report = merged_report(reports, self.config.max_pages, elapsed)
        if self.on_progress is not None:
            self.on_progress(report)
        else:
            log.info("%s", report["line"])

    def _quiet(self) -> tuple[str, ...] | None:
        """The live partitions' epochs when all are idle and no links wait for them, else None."""
        running = sorted(self.launcher.running())
        if not running:
            return None
        statuses = self.hub.statuses(running)
        epochs = []
        for index in running:
            status = statuses.get(index)
            if not isinstance(status, dict) or status.get("idle") is not True \
                    or not time.time() - HEARTBEAT_S < status.get("at", 0) <= time.time() + HEARTBEAT_S:
                return None  # busy, or silent (dead, restarting): not quiet
            epochs.append(str(status.get("epoch")))
        if self.hub.waiting(running):
            return None
        return tuple(epochs)

    def _publish(self, force: bool = False) -> None:
        """Publish the manifest when a partition committed since the last time and :func:`publish_due`
        (the manifest lists every shard, so publishing costs O(shards)), and at the end (``force``)."""
        if not force and not publish_due(self._published_at, self._publish_seconds, self.config.commit_interval):
            return
        stamp, segments = self.hub.segments()
        if stamp != self._segments_seen or force:
            started = time.monotonic()
            publish_segments(self.output, segments, self.config.storage_options)
            self._segments_seen = stamp
            self._published_at, self._publish_seconds = started, time.monotonic() - started

    def _summary(self, elapsed: float) -> dict[str, Any]:
        """The partitions' summaries added up (a partition that never reported counts as empty)."""
        parts = list(self.summaries.values())
        fetched = sum(s["fetched_this_run"] for s in parts)
        merged: dict[str, Any] = {"output": self.output, "elapsed_s": elapsed,
                                  "pages_per_s": fetched / elapsed if elapsed > 0 else 0.0,
                                  "errors": [e for s in parts for e in s["errors"]] + self.errors,
                                  "proxies": [p for s in parts for p in s["proxies"]],
                                  "stopped_by": next((s["stopped_by"] for s in parts if s["stopped_by"]), None)}
        for key in ("documents", "fetched_this_run", "requests", "bytes", "queued"):
            merged[key] = sum(s[key] for s in parts)
        for key in ("status_counts", "outcomes", "dedup_service"):
            total = Counter[str]()
            for s in parts:
                total.update(s[key])
            merged[key] = dict(total)
        for key in ("parked_hosts", "hosts", "outcome_examples"):
            merged[key] = {k: v for s in parts for k, v in s[key].items()}
        return merged
