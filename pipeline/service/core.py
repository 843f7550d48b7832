"""The index core of the dedup service: one index, its insert log and its snapshots, transport-agnostic.

Why it is correct under concurrency: the event loop runs one coroutine at a time, and the lookup
plus insert of a whole request (:meth:`DedupService.apply`) is one synchronous call with no
``await`` inside, so it is atomic with respect to every other request; two near-identical
documents arriving at the same moment are serialised and exactly one of them is "new". Hashing
comes before it and yields to the loop between slices of a batch: it is pure, so interleaving
other requests with it changes no verdict.

Why a failed insert changes nothing: ``apply`` is all or nothing: if the log append fails, the
batch's inserts leave the index again. Durability is the insert log's
(:mod:`gristmill.pipeline.service.insert_log`); the HTTP front is :mod:`gristmill.pipeline.service.server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gristmill.dedup.lsh import band_hashes
from gristmill.dedup.normalize import fold_prepared, hashes_of_folded, is_blank, prefold, utf8_batch
from gristmill.pipeline.format.signature_index import IndexParams, params_from_dict, params_to_dict
from gristmill.pipeline.service.columns import ROW_HEAD, RowStore
from gristmill.pipeline.service.index import LiveIndex, load_corpus_index
from gristmill.pipeline.service.insert_log import InsertLog, LogRecord, storage_error
from gristmill.pipeline.service.snapshot import (
    LOG_NAME,
    NEXT_SUFFIX,
    ROWS_NAME,
    SnapshotView,
    StateError,
    fsync_dir,
    lock_state,
    read_meta,
    read_snapshot,
    remove_before,
    remove_uncommitted,
    sealed_log_path,
    sealed_logs,
    snapshot_path,
    snapshots,
    write_snapshot,
)

log = logging.getLogger("gristmill.serve")

DELTA_DOCS = 16_384  # documents in the newest dict deltas before they are frozen and sorted in the background
DEFAULT_COMPACT_EVERY = 1_000_000  # inserts logged after a snapshot before the next is written
FINGERPRINT_SLICE_CHARS = 512 * 1024  # about 15 ms of hashing: the longest one batch holds the event loop

class Unavailable(Exception):
    """The index cannot answer now (a shard is restarting); the message is given to the client with 503."""


class BadRequest(Exception):
    """The request cannot be served as sent; the message is the reason given to the client."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status



def _log_failure(future: Any) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("background index work failed", exc_info=future.exception())


# -- the service -------------------------------------------------------------------------------
@dataclass
class Counters:
    """What ``GET /stats`` reports about traffic since start."""

    requests: int = 0
    checked: int = 0
    new: int = 0
    added: int = 0
    exact_duplicates: int = 0
    near_duplicates: int = 0
    bad_requests: int = 0
    replayed: int = 0
    started: float = field(default_factory=time.time)

    def count(self, results: Sequence[dict[str, Any]]) -> None:
        """Count a batch's verdicts (inserts are counted where they are logged)."""
        for r in results:
            self.new += r["new"]
            self.exact_duplicates += r["exact_duplicate_of"] is not None
            self.near_duplicates += r["exact_duplicate_of"] is None and bool(r["near_duplicates"])
        self.checked += len(results)


@dataclass(frozen=True)
class Doc:
    """One validated document of a request."""

    text: str
    doc_id: str | None


@dataclass(frozen=True)
class Fingerprints:
    """What a batch is looked up by, one row per document: exact hashes, signatures, band hashes."""

    digests: list[str]
    signatures: np.ndarray
    bands: np.ndarray


def verdict(doc_id: str, digest: str, add: bool, exact: str | None, near: Sequence[tuple[str, float]]) -> dict[str, Any]:
    """One document's answer as the API gives it; ``near`` most similar first."""
    is_new = exact is None and not near
    return {"id": doc_id, "new": is_new, "added": add and is_new, "exact_duplicate_of": exact,
            "near_duplicates": [{"id": j, "similarity": round(sim, 4)} for j, sim in near], "content_hash": digest}


