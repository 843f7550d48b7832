"""The insert log of one index: every acknowledged insert, appended and fsynced before it is answered.

Why an acknowledged insert survives a crash: every insert is appended to this checksummed log in the
same synchronous call that inserts it (:meth:`gristmill.pipeline.service.core.DedupService.apply`),
and a response is sent only after the log has been fsynced past every record the response depends on
(group commit: one fsync covers all requests waiting at that moment). At start the log is replayed on
top of the base index; a torn tail left by a crash is cut off. A shard whose state is on a store ships
the same records as log segments (:mod:`gristmill.pipeline.service.durable`).
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from gristmill.pipeline.format.signature_index import IndexParams, params_to_dict
from gristmill.pipeline.service.snapshot import fsync_dir

log = logging.getLogger("gristmill.serve")

LOG_MAGIC = b"GRISTMILL-DEDUP-LOG\x001\n"
RECORD_HEAD = struct.Struct("<IQ")  # payload length, xxh3-64 of the payload


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
        return RECORD_HEAD.pack(len(payload), xxhash.xxh3_64_intdigest(payload)) + payload

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
                    length, digest = RECORD_HEAD.unpack(reader.read(RECORD_HEAD.size))
                    payload = reader.read(length)
                    if len(payload) != length or xxhash.xxh3_64_intdigest(payload) != digest:
                        raise ValueError("checksum mismatch or short record")
                    record = LogRecord.decode(payload, self.params.num_perm)
                except (struct.error, ValueError, UnicodeDecodeError) as exc:
                    log.warning("%s: cutting %d bytes after offset %d (%s); records before it are kept",
                                self.path, size - offset, offset, exc)
                    break
                yield record
                offset += RECORD_HEAD.size + length
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
