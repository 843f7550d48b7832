"""A service shard's state on a store (``serve --shards K --state-dir s3://...``): nothing acknowledged
is lost with the node that held the shard, and a writer that comes back cannot fork it.

```
STATE/shards.json                       the shard count the state was made with (created once)
STATE/shard-k/log/<seq>.seg             one immutable object per group commit: the inserts shipped
                                        together, numbered 1, 2, 3... without gaps
STATE/shard-k/snapshot/<seq>.seg        every insert of segments 1..seq in one object
STATE/shard-k/placement.json            which node and process hold the shard, in which generation
                                        (replaced by compare-and-swap, never by an older generation)
```

Why no acknowledged add is lost: a shard ships the inserts it took (already in its memory) as the
next log segment, one ``PUT``, and an add is answered only once the segment holding it, and every
segment before it, is on the store. One ``PUT`` is in flight per shard at a time and the next one
carries everything that arrived meanwhile (at most ``SEGMENT_RECORDS`` inserts): that is the group
commit, so an add waits for at most the ``PUT`` under way and its own.

Why a stale writer cannot fork the shard: a segment is created only where its number is free (a
conditional create, :func:`gristmill.pipeline.format.lease.conditional_store`: ``If-None-Match: *`` on
S3, a hard link on a local disk). A shard starting (on any node) reads the newest snapshot and every
segment after it, then claims the next number with a *fence* segment of no inserts that carries its
generation (the highest seen plus one). A writer of an older generation that wakes up tries the
number after its own last segment, which is taken: its write is refused (:class:`Fenced`) and so is
every later one, and nothing it writes afterwards can land. The log is one line of numbers, each
written once: there is nothing to fork.

Snapshots bound the replay: after ``compact_every`` inserts a shard writes the inserts of every
segment up to the last shipped one as ``snapshot/<seq>.seg``; a start reads that and only the
segments after it. Older objects are left in place (the log is cut logically, not deleted: a deleted
number could be taken again by a stale writer).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import posixpath
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import xxhash

from gristmill.pipeline.format.lease import conditional_store
from gristmill.pipeline.format.signature_index import IndexParams, params_to_dict
from gristmill.pipeline.format.storage import open_fs
from gristmill.pipeline.service.columns import ROW_HEAD, IdColumn, hash_hex
from gristmill.pipeline.service.insert_log import RECORD_HEAD, LogError, LogRecord
from gristmill.pipeline.service.snapshot import StateError

log = logging.getLogger("gristmill.serve")

SEGMENT_MAGIC = b"GRISTMILL-SHARD-SEGMENT\x001\n"
SEGMENT_RECORDS = 4096  # most inserts one group commit ships
SEQ_DIGITS = 16
SHARDS_NAME = "shards.json"
PLACEMENT_NAME = "placement.json"


class Fenced(LogError):
    """A newer generation of this shard has taken its log over: this writer's inserts are refused."""


class Restarted(LogError):
    """The shard restarted between a request's insert and its wait for durability: not acknowledged."""


Ticket = tuple[int, int]  # (generation, inserts queued): what :meth:`Shipper.sync` waits for


def segment_name(seq: int) -> str:
    return f"{seq:0{SEQ_DIGITS}d}.seg"


def encode_segment(generation: int, seq: int, params: IndexParams, records: Sequence[LogRecord]) -> bytes:
    """One segment (or snapshot): magic, a JSON head (generation, number, record count, index parameters), records."""
    head = json.dumps({"generation": generation, "seq": seq, "records": len(records), "params": _params(params)},
                      sort_keys=True).encode()
    return SEGMENT_MAGIC + struct.pack("<I", len(head)) + head + b"".join(r.encode() for r in records)


