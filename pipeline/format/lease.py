"""One writer per corpus folder: an exclusive, expiring lease kept in the folder as ``_lease.json``.

Two jobs writing one folder at once each committed a manifest naming the other's shards. A writer now
takes the folder's lease before it writes and gives it back after its commit:

- the lease is created only where none exists: a hard link (atomic, fails when the name exists) on a
  local disk, a ``PUT`` with ``If-None-Match: *`` on S3 (AWS since 2024, moto), and under one lock of
  the process for ``memory://`` (which no other process sees). A store with no atomic create (gcs,
  azure, ...) is refused with :class:`LeaseUnsupported` before anything is written: "create when absent,
  read back" let two writers racing within one round trip both win;
- it names its holder (host, pid, job fingerprint, when taken) and an expiry that a thread renews
  every ``RENEW_SECONDS``; a crashed writer's lease expires after ``LEASE_SECONDS`` (at once when its
  pid is gone on this same host) and the next writer takes it over by compare-and-swap (``If-Match``
  on the ETag on S3, a ``flock`` around read-compare-replace locally), so two takers never both win;
- a lease file that is not one a writer wrote (garbage, a negative, non-finite or far-future expiry,
  a pid below 1) holds no one: it is taken over, with a warning naming it;
- a renewal that finds the lease gone or changed marks it lost; the writer checks before committing
  (:meth:`Lease.check`) so a writer whose lease was taken never commits over the new holder.

See docs/FORMAT.md ("One writer per corpus").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import posixpath
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import fsspec
from fsspec.asyn import sync

from gristmill.pipeline.format.errors import CorpusError
from gristmill.pipeline.format.storage import is_local, naming, open_fs

LEASE_NAME = "_lease.json"
LEASE_SECONDS = 120.0  # a lease not renewed for this long holds no one: a crashed writer blocks no longer
RENEW_SECONDS = LEASE_SECONDS / 4  # three renewals may fail (a store fault, a pause) before it lapses
WAIT_POLL_SECONDS = 1.0  # how often a second run of the same job looks whether the first one finished
log = logging.getLogger("gristmill.lease")


class LeaseHeld(CorpusError):
    """Another job holds the folder's lease; the message names the folder and the holder."""


class LeaseLost(CorpusError):
    """This writer's lease was taken over (it was not renewed in time); it must not commit."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as ``_lease.json`` records it."""

    host: str
    pid: int
    job: str  # the writer's job fingerprint: the same job run twice waits instead of being refused
    token: str  # unique to one acquisition: tells this holder's file from any other
    acquired: float  # seconds since the epoch
    expires: float

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """The holder a lease file names, or None when it is not a lease a writer wrote."""
        try:
            fields = json.loads(data)
            holder = cls(host=fields["host"], pid=fields["pid"], job=fields["job"], token=fields["token"],
                         acquired=fields["acquired"], expires=fields["expires"])
        except (ValueError, TypeError, KeyError, RecursionError):  # RecursionError: JSON nested too deep
            return None
        numbers_ok = as_seconds(holder.acquired) is not None and as_seconds(holder.expires) is not None
        texts_ok = all(isinstance(v, str) for v in (holder.host, holder.job, holder.token))
        pid_ok = isinstance(holder.pid, int) and not isinstance(holder.pid, bool) and 0 < holder.pid < 2**31
        return holder if numbers_ok and texts_ok and pid_ok else None

    def live(self, now: float) -> bool:
        """True while the lease holds: not expired, not set further ahead than a renewing writer ever
        sets it (twice ``LEASE_SECONDS``, room for clock skew), and not a dead process on this host."""
        if not now < self.expires <= now + 2 * LEASE_SECONDS:
            return False
        return self.host != socket.gethostname() or _process_exists(self.pid)

    def describe(self, now: float) -> str:
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.acquired))
        return (f"job {self.job[:12]} (host {self.host}, pid {self.pid}, since {since}; its lease lapses in "
                f"{max(0, round(self.expires - now))} s unless renewed)")


def as_seconds(value: Any) -> float | None:
    """A time read from an untrusted file: a finite number of seconds (within float range), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) else None


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


@dataclass(frozen=True)
class _Seen:
    """A lease file as read: its bytes and the version a compare-and-swap checks against."""

    data: bytes
    version: str


class LeaseUnsupported(CorpusError):
    """The folder's store cannot create a file only where none exists, so no lease can be exclusive."""