async def fingerprints(hasher: Any, params: IndexParams, docs: Sequence[Doc]) -> Fingerprints:
    """Hash a batch in slices of about ``FINGERPRINT_SLICE_CHARS`` characters, yielding to the event
    loop after each: hashing is pure, so it needs no exclusion, and other clients are served while a
    large batch is hashed (the kernels hold the GIL, so a thread would not free the loop).
    A document that normalises to nothing (white space and invisible characters) is a :class:`BadRequest`."""
    normalize = hasher.normalize
    digests: list[str] = []
    signatures: list[np.ndarray] = []
    for part in _slices(docs, FINGERPRINT_SLICE_CHARS):
        prefolded = prefold([d.text for d in part], normalize)
        blank = next((i for i, text in enumerate(prefolded) if is_blank(text)), None)
        if blank is not None:
            raise BadRequest(f"document {len(digests) + blank} of the request has no text once normalised "
                             "(only white space and invisible characters)")
        data, offsets = utf8_batch(prefolded)
        digests += hashes_of_folded(*fold_prepared(data, offsets, normalize))
        signatures.append(hasher.signatures_prepared(data, offsets)[0])
        await asyncio.sleep(0)
    matrix = np.concatenate(signatures)
    return Fingerprints(digests, matrix, band_hashes(matrix, params.bands, params.rows))


def _slices(docs: Sequence[Doc], chars: int) -> Iterator[Sequence[Doc]]:
    """Consecutive runs of ``docs`` holding about ``chars`` characters of text each (at least one document)."""
    start, size = 0, 0
    for end, doc in enumerate(docs, 1):
        size += len(doc.text)
        if size >= chars:
            yield docs[start:end]
            start, size = end, 0
    if start < len(docs):
        yield docs[start:]


