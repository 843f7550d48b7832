"""The dedup service: "have we seen this text before?" answered over HTTP while a crawl runs.

One aiohttp process holds a corpus's signature index in memory (the persisted index of the batch
job, plus everything added since) and answers ``POST /check``, ``POST /add``, ``GET /stats`` and
``GET /healthz``. docs/SERVICE.md describes the API and the scale-out path.

Why it is correct under concurrency: the event loop runs one coroutine at a time, and the lookup
plus insert of a whole request (:meth:`DedupService.apply`) is one synchronous call with no
``await`` inside, so it is atomic with respect to every other request; two near-identical
documents arriving at the same moment are serialised and exactly one of them is "new". Hashing
comes before it and yields to the loop between slices of a batch: it is pure, so interleaving
other requests with it changes no verdict.

Why a bad request changes nothing: the whole body is parsed and validated
(:func:`parse_request`) before anything is looked up, and ``apply`` is all or nothing: if the log
append fails, the batch's inserts leave the index again.

Why an acknowledged insert survives a crash: every insert is appended to a checksummed log
(:class:`InsertLog`) inside that same synchronous call, and a response is sent only after the
log has been fsynced past every record the response depends on (group commit: one fsync covers
all requests waiting at that moment). At start the log is replayed on top of the base index; a
torn tail left by a crash is cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import ipaddress
import json
import logging
import os
import struct
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash
from aiohttp import web

from gristmill.dedup.lsh import band_hashes
from gristmill.dedup.normalize import fold_prepared, hashes_of_folded, is_blank, prefold, utf8_batch
from gristmill.pipeline.format.signature_index import IndexParams, params_from_dict, params_to_dict
from gristmill.pipeline.service.columns import ROW_HEAD, RowStore
from gristmill.pipeline.service.index import LiveIndex, load_corpus_index
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

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BATCH = 1024
MAX_ID_CHARS = 1024
DELTA_DOCS = 16_384  # documents in the newest dict deltas before they are frozen and sorted in the background
DEFAULT_COMPACT_EVERY = 1_000_000  # inserts logged after a snapshot before the next is written
DOC_KEYS = frozenset({"id", "text"})
DEFAULT_READ_TIMEOUT = 30.0
RETRY_AFTER_S = 1  # what a 503 tells a client to wait before asking again
FINGERPRINT_SLICE_CHARS = 512 * 1024  # about 15 ms of hashing: the longest one batch holds the event loop


class Unavailable(Exception):
    """The index cannot answer now (a shard is restarting); the message is given to the client with 503."""


class BadRequest(Exception):
    """The request cannot be served as sent; the message is the reason given to the client."""

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


# -- the insert log ----------------------------------------------------------------------------
LOG_MAGIC = b"GRISTMILL-DEDUP-LOG\x001\n"
_RECORD_HEAD = struct.Struct("<IQ")  # payload length, xxh3-64 of the payload


class LogError(Exception):
    """The insert log cannot be used; the message names the file."""


class NoSpace(LogError):
    """A file of the state folder cannot grow (disk full, quota, file size limit): the add is refused
    (507) and nothing of it inserted, while checks go on being answered; the message names the file."""


NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def storage_error(path: str, what: str, exc: OSError) -> LogError:
    """``exc`` met while ``what`` on ``path``: :class:`NoSpace` when the disk (or a limit) is full."""
    kind = NoSpace if exc.errno in NO_SPACE else LogError
    return kind(f"{path}: cannot {what} ({exc})")


@dataclass(frozen=True)
class LogRecord:
    """One acknowledged insert: enough to rebuild the document's index entry without its text."""

    doc_id: str
    content_hash: str
    length: int
    signature: np.ndarray

    def encode(self) -> bytes:
        raw_id = self.doc_id.encode("utf-8")
        payload = struct.pack("<HQ", len(raw_id), self.length) + raw_id + bytes.fromhex(self.content_hash)
        payload += self.signature.astype("<u8").tobytes()
        return _RECORD_HEAD.pack(len(payload), xxhash.xxh3_64_intdigest(payload)) + payload

    @classmethod
    def decode(cls, payload: bytes, num_perm: int) -> LogRecord:
        id_len, length = struct.unpack_from("<HQ", payload)
        start = 10 + id_len
        if len(payload) != start + 16 + 8 * num_perm:
            raise ValueError(f"record of {len(payload)} bytes does not fit num_perm={num_perm}")
        return cls(
            doc_id=payload[10:start].decode("utf-8"),
            content_hash=payload[start : start + 16].hex(),
            length=length,
            signature=np.frombuffer(payload, dtype="<u8", offset=start + 16).astype(np.uint64),
        )