class _Store:
    """Where a lease file lives, reduced to four operations. These are atomic only while no other writer
    runs between a check and a write: ``_MemoryStore`` holds a lock around them; the others replace
    ``create``, ``swap`` and ``delete`` with the store's own atomic operations."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str) -> None:
        self.fs, self.path = fs, path

    def read(self) -> _Seen | None:
        try:
            data = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None
        return _Seen(data, data.hex())

    def create(self, data: bytes) -> _Seen | None:
        if self.fs.exists(self.path):
            return None
        self.fs.pipe_file(self.path, data)
        seen = self.read()
        return seen if seen is not None and seen.data == data else None

    def swap(self, data: bytes, expected: _Seen) -> _Seen | None:
        seen = self.read()
        if seen is None or seen.version != expected.version:
            return None
        self.fs.pipe_file(self.path, data)
        after = self.read()
        return after if after is not None and after.data == data else None

    def delete(self, expected: _Seen) -> None:
        seen = self.read()
        if seen is not None and seen.version == expected.version:
            self.fs.rm_file(self.path)


class _MemoryStore(_Store):
    """``memory://``: one process's dictionary, so one lock of the process makes each check-and-write
    atomic (several threads, or several jobs of one test session, race on it)."""

    _lock = threading.Lock()

    def create(self, data: bytes) -> _Seen | None:
        with self._lock:
            return super().create(data)

    def swap(self, data: bytes, expected: _Seen) -> _Seen | None:
        with self._lock:
            return super().swap(data, expected)

    def delete(self, expected: _Seen) -> None:
        with self._lock:
            super().delete(expected)


class _LocalStore(_Store):
    """A local (or shared POSIX) disk: created by a hard link of a complete temporary file (atomic, and
    never seen half written); replaced and removed under an ``flock`` on the folder itself (a lock
    file of its own would outlive the lease, and removing it would race its next opener)."""

    def create(self, data: bytes) -> _Seen | None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        temporary = f"{self.path}.tmp-{uuid.uuid4().hex}"
        with open(temporary, "wb") as handle:
            handle.write(data)
        try:
            os.link(temporary, self.path)
        except FileExistsError:
            return None
        finally:
            os.unlink(temporary)
        return _Seen(data, data.hex())

    @contextlib.contextmanager
    def _locked(self) -> Any:
        folder = os.open(os.path.dirname(self.path), os.O_RDONLY)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            yield
        finally:
            os.close(folder)  # closing the last descriptor releases the lock

    def swap(self, data: bytes, expected: _Seen) -> _Seen | None:
        with self._locked():
            seen = self.read()
            if seen is None or seen.version != expected.version:
                return None
            temporary = f"{self.path}.tmp-{uuid.uuid4().hex}"
            with open(temporary, "wb") as handle:
                handle.write(data)
            os.replace(temporary, self.path)
        return _Seen(data, data.hex())

    def delete(self, expected: _Seen) -> None:
        with self._locked():
            super().delete(expected)


class _S3Store(_Store):
    """S3: conditional writes. Create is ``If-None-Match: *``, replace and delete are ``If-Match`` on the
    ETag read with the body (one GET), so the store itself decides who wins."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str) -> None:
        super().__init__(fs, path)
        self.bucket, self.key, _ = fs.split_path(path)

    def read(self) -> _Seen | None:
        async def get() -> tuple[bytes, str]:
            answer = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self.key)
            async with answer["Body"] as body:
                return await body.read(), answer["ETag"]

        try:
            data, etag = sync(self.fs.loop, get)
        except FileNotFoundError:
            return None
        return _Seen(data, etag)

    def create(self, data: bytes) -> _Seen | None:
        try:
            answer = self.fs.pipe_file(self.path, data, mode="create")
        except FileExistsError:
            return None
        return _Seen(data, answer["ETag"])

    def swap(self, data: bytes, expected: _Seen) -> _Seen | None:
        return self._conditional(lambda: _Seen(data, self.fs.pipe_file(self.path, data, IfMatch=expected.version)["ETag"]))

    def delete(self, expected: _Seen) -> None:
        self._conditional(lambda: self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key,
                                                   IfMatch=expected.version))

    @staticmethod
    def _conditional(call: Callable[[], Any]) -> Any:
        """``call()``, or None when the store refused its condition (412) or the object is gone."""
        try:
            return call()
        except FileNotFoundError:
            return None
        except OSError as exc:
            code = getattr(exc.__cause__, "response", {}).get("Error", {}).get("Code")
            if code == "PreconditionFailed" or exc.errno == errno.EINVAL:
                return None
            raise