class DedupService:
    """The index, its log and the counters; transport-agnostic so tests and benchmarks can drive it."""

    def __init__(self, state: str, params: IndexParams | None = None, *, index_url: str | None = None,
                 compact_every: int = DEFAULT_COMPACT_EVERY, part: tuple[int, int] = (0, 1)) -> None:
        """Open the state folder: the latest snapshot, else the corpus index at ``index_url`` (else an
        empty index with ``params``), then every log after the snapshot replayed on top.

        A folder is tied to what it started from: a snapshot of another index, or of other
        parameters, is refused (:class:`StateError`), as a log written with other parameters is
        (:class:`LogError`). ``part`` = (k, K): of a corpus index, load only the documents of shard k
        of K (:func:`gristmill.pipeline.service.shards.home_shard`).
        """
        if params is None and index_url is None:
            raise ValueError("give the index parameters or a corpus index to start from")
        self.state = state
        self.compact_every = compact_every
        self.counters = Counters()
        self._lock = lock_state(state)
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="gristmill-index")
        self._background: set[asyncio.Future[Any]] = set()
        self._compacting = False
        try:
            self._open(params, index_url, part)
        except BaseException:
            self.close()
            raise

    def _open(self, params: IndexParams | None, index_url: str | None, part: tuple[int, int]) -> None:
        state = self.state
        remove_uncommitted(state)
        rows_path = os.path.join(state, ROWS_NAME)
        done = snapshots(state)
        self.generation = max([*done, *sealed_logs(state)], default=0)
        self.base = index_url
        self._rows_segments: list[list[Any]] = []
        self.since_snapshot = 0
        if done:
            folder = snapshot_path(state, done[-1])
            meta = read_meta(folder)
            if meta["base"] != index_url:
                raise StateError(f"{folder}: this state started from "
                                 f"{'--index ' + meta['base'] if meta['base'] else 'an empty index'}; start it "
                                 "the same way, or use another --state-dir folder")
            stored = params_from_dict(meta["params"], f"{folder}/meta.json")
            if params is not None and params != stored:
                raise StateError(f"{folder}: written for index parameters {params_to_dict(stored)}, not "
                                 f"{params_to_dict(params)}; use another --state-dir folder")
            self.params = stored
            self.index, _ = read_snapshot(folder, stored, RowStore(rows_path, stored.num_perm + ROW_HEAD))
            self._rows_segments = meta["rows"]
            remove_before(state, done[-1])
        elif index_url is not None:
            self.params, self.index = load_corpus_index(index_url, rows_path, part)
            self.since_snapshot = len(self.index)
        else:
            assert params is not None
            self.params = params
            self.index = LiveIndex(params, RowStore(rows_path, params.num_perm + ROW_HEAD))
        self.hasher = self.params.hasher()  # the batch job's hasher: same shingles, seed and normalisation
        after = done[-1] if done else 0
        for path in [*(sealed_log_path(state, g) for g in sealed_logs(state) if g > after),
                     os.path.join(state, LOG_NAME)]:
            self.log = InsertLog(path, self.params)
            self.replay(self.log.replay())
            if path != os.path.join(state, LOG_NAME):
                self.log.close()
        self.since_snapshot += self.counters.replayed

    def replay(self, records: Iterable[LogRecord]) -> None:
        """Insert records logged before (here, or on the store by a shard), without logging them again."""
        for record in records:
            bands = band_hashes(record.signature[None, :], self.params.bands, self.params.rows)[0]
            self.index.insert(record.doc_id, record.content_hash, record.length, record.signature, bands)
            self.counters.replayed += 1
            if len(self.index.ids.fresh) >= DELTA_DOCS:
                self.index.freeze()
                self._settle()

    def close(self) -> None:
        """Let go of the folder (files and lock) without any further writes: what a crash leaves."""
        self._worker.shutdown(wait=True)
        for held in (getattr(self, "log", None), getattr(getattr(self, "index", None), "rows", None)):
            if held is not None:
                held.close()
        self._lock.close()

    # -- background work: sorting new keys, folding them in, snapshots ---------------------------
    def _settle(self) -> None:
        """Sort frozen deltas into runs and fold runs into the main tables when they have grown."""
        for table in (self.index.bands, self.index.exact):
            table.sort_frozen()
            if table.needs_fold():
                table.fold_into_main()

    def _in_background(self, work: Any, *args: Any) -> asyncio.Future[Any]:
        future = asyncio.get_running_loop().run_in_executor(self._worker, work, *args)
        self._background.add(future)
        future.add_done_callback(self._background.discard)
        return future

    def after_insert(self) -> None:
        """Between batches: freeze full deltas for the background, and compact when it is due."""
        if len(self.index.ids.fresh) >= DELTA_DOCS:
            self.index.freeze()
            self._in_background(self._settle).add_done_callback(_log_failure)
        if self.since_snapshot >= self.compact_every:
            self.start_compaction()

    def start(self) -> None:
        """Called once the loop runs: what the start replayed or loaded goes into a snapshot, off the loop."""
        if self.since_snapshot:
            self.start_compaction()

    def start_compaction(self) -> None:
        """Start :meth:`compact` as a task of the running loop, unless one is under way."""
        if not self._compacting:
            self._compacting = True
            task = asyncio.ensure_future(self.compact())
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            task.add_done_callback(_log_failure)

    async def compact(self) -> None:
        """Seal the active log and fold everything up to it into a new snapshot, in the background.

        On the loop, in one step with no ``await``: the log is renamed to ``inserts.G.log`` and a new
        one started, the deltas are frozen, and what the snapshot will hold is taken (immutable
        pieces). Then, off the loop: the frozen deltas are sorted, the snapshot written and committed
        (:func:`gristmill.pipeline.service.snapshot.write_snapshot`), and what it makes redundant removed. A
        failure anywhere leaves the earlier snapshot and every log after it: nothing is lost.
        """
        self._compacting = True
        try:
            generation = self.generation + 1
            active = os.path.join(self.state, LOG_NAME)
            sealed = self.log
            sealed.sync_now()  # a check answered from the new log may rely on any record of this one
            fresh = self._fresh_log(active + NEXT_SUFFIX)  # before the rotation: a full disk changes nothing
            os.rename(active, sealed_log_path(self.state, generation))
            os.rename(fresh.path, active)
            fsync_dir(self.state)
            fresh.path = active
            self.log = fresh
            self.generation = generation
            self.index.freeze()
            todo = (self.index.bands.recent[1], self.index.exact.recent[1])
            view = SnapshotView(generation, len(self.index), self.index.base_count, self.base, self.params,
                                list(self.index.ids.chunks), self.index.rows, self._rows_segments)
            covered, self.since_snapshot = self.since_snapshot, 0
            try:
                self._rows_segments = await self._in_background(self._write_snapshot, view, todo)
            except BaseException:
                self.since_snapshot += covered  # try again after the next compact_every inserts
                raise
            finally:
                sealed.close()
        finally:
            self._compacting = False

    def _fresh_log(self, path: str) -> InsertLog:
        """A new, empty insert log at ``path`` (its header durable); nothing left there if it fails."""
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)  # a crash between making one and the rotation
        fresh = InsertLog(path, self.params)
        try:
            list(fresh.replay())  # writes the header
        except OSError as exc:
            fresh.close()
            with contextlib.suppress(OSError):
                os.remove(path)
            raise storage_error(path, "start a new insert log", exc) from exc
        return fresh

    def _write_snapshot(self, view: SnapshotView, todo: tuple[Any, Any]) -> list[list[Any]]:
        self.index.bands.sort_frozen(todo[0])
        self.index.exact.sort_frozen(todo[1])
        segments = write_snapshot(self.state, view, self.index.bands, self.index.exact)
        remove_before(self.state, view.generation)
        log.info("%s: snapshot %d of %d documents committed", self.state, view.generation, view.documents)
        return segments

    async def drain(self) -> None:
        """Wait for every background step started so far (tests, export, shutdown)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def fingerprints(self, docs: Sequence[Doc]) -> Fingerprints:
        return await fingerprints(self.hasher, self.params, docs)

    def apply(self, docs: Sequence[Doc], prints: Fingerprints, add: bool) -> tuple[list[dict[str, Any]], int]:
        """Look up (and with ``add`` insert) a fingerprinted batch; returns results and the log offset to sync.

        Synchronous on purpose: no other request can run between a document's lookup and its insert.
        With ``add``, documents of one batch are checked in order, each against the ones before it.
        All or nothing: if the log append fails, the batch's inserts leave the index again and
        :class:`LogError` is raised, so no document is in the index without its log record.
        """
        before = len(self.index)
        if add:
            self._reserve(len(docs))
        results: list[dict[str, Any]] = []
        records: list[LogRecord] = []
        for i, doc in enumerate(docs):
            digest = prints.digests[i]
            exact, near = self.index.lookup(digest, prints.bands[i], prints.signatures[i])
            doc_id = doc.doc_id if doc.doc_id is not None else digest
            if add and exact is None and not near:
                record = LogRecord(doc_id, digest, len(doc.text), prints.signatures[i])
                self.index.insert(doc_id, digest, len(doc.text), prints.signatures[i], prints.bands[i])
                records.append(record)
            results.append(verdict(doc_id, digest, add, None if exact is None else self.index.ids[exact],
                                   [(self.index.ids[j], sim) for j, sim in near]))
        durable_at = self._append_or_undo(before, records)
        self.counters.count(results)
        return results, durable_at

    def commit(self, records: Sequence[LogRecord]) -> int:
        """Insert documents a caller has already found new (a shard of ``serve --shards``); all or
        nothing as :meth:`apply`. Returns the log offset to sync."""
        before = len(self.index)
        self._reserve(len(records))
        bands = band_hashes(np.array([r.signature for r in records], np.uint64).reshape(len(records), -1),
                            self.params.bands, self.params.rows)
        for record, row in zip(records, bands, strict=True):
            self.index.insert(record.doc_id, record.content_hash, record.length, record.signature, row)
        return self._append_or_undo(before, records)

    def _reserve(self, count: int) -> None:
        try:
            self.index.rows.reserve(len(self.index) + count)
        except OSError as exc:
            raise storage_error(self.index.rows.path, f"grow for {count} documents", exc) from exc

    def _append_or_undo(self, before: int, records: Sequence[LogRecord]) -> int:
        try:
            durable_at = self.log.append(records)
        except Exception:
            self.index.truncate(before)
            raise
        self.counters.added += len(records)
        self.since_snapshot += len(records)
        return durable_at

    async def handle(self, docs: Sequence[Doc], add: bool) -> list[dict[str, Any]]:
        """Fingerprint, :meth:`apply`, then wait until everything the answer relies on is durable."""
        results, durable_at = self.apply(docs, await self.fingerprints(docs), add)
        written_to = self.log
        self.after_insert()
        await written_to.sync(durable_at)
        return results

    async def report(self) -> dict[str, Any]:
        """What ``GET /stats`` answers (a front of shards also reads the store for it)."""
        return self.stats()

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {
            "documents": len(self.index),
            "base_documents": self.index.base_count,
            "added_since_base": len(self.index) - self.index.base_count,
            "replayed_at_start": c.replayed,
            "requests": c.requests,
            "checked": c.checked,
            "new": c.new,
            "added": c.added,
            "exact_duplicates": c.exact_duplicates,
            "near_duplicates": c.near_duplicates,
            "bad_requests": c.bad_requests,
            "log_bytes": self.log.written,
            "log_generation": self.generation,
            "uptime_s": round(time.time() - c.started, 3),
            "params": params_to_dict(self.params),
        }