class InsertLog:
    """An append-only file of inserts with group-commit fsync.

    The file starts with a magic line and the index parameters (so a log is never replayed into an
    index built with other parameters), then records of ``length, xxh3-64, payload``.
    """

    def __init__(self, path: str, params: IndexParams) -> None:
        self.path = path
        self.params = params
        self._file: Any = None
        self.written = 0
        self.durable = 0
        self.broken: str | None = None  # why the log takes no more records, once it cannot
        self._syncing: asyncio.Future[None] | None = None

    def _header(self) -> bytes:
        # verify says how the bands were chosen, not what a record holds: left out, so logs written
        # before the index recorded it still open
        meta = {k: v for k, v in params_to_dict(self.params).items() if k != "verify"}
        meta = json.dumps(meta, sort_keys=True).encode("utf-8")
        return LOG_MAGIC + struct.pack("<I", len(meta)) + meta

    def replay(self) -> Iterator[LogRecord]:
        """Yield every intact record, cut a torn tail off, and keep the log open for appending.

        The caller holds the state folder's lock (:func:`gristmill.pipeline.service.snapshot.lock_state`), so no
        other process reads, or cuts, a log that a live server is appending to.
        """
        self._file = open(self.path, "a+b", buffering=0)  # noqa: SIM115 - held open for the service's life
        header = self._header()
        size = os.fstat(self._file.fileno()).st_size
        if size == 0:
            self._file.write(header)
            os.fsync(self._file.fileno())
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
            size = len(header)
        with open(self.path, "rb") as reader:
            self._check_header(reader.read(len(header)), header)
            offset = len(header)
            while offset < size:
                try:
                    length, digest = _RECORD_HEAD.unpack(reader.read(_RECORD_HEAD.size))
                    payload = reader.read(length)
                    if len(payload) != length or xxhash.xxh3_64_intdigest(payload) != digest:
                        raise ValueError("checksum mismatch or short record")
                    record = LogRecord.decode(payload, self.params.num_perm)
                except (struct.error, ValueError, UnicodeDecodeError) as exc:
                    log.warning("%s: cutting %d bytes after offset %d (%s); records before it are kept",
                                self.path, size - offset, offset, exc)
                    break
                yield record
                offset += _RECORD_HEAD.size + length
        if offset < size:
            self._file.truncate(offset)
            os.fsync(self._file.fileno())
        self.written = self.durable = offset

    def _check_header(self, found: bytes, expected: bytes) -> None:
        if not found.startswith(LOG_MAGIC):
            self.close()
            raise LogError(f"{self.path}: not a gristmill dedup log (bad magic)")
        if found != expected:
            with open(self.path, "rb") as handle:
                start = handle.read(len(LOG_MAGIC) + 4 + 65536)
            try:
                (meta_len,) = struct.unpack_from("<I", start, len(LOG_MAGIC))
                theirs = json.loads(start[len(LOG_MAGIC) + 4 : len(LOG_MAGIC) + 4 + meta_len])
            except (struct.error, ValueError):
                theirs = "unreadable"
            self.close()
            raise LogError(
                f"{self.path}: written for index parameters {theirs}, but the index loaded has "
                f"{params_to_dict(self.params)}; use another --state-dir folder or the matching index"
            )

    def append(self, records: Sequence[LogRecord]) -> int:
        """Write records (not yet durable); returns the log offset a caller must :meth:`sync` to.

        All or nothing: a write that fails part-way (disk full, file size limit) is cut back off, since
        a partial batch in the middle of the log would end every later replay there and lose the
        records appended after it. If even the cut fails, the log takes no more records.
        """
        if self.broken:
            raise LogError(self.broken)
        if records:
            payload = memoryview(b"".join(r.encode() for r in records))
            try:
                done = 0
                while done < len(payload):  # an unbuffered file may take part of a write
                    step = self._file.write(payload[done:])
                    if not step:
                        raise OSError(errno.ENOSPC, "the file took no bytes")
                    done += step
            except OSError as exc:
                self._cut_back()
                raise storage_error(self.path, f"append {len(records)} records", exc) from exc
            self.written += len(payload)
        return self.written

    def _cut_back(self) -> None:
        try:
            self._file.truncate(self.written)
        except OSError as exc:
            self.broken = (f"{self.path}: a failed append could not be cut back ({exc}); restart the service "
                           "to replay the intact records")

    async def sync(self, upto: int) -> None:
        """Return once everything up to ``upto`` is on disk; concurrent callers share one fsync."""
        while self.durable < upto:
            if self._syncing is None or self._syncing.done():
                self._syncing = asyncio.get_running_loop().run_in_executor(None, os.fsync, self._file.fileno())
                # registered before any waiter's callback, so ``durable`` moves before they wake up
                self._syncing.add_done_callback(lambda done, target=self.written: self._synced(done, target))
            await asyncio.shield(self._syncing)

    def sync_now(self) -> None:
        """Make everything written durable, blocking: once per log rotation."""
        os.fsync(self._file.fileno())
        self.durable = self.written

    def _synced(self, done: asyncio.Future[None], target: int) -> None:
        if not done.cancelled() and done.exception() is None:
            self.durable = max(self.durable, target)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


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