def conditional_store(fs: fsspec.AbstractFileSystem, path: str, url: str) -> _Store:
    """Create-if-absent and compare-and-swap on ``path`` (``url`` names it in errors): atomic on a local
    disk, on S3 and on memory://; any other store is refused with :class:`LeaseUnsupported` before
    anything is written. Also what fences a stale writer of a service shard's log
    (gristmill.pipeline.service.durable)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if is_local(fs):
        return _LocalStore(fs, path)
    if protocol in ("s3", "s3a"):
        return _S3Store(fs, path)
    if protocol == "memory":
        return _MemoryStore(fs, path)
    raise LeaseUnsupported(f"{url}: cannot take the one-writer lease on {protocol}:// (it has no atomic "
                           "create-if-absent); write the corpus to a local or shared disk, s3:// or memory://, "
                           "then copy it there")


def _store_for(url: str, storage_options: Mapping[str, Any] | None) -> tuple[_Store, str]:
    fs, root = open_fs(url, storage_options)
    path = posixpath.join(root, LEASE_NAME)
    where = path if is_local(fs) else f"{url.rstrip('/')}/{LEASE_NAME}"
    return conditional_store(fs, path, where), where


class Lease:
    """The lease on one corpus folder, for one job: :meth:`acquire`, then :meth:`check` before the
    commit and :meth:`release` after it. Renewed by a daemon thread while held."""

    def __init__(self, url: str, job: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.url, self.job = url, job
        self._store, self.location = _store_for(url, storage_options)
        self._token = uuid.uuid4().hex
        self._held: _Seen | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self._renewing = threading.Lock()  # the renewer thread and check() never swap at once

    def _holder_bytes(self, now: float) -> bytes:
        return Holder(socket.gethostname(), os.getpid(), self.job, self._token, now, now + LEASE_SECONDS).to_bytes()

    def acquire(self) -> None:
        """Take the lease. A live lease of another job: :class:`LeaseHeld`; of this same job (the same
        command run twice at once): wait until it is given back or lapses, then take it."""
        with naming(self.location, "write", isinstance(self._store, _LocalStore)):
            self._take()
        self._renewer = threading.Thread(target=self._renew_until_released, name="gristmill-lease", daemon=True)
        self._renewer.start()

    def _take(self) -> None:
        announced = False
        while True:
            now = time.time()
            self._held = self._store.create(self._holder_bytes(now))
            if self._held is not None:
                break
            seen = self._store.read()
            if seen is None:
                continue  # given back between our create and our read
            holder = Holder.parse(seen.data)
            if holder is None or not holder.live(now):
                if holder is None:
                    log.warning("%s is not a lease a writer wrote; taking it over", self.location)
                self._held = self._store.swap(self._holder_bytes(now), seen)
                if self._held is not None:
                    break
                continue  # another writer took it over first
            if holder.job != self.job:
                raise LeaseHeld(f"{self.url} is being written by another {holder.describe(now)}; wait for it to "
                                f"finish, or write elsewhere (lease file: {self.location})")
            if not announced:
                log.warning("%s is being written by this same job (host %s, pid %d); waiting for it", self.url,
                            holder.host, holder.pid)
                announced = True
            time.sleep(WAIT_POLL_SECONDS)

    def _renew_until_released(self) -> None:
        while not self._stop.wait(RENEW_SECONDS):
            self.renew()

    def renew(self) -> None:
        """Push the expiry forward; a lease found taken is marked lost (a store fault is retried next time)."""
        with self._renewing:
            if self._held is None or self._lost:
                return
            try:
                renewed = self._store.swap(self._holder_bytes(time.time()), self._held)
            except OSError as exc:
                log.warning("could not renew the lease %s (%s); retrying in %d s", self.location, exc,
                            RENEW_SECONDS)
                return
            if renewed is None:
                seen = self._store.read()
                holder = Holder.parse(seen.data) if seen else None
                self._lost = (f"now held by {holder.describe(time.time())}" if holder
                              else "the lease file is gone or is no longer a lease")
            else:
                self._held = renewed

    def check(self) -> None:
        """Before a commit: renew now (a writer paused past its expiry learns it at once, not at its next
        renewal), then :class:`LeaseLost` when another writer has taken the lease over."""
        self.renew()
        if self._lost:
            raise LeaseLost(f"{self.url}: this job's lease lapsed and was taken over ({self._lost}); nothing "
                            "was committed, run the job again")

    def release(self) -> None:
        """Give the lease back (only if it is still ours)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        if self._held is not None and not self._lost:
            self._store.delete(self._held)
        self._held = None


def acquire_leases(urls: list[str], job: str, storage_options: Mapping[str, Any] | None = None) -> list[Lease]:
    """The leases of several folders, taken in the order given; all given back if one is refused."""
    leases: list[Lease] = []
    try:
        for url in urls:
            lease = Lease(url, job, storage_options)
            lease.acquire()
            leases.append(lease)
    except BaseException:
        release_leases(leases)
        raise
    return leases


def release_leases(leases: list[Lease]) -> None:
    for lease in reversed(leases):
        lease.release()
