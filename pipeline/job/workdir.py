"""The dedup job's work folder: whole files, partitioned shuffle files, completion records.

Everything a stage produces lands here before the next stage reads it, so a rerun after a crash
skips what is finished (a task's record exists) and redoes only the rest. A reader never sees half a
file: on an object store whose PUT is atomic (s3, gs, memory) a file is written under its final name
in one PUT (a rename there is a COPY and a DELETE of the whole object, 7 requests a file with the
listings around them); on a local disk it is written under a temporary name and renamed.

On an object store, keys are spread over :data:`PREFIX_DIGITS` hex digits of a hash put before each
file name (``exact_in/3a/s=00003.part``), so its per-prefix request limits (S3: 5,500 GET/s and
3,500 PUT/s) add up over 256 prefixes; a local folder keeps plain names.
Throttled, reset and timed-out requests are retried with backoff here (:func:`with_retries`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import posixpath
import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.pipeline.format import open_fs
from gristmill.pipeline.format.storage import is_local, naming
from gristmill.pipeline.job.datasets import Shuffled
from gristmill.pipeline.job.partfile import PartitionedWriter, read_destination

ATOMIC_PUT = {"s3", "s3a", "gs", "gcs", "memory"}  # stores where one PUT publishes a whole object
PREFIX_DIGITS = 2  # hex digits of a key's hash before its file name: 256 prefixes
RETRIES = 6  # attempts after the first, backing off from RETRY_BASE_S (doubling, jittered) to ~6 s
RETRY_BASE_S = 0.1
_TRANSIENT_ERRNOS = {errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED}

Result = TypeVar("Result")


def is_transient(error: BaseException) -> bool:
    """Whether a work-folder request failed for a reason that passes: the class retried here is

    - throttling: S3's ``503 SlowDown`` (s3fs raises ``OSError(EBUSY)``), ``EAGAIN``;
    - connection resets and aborts (``ConnectionError``, ``ECONNRESET``, ``ECONNABORTED``);
    - timeouts (``TimeoutError``, ``ETIMEDOUT``).

    A missing file (``FileNotFoundError``), a refused permission or damaged bytes are not: retrying
    cannot fix them. (Input reads have their own classifier in ``gristmill.pipeline.job.inputs``.)
    """
    if isinstance(error, (FileNotFoundError, PermissionError)):
        return False
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    return isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS


def with_retries(call: Callable[[], Result], what: str) -> Result:
    """``call()``, retried with jittered exponential backoff while it fails with :func:`is_transient`
    errors; the last error is raised with ``what`` (the key) in its message."""
    for attempt in range(RETRIES + 1):
        try:
            return call()
        except OSError as error:
            if not is_transient(error) or attempt == RETRIES:
                if is_transient(error):
                    raise OSError(error.errno, f"{what}: still failing after {RETRIES} retries: {error}") from error
                raise
            time.sleep(RETRY_BASE_S * (2 ** attempt) * random.uniform(0.5, 1.0))
    raise AssertionError("unreachable")


def hashed(relative: str) -> str:
    """Where ``relative`` is stored: ``folder/HH/name``, HH a hash of the path (one of 256 prefixes);
    the few files at the top (the job and stage records) keep their names."""
    folder, name = posixpath.split(relative)
    if not folder:
        return relative
    digest = hashlib.blake2b(relative.encode("utf-8"), digest_size=4).hexdigest()[:PREFIX_DIGITS]
    return posixpath.join(folder, digest, name)


class WorkDir:
    """A folder (any fsspec URL) holding one job's intermediate results; picklable for Ray tasks.

    ``spread_keys``: on an object store, store files under hashed prefixes (:func:`hashed`; the work
    folder) or under their own names (files beside a corpus, which its manifest lists). ``exchange``: the name of the
    job's :class:`gristmill.pipeline.job.exchange.ShuffleBroker`, through which receivers get their rows (None:
    outside a job, a receiver reads its part of each sender's file itself).
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, *, spread_keys: bool = True,
                 exchange: str | None = None) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.spread_keys = spread_keys
        self.exchange = exchange
        # the partitioned files this process wrote since ``tasks.run_once`` last cleared it, with their
        # sizes: the task's completion record names them, so that receivers read exactly those
        self.sent: dict[str, int] = {}
        self.fs, self.root = open_fs(url, self.storage_options)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, (tuple, list)) else (self.fs.protocol,)
        self.atomic_put = bool(ATOMIC_PUT.intersection(protocols))
        self.hashed_keys = spread_keys and self.atomic_put

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "spread_keys": self.spread_keys,
                "exchange": self.exchange}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["url"], state["storage_options"], spread_keys=state["spread_keys"],  # type: ignore[misc]
                      exchange=state["exchange"])

    def path(self, *parts: str) -> str:
        """The stored path of a file (under a hashed prefix when spreading keys); ``path()`` is the folder."""
        if not parts:
            return self.root
        relative = posixpath.join(*parts)
        return posixpath.join(self.root, hashed(relative) if self.hashed_keys else relative)

    def _naming(self, relative: str, verb: str) -> contextlib.AbstractContextManager[None]:
        """A store error on ``relative`` names it and the operation (``gristmill.pipeline.format.storage.naming``)."""
        return naming(f"{self.url.rstrip('/')}/{relative}", verb, is_local(self.fs))

    def url_of(self, relative: str) -> str:
        """The fsspec URL of a file, for readers that open it themselves."""
        return posixpath.join(self.url, hashed(relative) if self.hashed_keys else relative)

    # -- whole files -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def _atomic(self, relative: str) -> Iterator[Any]:
        """A handle whose bytes appear under ``relative`` only once the block finishes without error:
        on an atomic-PUT store a local spool uploaded in one PUT, elsewhere a temporary name renamed."""
        target = self.path(relative)
        if self.atomic_put:
            with tempfile.NamedTemporaryFile(prefix="gristmill-put-") as spool:
                yield spool
                spool.flush()
                with self._naming(relative, "write"):
                    with_retries(lambda: self.fs.put_file(spool.name, target), target)
            return
        self.fs.makedirs(posixpath.dirname(target), exist_ok=True)
        temporary = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
        with self._naming(relative, "write"):
            with self.fs.open(temporary, "wb") as handle:
                yield handle
            self.fs.mv(temporary, target)

    def _get(self, relative: str) -> bytes:
        """A whole file in one GET (a ranged read from 0: s3fs asks the size first without one)."""
        target = self.path(relative)
        return with_retries(lambda: self.fs.cat_file(target, start=0), target)

    def write_table(self, relative: str, table: pa.Table) -> None:
        """Write one Parquet file atomically (temp name, then rename)."""
        with self._atomic(relative) as handle:
            pq.write_table(table, handle, compression="zstd")

    @contextlib.contextmanager
    def table_writer(self, relative: str, schema: pa.Schema) -> Iterator[pq.ParquetWriter]:
        """A Parquet file written one row group per ``write_table`` call, published atomically at the end,
        so a task holds one batch of a split at a time, not the split."""
        with self._atomic(relative) as handle, pq.ParquetWriter(handle, schema, compression="zstd") as writer:
            yield writer

    def read_row_groups(self, relative: str, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """The row groups of one Parquet file, one table at a time (on an object store the file's
        compressed bytes are fetched in one GET and decoded a row group at a time)."""
        with self._reader(relative) as handle:
            parquet = pq.ParquetFile(handle)
            for group in range(parquet.num_row_groups):
                yield parquet.read_row_group(group, columns=columns)

    @contextlib.contextmanager
    def _reader(self, relative: str) -> Iterator[Any]:
        if self.atomic_put:
            yield pa.BufferReader(self._get(relative))
        else:
            with self.fs.open(self.path(relative), "rb") as handle:
                yield handle

    def write_json(self, relative: str, data: Any) -> None:
        payload = json.dumps(data, sort_keys=True).encode("utf-8")
        with self._atomic(relative) as handle:
            handle.write(payload)

    def read_json(self, relative: str) -> Any | None:
        """The record, or None when it was never completed."""
        try:
            with self._naming(relative, "read"):
                return json.loads(self._get(relative))
        except FileNotFoundError:
            return None

    def read_table(self, relative: str, columns: list[str] | None = None) -> pa.Table:
        with self._naming(relative, "read"), self._reader(relative) as handle:
            return pq.read_table(handle, columns=columns)

    def remove_all(self) -> None:
        """The whole work folder goes (a listing and a bulk delete per 1,000 keys on an object store)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.root, recursive=True)

    # -- shuffles: partitioned files (pipeline.job.partfile) ------------------------------------------
    @contextlib.contextmanager
    def partitioned_writer(self, dataset: Shuffled, name: str, destinations: int | None = None,
                           budget_bytes: int | None = None) -> Iterator[PartitionedWriter]:
        """The sending side of a shuffle, a batch at a time: ``dataset.file(name)``, published atomically
        when the block ends; past ``budget_bytes`` of buffered rows it writes a run (None: never)."""
        with self._atomic(dataset.file(name)) as handle:
            writer = PartitionedWriter(handle, destinations, budget_bytes)
            yield writer
            writer.close()
            self.sent[dataset.file(name)] = handle.tell()

    def write_partitioned(self, dataset: Shuffled, name: str, table: pa.Table, destination: np.ndarray,
                          destinations: int | None = None) -> None:
        """The sending side of a shuffle in one go: row i of ``table`` goes to ``destination[i]``.

        The file is written even without rows, so a receiver knows the sender's part is complete when
        the sender's completion record exists.
        """
        with self.partitioned_writer(dataset, name, destinations) as writer:
            writer.write(table, destination)

    def partition_tables(self, dataset: Shuffled, destination: int) -> Iterator[pa.Table]:
        """The receiving side, a segment at a time: ``destination``'s rows of every sender's file, in
        file-name order (for a shuffle out of splits: key order). In a job they come through the
        exchange (:mod:`gristmill.pipeline.job.exchange`), or on a local disk from the files the
        driver named in ``dataset.senders_file()`` (each checked against the size its sender's record
        gives: a missing or short file is an error, never fewer rows); outside a job, from every file in
        the folder."""
        if self.exchange is not None:
            from gristmill.pipeline.job.exchange import received_tables

            yield from received_tables(self.exchange, dataset.folder, destination)
            return
        named = self.read_json(dataset.senders_file())
        if named is None:
            listing = self.fs.find(posixpath.join(self.root, dataset.folder))
            files = [(p, None) for p in sorted((p for p in listing if p.endswith(".part")), key=posixpath.basename)]
        else:
            files = [(self.path(relative), size) for relative, size in named]
        for path, size in files:
            yield from read_destination(self.fs, path, destination, size)

    def read_partition(self, dataset: Shuffled, destination: int, schema: pa.Schema) -> pa.Table:
        """All of ``destination``'s rows of a shuffle; an empty table of ``schema`` when there are none."""
        tables = list(self.partition_tables(dataset, destination))
        return pa.concat_tables(tables) if tables else schema.empty_table()


def partition_of(keys: np.ndarray, num_partitions: int) -> np.ndarray:
    """Hash partition of uint64/int64 keys: a multiplicative mix so that nearby keys spread out."""
    mixed = keys.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    return ((mixed >> np.uint64(33)) % np.uint64(num_partitions)).astype(np.int64)