# -- request parsing ---------------------------------------------------------------------------
_JSON_KINDS = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _kind(value: Any) -> str:
    """The JSON name of a parsed value's type, for reasons a client can read."""
    return _JSON_KINDS[type(value)]


def _short(text: str, limit: int = 40) -> str:
    """A client's string as a reason quotes it: never the whole of a long one."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: with a repeated key, which value counts is a guess."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        repeated = next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1)
        raise BadRequest(f"key {_short(repeated)} appears more than once in one object")
    return obj


def _no_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not a JSON value")


def _check_unicode(value: str, where: str) -> None:
    """Refuse what UTF-8 cannot encode: JSON escapes can spell lone surrogates, the log and hashes cannot."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{where} is not valid Unicode: lone surrogate at character {exc.start}") from None


def _parse_doc(value: Any, where: str) -> Doc:
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object with a \"text\" string, not {_kind(value)}")
    unknown = sorted(set(value) - DOC_KEYS)
    if unknown:
        raise BadRequest(f"{where} has unknown keys [{', '.join(map(_short, unknown[:5]))}]; "
                         f"allowed: {sorted(DOC_KEYS)}")
    if "text" not in value:
        raise BadRequest(f"{where}.text is missing")
    text = value["text"]
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text must be a string, not {_kind(text)}")
    doc_id = value.get("id")
    if doc_id is not None and (not isinstance(doc_id, str) or not doc_id or len(doc_id) > MAX_ID_CHARS):
        raise BadRequest(f"{where}.id must be a non-empty string of at most {MAX_ID_CHARS} characters")
    _check_unicode(text, f"{where}.text")
    if doc_id is not None:
        _check_unicode(doc_id, f"{where}.id")
    return Doc(text, doc_id)


