"""Committing: page rows move from the frontier into raw corpus shards, and the manifest lists them.

Why this order: result rows wait in the frontier; a commit writes them to a new uniquely named
shard (and WARC file) and records the shard in the frontier while deleting the rows; with the state
on a store the frontier is checkpointed there next (:mod:`gristmill.crawlers.state`). Publishing the
listing of every recorded shard (the manifest, or a partition's segment of it) comes after, at most
once per ``commit_interval`` and never sooner than the last publication took over ``PUBLISH_SHARE``:
a listing costs O(shards) (2 s at 10 k shards, minutes at the million shards of a billion pages), so
publishing it at every commit made a crawl's commit cost quadratic in its shards, and publishing it
on a fixed interval would at last fill the crawl's time; now it takes at most 5 % of it.
A crash at any point leaves either rows still pending (they go into the next shard) or recorded
shards, which the listing published at start-up names; a shard written but never recorded is an
orphan nobody lists, and is removed at start-up.
"""

from __future__ import annotations

import asyncio
import math
import posixpath
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from gristmill.pipeline.format import RAW_CRAWL_SCHEMA, Lease, ShardInfo, ShardWriter, open_fs, write_manifest

from .frontier import Frontier, ResultLog
from .output import RAW_CRAWL_KIND, rows_to_table, write_warc

SHARD_PREFIX = "crawl"
WARC_FOLDER = "warc"
CRAWL_JOB = "crawl"  # the lease's job: crawls of one output wait for each other's publication, others are refused
PUBLISH_SHARE = 0.05  # at most this share of a crawl's time goes to publishing the listing of its shards


def publish_due(last_at: float, took: float, interval: float) -> bool:
    """Whether to publish the listing again: ``interval`` seconds after the last publication started,
    and not before ``took`` (what the last one took) / ``PUBLISH_SHARE``: however many shards the
    listing holds, publishing it stays within ``PUBLISH_SHARE`` of the crawl's time."""
    return time.monotonic() - last_at >= max(interval, took / PUBLISH_SHARE)


class Committer:
    """Moves pending results from the frontier into shards and publishes the listing of them.

    Uses only its :class:`ResultLog`, so :meth:`flush` may run in a thread while the crawl goes on.
    """

    def __init__(self, output: str, results: ResultLog, *, shard_bytes: int, row_group_bytes: int,
                 warc: bool, storage_options: Mapping[str, Any] | None = None, prefix: str = SHARD_PREFIX,
                 segment: Callable[[dict[str, Any]], None] | None = None,
                 checkpoint: Callable[[], None] | None = None) -> None:
        self.output = output
        self.prefix = prefix
        self.segment = segment
        self.checkpoint = checkpoint
        self.results = results
        self.shard_bytes = shard_bytes
        self.row_group_bytes = row_group_bytes
        self.warc = warc
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = open_fs(output, storage_options)
        self.fs.makedirs(self.root, exist_ok=True)
        self.publish_seconds = 0.0  # what the last publication took (wall time: an object store's PUTs count)

    def remove_orphans(self) -> list[str]:
        """Delete shard and WARC files that no recorded shard names (left by a crash mid-commit)."""
        recorded = set()
        for name, _info, warc in self.results.shards():
            recorded.add(name)
            if warc:
                recorded.add(warc)
        removed = []
        for path in self.fs.glob(posixpath.join(self.root, f"{self.prefix}-*.parquet")) + self.fs.glob(
                posixpath.join(self.root, WARC_FOLDER, f"{self.prefix}-*.warc.gz")):
            relative = posixpath.relpath(path, self.root)
            if relative not in recorded:
                self.fs.rm(path)
                removed.append(relative)
        return removed

    def flush(self, stats: Mapping[str, Any] | None, batch_rows: int = 5000) -> int:
        """Write every pending result into new shards, then publish with ``stats`` (unless None);
        returns rows written."""
        written = 0
        while True:
            pending = self.results.unsharded(batch_rows)
            if not pending:
                break
            run_id = uuid.uuid4().hex[:12]
            writer = ShardWriter(self.output, RAW_CRAWL_SCHEMA, shard_bytes=self.shard_bytes,
                                 row_group_bytes=self.row_group_bytes, name_prefix=self.prefix, run_id=run_id,
                                 storage_options=self.storage_options)
            rows = [row for _rowid, row, _blob in pending]
            writer.write(rows_to_table(rows))
            infos = [info.to_dict() for info in writer.close()]
            warc_name = None
            if self.warc:
                for row in rows:
                    row["fetch_time"] = datetime.fromtimestamp(row["fetch_time"] / 1000, timezone.utc)
                warc_name = posixpath.join(WARC_FOLDER, f"{self.prefix}-{run_id}.warc.gz")
                self.fs.makedirs(posixpath.join(self.root, WARC_FOLDER), exist_ok=True)
                records = [(row, blob) for (_r, row, blob) in pending if blob is not None]
                with self.fs.open(posixpath.join(self.root, warc_name), "wb") as handle:
                    write_warc(handle, records)
            self.results.record_shards(infos, [rowid for rowid, _row, _blob in pending], warc_name)
            written += len(pending)
        if self.checkpoint is not None:  # before the listing: a listed shard must be in the checkpoint
            self.checkpoint()
        if stats is not None:
            self.publish(stats)
        return written

    def publish(self, stats: Mapping[str, Any]) -> None:
        """Write the manifest listing every recorded shard (and WARC file); a partition hands its
        segment to ``segment`` instead, and the coordinator publishes one manifest from all of them."""
        started = time.monotonic()
        recorded = self.results.shards()
        segment = {"shards": [info for _name, info, _warc in recorded], "stats": dict(stats),
                   "warc_files": sorted({warc for _n, _i, warc in recorded if warc})}
        if self.segment is not None:
            self.segment(segment)
        else:
            publish_segments(self.output, [segment], self.storage_options)
        self.publish_seconds = time.monotonic() - started