def decode_segment(data: bytes, where: str, params: IndexParams) -> tuple[dict[str, Any], list[LogRecord]]:
    """The head and records of a segment; anything that does not check out is a :class:`StateError`
    naming ``where`` (an object is written whole, so a bad one is damage, not a torn tail to cut)."""
    try:
        if not data.startswith(SEGMENT_MAGIC):
            raise ValueError("not a gristmill shard segment (bad magic)")
        (head_len,) = struct.unpack_from("<I", data, len(SEGMENT_MAGIC))
        offset = len(SEGMENT_MAGIC) + 4 + head_len
        head = json.loads(data[len(SEGMENT_MAGIC) + 4 : offset])
        if head["params"] != _params(params):
            raise ValueError(f"written for index parameters {head['params']}, not {_params(params)}")
        records = []
        while offset < len(data):
            length, digest = RECORD_HEAD.unpack_from(data, offset)
            payload = data[offset + RECORD_HEAD.size : offset + RECORD_HEAD.size + length]
            if len(payload) != length or xxhash.xxh3_64_intdigest(payload) != digest:
                raise ValueError(f"record at byte {offset} fails its checksum")
            records.append(LogRecord.decode(payload, params.num_perm))
            offset += RECORD_HEAD.size + length
        if len(records) != head["records"]:  # cut at a record's end: every record checks out, some are gone
            raise ValueError(f"holds {len(records)} records, its head says {head['records']}")
    except (struct.error, ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise StateError(f"{where}: {exc}") from None
    return head, records


def _params(params: IndexParams) -> dict[str, Any]:
    return {k: v for k, v in params_to_dict(params).items() if k != "verify"}


def check_shard_count(url: str, shards: int, storage_options: Mapping[str, Any] | None = None, *,
                      create: bool = True) -> None:
    """A state keeps the shard count it was made with (documents are placed by it): recorded once, in
    the store, by a conditional create (with ``create``), and compared on every later start. Without
    ``create`` (an export) a state that has none is refused: it is not a state of ``serve --shards``."""
    fs, root = open_fs(url, storage_options)
    where = f"{url.rstrip('/')}/{SHARDS_NAME}"
    store = conditional_store(fs, posixpath.join(root, SHARDS_NAME), where)
    if create and store.create(json.dumps({"shards": shards}).encode()) is not None:
        return
    seen = store.read()
    if seen is None:
        raise StateError(f"{where}: missing; not the state of a gristmill serve --shards")
    try:
        found = json.loads(seen.data)["shards"]
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(f"{where}: unreadable ({exc})") from None
    if found != shards:
        raise StateError(f"{where}: this state was built with --shards {found}, not {shards}")


class ShardStore:
    """One shard's objects on the store: recovery, the fence, segments and snapshots (blocking calls;
    :class:`Shipper` runs them off the event loop)."""

    def __init__(self, url: str, params: IndexParams, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url = url.rstrip("/")
        self.params = params
        self.fs, self.root = open_fs(self.url, storage_options)
        self.generation = 0
        self.last = 0  # the number of the last segment this writer knows of (its own or read)
        self.fenced: str | None = None

    def _path(self, kind: str, seq: int) -> str:
        return posixpath.join(self.root, kind, segment_name(seq))

    def _numbers(self, kind: str) -> list[int]:
        folder = posixpath.join(self.root, kind)
        self.fs.invalidate_cache(folder)
        try:
            names = self.fs.ls(folder, detail=False)
        except FileNotFoundError:
            return []
        return sorted(int(posixpath.basename(n)[:-4]) for n in names
                      if posixpath.basename(n).endswith(".seg") and posixpath.basename(n)[:-4].isdigit())

    def read(self) -> Iterator[list[LogRecord]]:
        """Every insert the store holds for this shard (the newest snapshot, then each segment after
        it), in batches; writes nothing, so an export can read the state of a shard that is serving."""
        self.fs.invalidate_cache()
        snapshots = self._numbers("snapshot")
        if snapshots:
            self.last = snapshots[-1]
            path = self._path("snapshot", self.last)
            head, records = decode_segment(self.fs.cat_file(path), self._url(path), self.params)
            self.generation = max(self.generation, head["generation"])
            yield records
        yield from self._read_after(self.last)

    def open(self) -> Iterator[list[LogRecord]]:
        """What :meth:`read` yields, then the log taken over by a fence segment of the next generation.
        A segment another writer lands meanwhile is read too, and the fence tried after it."""
        yield from self.read()
        while True:
            generation = self.generation + 1
            if self._create(self.last + 1, encode_segment(generation, self.last + 1, self.params, [])):
                self.generation, self.last = generation, self.last + 1
                return
            yield from self._read_after(self.last)

    def _read_after(self, after: int) -> Iterator[list[LogRecord]]:
        numbers = [n for n in self._numbers("log") if n > after]
        if numbers != list(range(after + 1, after + 1 + len(numbers))):
            missing = sorted(set(range(after + 1, numbers[-1])) - set(numbers))[0]
            raise StateError(f"{self._url(self._path('log', missing))}: missing, yet later segments exist; the log "
                             "cannot be replayed past it")
        for start in range(0, len(numbers), 64):  # fetched concurrently, replayed in order
            paths = [self._path("log", n) for n in numbers[start : start + 64]]
            blobs = self.fs.cat(paths)
            for n, path in zip(numbers[start : start + 64], paths, strict=True):
                head, records = decode_segment(blobs[path], self._url(path), self.params)
                if head["seq"] != n:
                    raise StateError(f"{self._url(path)}: holds segment {head['seq']}, not {n}")
                self.generation = max(self.generation, head["generation"])
                self.last = n
                yield records

    def append(self, records: Sequence[LogRecord]) -> int:
        """Ship ``records`` as the next segment; returns its number. :class:`Fenced` once the number is
        taken by a newer generation (and for good after that)."""
        if self.fenced:
            raise Fenced(self.fenced)
        seq = self.last + 1
        data = encode_segment(self.generation, seq, self.params, records)
        if not self._create(seq, data):
            path = self._path("log", seq)
            if self.fs.cat_file(path) != data:  # ours, when an earlier try landed but its answer was lost
                self.fenced = (f"{self._url(path)} was written by a newer generation of this shard; generation "
                               f"{self.generation} writes no more")
                raise Fenced(self.fenced)
        self.last = seq
        return seq

    def _create(self, seq: int, data: bytes) -> bool:
        path = self._path("log", seq)
        return conditional_store(self.fs, path, self._url(path)).create(data) is not None

    def write_snapshot(self, seq: int, records: Iterator[LogRecord]) -> None:
        """Every insert up to segment ``seq`` as one object (a start then replays only what follows)."""
        data = encode_segment(self.generation, seq, self.params, list(records))
        path = self._path("snapshot", seq)
        conditional_store(self.fs, path, self._url(path)).create(data)  # taken: the same content

    def record_placement(self, fields: Mapping[str, Any]) -> None:
        """Record in the store where this generation runs (``fields``: node, host, pid), once its fence
        has landed, so that a front started anywhere finds it. Replaced by compare-and-swap and never
        over a newer generation's record: a writer overtaken between its fence and this write is
        :class:`Fenced` instead (and writes nothing more), so the record names the shard's current
        incarnation, not a stale one."""
        path = posixpath.join(self.root, PLACEMENT_NAME)
        store = conditional_store(self.fs, path, self._url(path))
        data = json.dumps({**fields, "generation": self.generation, "since": time.time()}).encode()
        while True:
            seen = store.read()
            if seen is None:
                if store.create(data) is not None:
                    return
                continue
            try:
                recorded = _placement(seen.data, self._url(path))["generation"]
            except StateError as exc:
                log.warning("%s; replaced by generation %d's", exc, self.generation)
                recorded = 0
            if recorded > self.generation:
                self.fenced = (f"{self._url(path)} names generation {recorded} of this shard; generation "
                               f"{self.generation} writes no more")
                raise Fenced(self.fenced)
            if store.swap(data, seen) is not None:
                return

    def _url(self, path: str) -> str:
        return f"{self.url}/{posixpath.relpath(path, self.root)}"


def _placement(data: bytes, where: str) -> dict[str, Any]:
    """A placement record as a shard writes it, or a :class:`StateError` naming ``where``."""
    try:
        fields = json.loads(data)
        if not isinstance(fields, dict) or type(fields.get("generation")) is not int or fields["generation"] < 1:
            raise ValueError("no generation number")
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateError(f"{where}: not a shard's placement record ({exc})") from None
    return fields


def read_placements(url: str, shards: int,
                    storage_options: Mapping[str, Any] | None = None) -> list[dict[str, Any] | None]:
    """Where each shard of the state at ``url`` last recorded that it runs, and in which generation
    (None for a shard not started yet): one ``GET`` per shard, issued together."""
    fs, root = open_fs(url.rstrip("/"), storage_options)
    paths = [posixpath.join(root, f"shard-{k}", PLACEMENT_NAME) for k in range(shards)]
    fs.invalidate_cache()
    found = fs.cat(paths, on_error="return")
    placements: list[dict[str, Any] | None] = []
    for k, path in enumerate(paths):
        if isinstance(found[path], FileNotFoundError):
            placements.append(None)
        elif isinstance(found[path], BaseException):
            raise found[path]
        else:
            placements.append(_placement(found[path], f"{url.rstrip('/')}/shard-{k}/{PLACEMENT_NAME}"))
    return placements


def index_records(start: int, stop: int, ids: IdColumn, rows: np.ndarray) -> Iterator[LogRecord]:
    """Documents ``start..stop`` of a live index as the records that insert them again."""
    names = ids.slice(start, stop).to_pylist()
    block = np.asarray(rows[start:stop])
    for name, digest, row in zip(names, hash_hex(block[:, :2]), block, strict=True):
        yield LogRecord(name, digest, int(row[2]), np.ascontiguousarray(row[ROW_HEAD:]))


class Shipper:
    """The group commit of one shard: inserts queue in memory, one ``PUT`` at a time ships all that
    queued (up to ``SEGMENT_RECORDS``), and :meth:`sync` returns once a given insert is on the store."""

    def __init__(self, store: ShardStore, index: Any, compact_every: int) -> None:
        self.store = store
        self.index = index
        self.compact_every = compact_every
        self.pending: list[LogRecord] = []
        self.queued = 0  # inserts taken by this writer
        self.shipped = 0  # of which on the store
        self.start = len(index)  # the index position of this writer's first insert
        self.since_snapshot = 0
        self._flight: asyncio.Future[Any] | None = None
        self._snapshotting: asyncio.Future[Any] | None = None

    def add(self, records: Sequence[LogRecord]) -> Ticket:
        """Queue inserts already in the index; returns the ticket :meth:`sync` waits for."""
        self.pending.extend(records)
        self.queued += len(records)
        return self.ticket()

    def ticket(self) -> Ticket:
        """What makes every insert queued so far durable."""
        return self.store.generation, self.queued

    async def sync(self, ticket: Ticket) -> None:
        """Return once every insert up to ``ticket`` is on the store; a failed ``PUT`` raises here (the
        inserts stay queued for the next one). A ticket of another generation was given before the
        shard restarted: :class:`Restarted` (its inserts may be lost; they were not acknowledged)."""
        generation, upto = ticket
        if generation != self.store.generation:
            raise Restarted(f"{self.store.url}: the shard restarted (generation {generation} -> "
                            f"{self.store.generation}) before the inserts were on the store")
        while self.shipped < upto:
            if self._flight is None or self._flight.done():
                batch = self.pending[:SEGMENT_RECORDS]
                self._flight = asyncio.get_running_loop().run_in_executor(None, self.store.append, batch)
                self._flight.add_done_callback(functools.partial(self._landed, count=len(batch)))
            await asyncio.shield(self._flight)

    def _landed(self, done: asyncio.Future[Any], *, count: int) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        del self.pending[:count]
        self.shipped += count
        self.since_snapshot += count
        if self.since_snapshot >= self.compact_every and (self._snapshotting is None or self._snapshotting.done()):
            self._start_snapshot(done.result())

    def _start_snapshot(self, seq: int) -> None:
        """Write every insert up to segment ``seq`` off the loop; the pieces are taken now (immutable)."""
        covered, self.since_snapshot = self.since_snapshot, 0
        self.index.ids.seal()
        ids, rows = IdColumn(list(self.index.ids.chunks)), self.index.rows.rows
        stop = self.start + self.shipped
        base = self.index.base_count
        work = asyncio.get_running_loop().run_in_executor(
            None, lambda: self.store.write_snapshot(seq, index_records(base, stop, ids, rows)))
        self._snapshotting = work

        def done(future: asyncio.Future[Any]) -> None:
            if future.exception() is not None:
                self.since_snapshot += covered  # tried again after the next compact_every inserts
                log.error("%s: snapshot %d failed", self.store.url, seq, exc_info=future.exception())

        work.add_done_callback(done)

    async def drain(self) -> None:
        """Wait for the snapshot under way (tests, shutdown)."""
        if self._snapshotting is not None:
            await asyncio.gather(self._snapshotting, return_exceptions=True)