def parse_request(body: bytes, max_batch: int, allow_add_flag: bool) -> tuple[list[Doc], bool]:
    """Validate a whole check/add body before anything is looked up: ``{"text", "id"?}`` or
    ``{"documents": [...]}``, plus ``"add"``. Strict JSON: UTF-8, no repeated keys, no NaN."""
    try:
        data = json.loads(body.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"body is not UTF-8: byte {exc.start} is invalid") from None
    except RecursionError:
        raise BadRequest("body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError, or an integer too long to convert
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"body must be a JSON object, not {_kind(data)}")
    add = data.pop("add", False) if allow_add_flag else False
    if not isinstance(add, bool):
        raise BadRequest(f"\"add\" must be true or false, not {_kind(add)}")
    if "documents" not in data:
        return [_parse_doc(data, "body")], add
    if set(data) != {"documents"}:
        others = sorted(set(data) - {"documents"})
        raise BadRequest(f"with \"documents\" no other keys but \"add\" are allowed, got "
                         f"[{', '.join(map(_short, others[:5]))}]")
    items = data["documents"]
    if not isinstance(items, list):
        raise BadRequest(f"\"documents\" must be a list, not {_kind(items)}")
    if not items:
        raise BadRequest("\"documents\" is empty")
    if len(items) > max_batch:
        raise BadRequest(f"batch of {len(items)} documents exceeds the limit of {max_batch}", status=413)
    return [_parse_doc(item, f"documents[{i}]") for i, item in enumerate(items)], add


# -- HTTP --------------------------------------------------------------------------------------
INTERNAL_ERROR = "internal error; the reason is in the server log"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token(token: str, source: str) -> str:
    """``token`` if a client can send it in a header and it is not blank; ``source`` names where it came from."""
    if not token.strip():
        raise ValueError(f"{source}: the bearer token is blank")
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise ValueError(f"{source}: the bearer token must be printable ASCII without spaces")
    return token


def check_bind(host: str, token: str | None) -> None:
    """The safety rule: anything but loopback needs a bearer token."""
    if not is_loopback(host) and not token:
        raise ValueError(f"refusing to bind {host} without a bearer token: set GRISTMILL_SERVICE_TOKEN "
                         "or pass --token-file")


def _one_line(text: str) -> str:
    """aiohttp's multi-line parser messages as one line of a JSON reason."""
    return " ".join(text.split())


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


def _unavailable(reason: str) -> web.Response:
    """503 with ``Retry-After``: the client may ask again shortly (a shard restarting, a store fault)."""
    response = _error(503, reason)
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


async def _read_body(request: web.Request, max_body_bytes: int, read_timeout: float) -> bytes:
    """The whole body, or a :class:`BadRequest` for one too large, malformed or too slow to arrive."""
    if (request.content_length or 0) > max_body_bytes:  # refused before waiting for bytes never used
        raise BadRequest(f"body of {request.content_length} bytes exceeds the limit of {max_body_bytes}", 413)
    try:
        return await asyncio.wait_for(request.read(), read_timeout)
    except asyncio.TimeoutError:
        raise BadRequest(f"the body did not arrive within {read_timeout:g} s", 408) from None
    except web.HTTPRequestEntityTooLarge:  # chunked or compressed: found while reading
        raise BadRequest(f"body exceeds the limit of {max_body_bytes} bytes", 413) from None
    except web.RequestPayloadError as exc:  # a bad chunk or compressed stream
        raise BadRequest(f"cannot read the body: {_one_line(str(exc))}") from None