def publish_segments(output: str, segments: list[Mapping[str, Any]],
                     storage_options: Mapping[str, Any] | None = None) -> None:
    """One manifest listing the shards of every segment, with their crawl statistics added up, written
    under the output folder's lease (pipeline/format/lease.py): a dedup job or ``gc`` writing the
    folder refuses the crawl's manifest (:class:`LeaseHeld`) instead of both committing over each other."""
    shards = [ShardInfo.from_dict(info) for segment in segments for info in segment["shards"]]
    warcs = sorted({warc for segment in segments for warc in segment["warc_files"]})
    documents, outcomes, parked = 0, Counter[str](), {}
    for segment in segments:
        crawl = segment["stats"]["crawl"]
        documents += crawl["documents"]
        outcomes.update(crawl["outcomes"])
        parked.update(crawl["parked_hosts"])
    stats = {"crawl": {"documents": documents, "outcomes": dict(outcomes), "parked_hosts": parked}}
    lease = Lease(output, CRAWL_JOB, storage_options)  # LeaseHeld while another job writes the folder
    lease.acquire()
    try:
        write_manifest(output, shards, RAW_CRAWL_SCHEMA, stats=stats,
                       extra={"kind": RAW_CRAWL_KIND, "warc_files": warcs}, storage_options=storage_options)
    finally:
        lease.release()


def crawl_stats(frontier: Frontier) -> dict[str, Any]:
    """What the manifest records of a crawl: documents, every admitted URL by outcome, parked hosts
    (read from counters the frontier keeps, so the cost does not grow with the crawl)."""
    outcomes = {kind: count for kind, (count, _example) in frontier.outcome_counts().items()}
    return {"crawl": {"documents": outcomes.get("ok", 0), "outcomes": outcomes,
                      "parked_hosts": frontier.parked_hosts()}}


class CommitLoop:
    """When a crawl commits: every ``commit_every`` stored pages and every ``commit_interval`` seconds,
    one commit at a time in a thread (the rows are durable in the frontier already, so nothing
    waits for a shard), publishing when :func:`publish_due`, and once more at the end.

    ``config`` is a :class:`~gristmill.crawlers.config.CrawlConfig`; ``before_commit`` runs on the event loop
    before each commit (a partition hands its links over then).
    """

    def __init__(self, committer: Committer, frontier: Frontier, config: Any, on_error: Callable[[str], None],
                 before_commit: Callable[[], None] | None = None) -> None:
        self.committer = committer
        self.frontier = frontier
        self.config = config
        self.on_error = on_error
        self.before_commit = before_commit
        self.pending = committer.results.unsharded_count()
        self._running: asyncio.Future[int] | None = None
        self._published_at = -math.inf
        self._unpublished = False
        self.halted = False  # set by halt(): this run may write nothing more

    def halt(self) -> None:
        """Commit nothing more, not even at the end (a partition whose hub fenced it: a newer incarnation
        owns its frontier now; what this one holds is fetched again there). Safe from any thread."""
        self.halted = True

    def stats(self) -> dict[str, Any]:
        return crawl_stats(self.frontier)

    def publish(self) -> None:
        """Publish the listing now, on the calling thread (at start-up: a crash may have come between
        recording a shard and publishing it)."""
        self._published_at = time.monotonic()
        self.committer.publish(self.stats())

    def stored(self) -> None:
        """One more page row waits in the frontier: commit once ``commit_every`` of them wait."""
        self.pending += 1
        if self.pending >= self.config.commit_every:
            self.commit()

    def commit(self) -> None:
        """Start a commit in a thread unless one is running (the next stored page starts it then)."""
        if self.halted:
            return
        if self.before_commit is not None:
            self.before_commit()  # a partition fenced here halts this loop
        if self.halted or (self._running is not None and not self._running.done()):
            return
        publish = publish_due(self._published_at, self.committer.publish_seconds, self.config.commit_interval)
        if publish:
            self._published_at = time.monotonic()
        self._unpublished = not publish
        self.pending = 0
        self._running = asyncio.ensure_future(asyncio.to_thread(self.committer.flush,
                                                                self.stats() if publish else None))
        self._running.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[int]) -> None:
        if not future.cancelled() and future.exception() is not None and not self.halted:
            self._unpublished = True  # the interval loop tries again, with whatever waits by then
            self.on_error(f"commit failed, its rows wait for the next one: {future.exception()!r}")

    async def run(self) -> None:
        """Commit every ``commit_interval`` whatever waits (rows, an unpublished listing, links to hand over)."""
        while True:
            await asyncio.sleep(self.config.commit_interval)
            if self.pending or self._unpublished or self.before_commit is not None:
                self.commit()

    async def finish(self) -> None:
        """The last commit of a run: wait for the one running, then write what is left and publish."""
        if self._running is not None:
            await asyncio.wait([self._running])  # a failure was logged; its rows are still pending
        if self.halted:
            return
        self.committer.flush(self.stats())
        self.pending = 0
        self._unpublished = False