def make_app(
    service: DedupService,
    *,
    token: str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
) -> web.Application:
    """The aiohttp application; ``token`` (when set) is required on every route but ``/healthz``.

    Every answer is JSON: client errors carry a reason, and anything unexpected is a 500 whose
    traceback goes to the server log.
    """
    expected = f"Bearer {check_token(token, 'token')}".encode() if token is not None else None

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        service.counters.requests += 1
        if expected is not None and request.path != "/healthz":
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                service.counters.bad_requests += 1
                response = _error(401, "missing or wrong bearer token")
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
        try:
            return await handler(request)
        except BadRequest as exc:
            service.counters.bad_requests += 1
            return _error(exc.status, str(exc))
        except web.HTTPException as exc:  # 404 and 405 from the router: answer in JSON too
            service.counters.bad_requests += exc.status < 500
            return _error(exc.status, exc.reason)
        except Unavailable as exc:
            log.warning("%s %s: %s", request.method, request.path, exc)
            return _unavailable(str(exc))
        except NoSpace as exc:
            log.error("%s %s: %s", request.method, request.path, exc)
            return _error(507, f"{exc}; nothing of this request was inserted, checks are still answered")
        except LogError as exc:
            log.error("%s %s: %s", request.method, request.path, exc)
            return _unavailable(f"{exc}; nothing of this request was acknowledged")
        except ConnectionError:
            raise  # the client went away: nobody to answer
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, INTERNAL_ERROR)

    async def check_or_add(request: web.Request, add_route: bool) -> web.Response:
        body = await _read_body(request, max_body_bytes, read_timeout)
        docs, add = parse_request(body, max_batch, allow_add_flag=not add_route)
        results = await service.handle(docs, add or add_route)
        return web.json_response({"results": results})

    async def check(request: web.Request) -> web.Response:
        return await check_or_add(request, add_route=False)

    async def add(request: web.Request) -> web.Response:
        return await check_or_add(request, add_route=True)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(service.stats())

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "documents": service.stats()["documents"]})

    async def json_errors(request: web.Request, response: web.StreamResponse) -> None:
        """An error aiohttp answers before the middleware runs (an ``Expect`` it does not know) is JSON too."""
        if response.status >= 400 and isinstance(response, web.Response) and response.content_type != "application/json":
            response.text = json.dumps({"error": response.text or response.reason})
            response.content_type = "application/json"

    app = web.Application(middlewares=[guard], client_max_size=max_body_bytes)
    app.on_response_prepare.append(json_errors)
    app.router.add_post("/check", check)
    app.router.add_post("/add", add)
    app.router.add_get("/stats", stats)
    app.router.add_get("/healthz", healthz)
    return app


class _Connection(web.RequestHandler):
    """aiohttp's handler of one connection, which also answers what its HTTP parser refuses in JSON
    and closes the connection if its first request head is not complete ``head_timeout`` after it
    opened. aiohttp's keep-alive timer bounds the wait for every later head; only from 3.14.4 on
    does it also start with the connection, and before that a client sending nothing, or half a
    head, held its connection forever.
    """

    def __init__(self, *args: Any, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout = head_timeout
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_tail = b""  # the last bytes received, for a head end split across two reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._head_deadline = asyncio.get_running_loop().call_later(self._head_timeout, self.force_close)

    def data_received(self, data: bytes) -> None:
        if self._head_deadline is not None:
            seen = self._head_tail + data
            if b"\n\r\n" in seen or b"\n\n" in seen:  # the blank line that ends a head
                self._head_deadline.cancel()
                self._head_deadline = None
            self._head_tail = seen[-2:]
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        super().connection_lost(exc)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; refuses once a response has started
        reason = f"malformed HTTP request: {_one_line(message)}" if status < 500 and message else INTERNAL_ERROR
        response = _error(status, reason)
        response.force_close()
        return response


async def serve_forever(
    service: DedupService,
    host: str,
    port: int,
    *,
    token: str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    ready: Any = None,
) -> None:
    """Bind, report the bound address through ``ready(url)``, and serve until cancelled.

    ``read_timeout`` bounds every wait on a client: a connection without a complete request head
    that long after it opened (or after its last answer) is closed, a body not complete that long
    after its head gets 408, and the rest of a refused body is read for at most that long.
    """
    check_bind(host, token)
    app = make_app(service, token=token, max_batch=max_batch, max_body_bytes=max_body_bytes,
                   read_timeout=read_timeout)
    runner = web.AppRunner(app)
    await runner.setup()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Connection(runner.server, loop=loop, access_log=None, head_timeout=read_timeout,
                            keepalive_timeout=read_timeout, lingering_time=read_timeout),
        host, port,
    )
    port = server.sockets[0].getsockname()[1]  # port 0 picks a free port; report the real one
    if ready is not None:
        ready(f"http://{host if ':' not in host else f'[{host}]'}:{port}")
    service.start()
    try:
        await asyncio.Event().wait()
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await runner.cleanup()
        service.close()
