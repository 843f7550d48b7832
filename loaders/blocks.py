"""Fetch and decode blocks (Parquet row groups) with ranged reads, through the optional disk cache.

A shard's footer is read once (one ranged read of the bytes after the last row group, kept in a
byte-bounded cache: a 10 TB corpus has tens of thousands of shards, and an epoch touches them all) and
checked against the manifest. A block is then one ``fs.cat_file(path, start, end)`` of exactly the
row group's byte range (adjacent small row groups of one shard may share one read, see ``runs``),
decoded by pyarrow from a small file-like object that serves that range and the footer. Decoding
releases the GIL, so blocks decode in parallel on background threads. How many reads are in flight at
once is decided by ``gristmill.loaders.concurrency.ReadGate``, from what the link delivers.

Integrity: whole-shard checksums would mean reading a whole shard per block, so by default a block is
trusted when its footer matches the manifest (row groups, row counts), its read returned exactly the
bytes asked for, and it decodes to the row count the manifest promised; Parquet's decoder rejects most
damage (bad page headers, failed decompression). ``verify_checksums=True`` additionally streams each
shard through xxh3-128 once, on first touch.
"""

from __future__ import annotations

import errno
import io
import os
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.asyn import AsyncFileSystem

from gristmill.loaders.cache import DiskCache
from gristmill.loaders.concurrency import REMOTE_START_READS, START_READS, ReadGate
from gristmill.loaders.layout import Layout
from gristmill.pipeline.format import Corpus, CorpusError, ShardInfo


class LoaderError(CorpusError):
    """A block or shard cannot be read; the message names the shard (and row group)."""


class _RangeFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only some ranges are present (the block and the footer)."""

    def __init__(self, size: int, ranges: list[tuple[int, bytes]], name: str) -> None:
        super().__init__()
        self._size = size
        self._ranges = [(start, memoryview(data)) for start, data in ranges]  # slices without copying
        self._name = name
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, size: int = -1) -> memoryview:
        if size < 0:
            size = self._size - self._pos
        for start, data in self._ranges:
            if start <= self._pos and self._pos + size <= start + len(data):
                begin = self._pos - start
                self._pos += size
                return data[begin:begin + size]
        raise LoaderError(f"{self._name}: decoder asked for bytes [{self._pos}, {self._pos + size}) outside the "
                          "row group's manifest range; the manifest and the shard disagree")


class Counters:
    """What a trainer can log: bytes read, blocks fetched, cache hits, retries, reads in flight, waiting."""

    SUMS = ("bytes_read", "blocks_fetched", "reads", "cache_hits", "retries", "throttled", "wait_seconds",
            "read_seconds", "batches", "footers_dropped", "reads_ahead")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.blocks_fetched = 0
        self.reads = 0
        self.cache_hits = 0
        self.retries = 0
        self.throttled = 0
        self.wait_seconds = 0.0
        self.read_seconds = 0.0
        self.batches = 0
        self.footers_dropped = 0
        self.reads_ahead = 0
        self.distinct_blocks_in_batches = 0
        self.max_in_flight = 0
        self.in_flight_limit = 0

    def add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def peak(self, **values: float) -> None:
        """Raise each named figure to ``value`` if it is lower (a high-water mark)."""
        with self._lock:
            for name, value in values.items():
                setattr(self, name, max(getattr(self, name), value))

    def set(self, **values: float) -> None:
        with self._lock:
            for name, value in values.items():
                setattr(self, name, value)

    def as_dict(self) -> dict[str, float]:
        """A snapshot. ``blocks_per_batch`` is the shuffle-quality figure (distinct blocks in a batch);
        ``read_mb_per_s`` is what the link delivered while at least one read was in flight."""
        with self._lock:
            out = {name: getattr(self, name) for name in (*self.SUMS, "max_in_flight", "in_flight_limit")}
            out["blocks_per_batch"] = self.distinct_blocks_in_batches / self.batches if self.batches else 0.0
            out["read_mb_per_s"] = self.bytes_read / 1e6 / self.read_seconds if self.read_seconds else 0.0
        return out


def check_columns(corpus: Corpus, columns: list[str]) -> None:
    """Raise LoaderError naming the columns the corpus lacks (before any block is read)."""
    missing = [c for c in columns if c not in corpus.schema.names]
    if missing:
        raise LoaderError(f"{corpus.url}: corpus has no column(s) {missing}; it has {corpus.schema.names}")


_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, LoaderError)
_BACKOFF_FIRST, _BACKOFF_CAP = 0.05, 5.0
FOOTER_CACHE_BYTES = 64 * 1024 * 1024  # footers kept per process, least recently used dropped first
PART_BYTES = 1024 * 1024  # a read on an idle link is split into parts of at least this many bytes,
MAX_PARTS = 4  # at most this many: a 4 MiB block at 40 MB/s per connection arrives in 0.03 s, not 0.1 s
# A block is decoded in record batches of about this many bytes, not as one table: a column buffer grown
# to a whole block's size (17 MB of text) is too big for the allocator to keep, so every decode faulted
# in fresh pages for it and the kernel zeroed them (a third of a decode's CPU; 1.6 against 2.6 CPU-s
# an epoch decoded in 1 MiB batches, measured with one thread)
DECODE_BATCH_BYTES = 1024 * 1024
DEFAULT_EXPANSION = 4.0  # decoded bytes per stored byte assumed for a block until its shard's footer is read


def is_throttling(exc: BaseException) -> bool:
    """Whether a storage error asks us to slow down (S3's 503 SlowDown; s3fs raises it as EBUSY)."""
    text = str(exc)
    return (getattr(exc, "errno", None) == errno.EBUSY
            or any(sign in text for sign in ("SlowDown", "reduce your request rate", "ServiceUnavailable")))


class BlockSource:
    """Reads blocks of one corpus: footers once per shard, blocks with ranged reads, with retries.

    ``max_reads`` bounds the reads in flight (the adaptive ``ReadGate`` stays below it);
    ``coalesce_bytes``: adjacent row groups of one shard are read together while the read stays this small.
    """

    def __init__(self, corpus: Corpus, columns: list[str], *, retries: int = 4, cache: DiskCache | None = None,
                 verify_checksums: bool = False, counters: Counters | None = None, max_reads: int = 64,
                 coalesce_bytes: int = 4 * 1024 * 1024) -> None:
        check_columns(corpus, columns)
        self.corpus = corpus
        self.columns = columns
        self.layout = Layout.of(corpus.shards)
        self.retries = retries
        self.cache = cache
        self.verify_checksums = verify_checksums
        self.counters = counters or Counters()
        # This process's own filesystem object: an async one (s3fs, gcsfs) made before a fork — the first
        # batch is read before DataLoader forks its workers — refuses to work in the child, so the child
        # makes its own; in the process that opened the corpus its object is used (a client costs ~0.5 s).
        fs = corpus.fs
        if getattr(fs, "_pid", os.getpid()) != os.getpid():
            fs = type(fs)(*fs.storage_args, **fs.storage_options)
        self.fs = fs
        self._async = isinstance(fs, AsyncFileSystem)  # an object store: reads at once on one event loop
        self.gate = ReadGate(self.counters, start=REMOTE_START_READS if self._async else START_READS,
                             maximum=max_reads)
        self.coalesce_bytes = coalesce_bytes
        self._expansion = DEFAULT_EXPANSION
        self._footers: OrderedDict[int, tuple[pq.FileMetaData, bytes]] = OrderedDict()
        self._footer_bytes = 0
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    def _where(self, shard: int) -> str:
        info = self.corpus.shards[shard]
        if "://" not in self.corpus.url:
            return self.corpus.shard_path(info)
        return f"{self.corpus.url.rstrip('/')}/{info.path}"

    def _fetch(self, shard: int, start: int, end: int, what: str,
               download: Callable[[], bytes] | None = None) -> bytes:
        """The bytes ``[start, end)`` of a shard through the disk cache when there is one; ``download``
        (default: one ranged read of exactly them) is called only on a cache miss."""
        download = download or (lambda: self._download(shard, start, end, what))
        if self.cache is None:
            return download()
        data, hit = self.cache.fetch(self._key(self.corpus.shards[shard], start, end), end - start, download)
        if hit:
            self.counters.add(cache_hits=1)
        return data

    def _download(self, shard: int, start: int, end: int, what: str) -> bytes:
        """One ranged read from storage, retrying transient errors with jittered exponential back-off.

        Throttling (503 SlowDown) also halves the reads in flight. A read of the wrong length is an error
        at once: a store that answers with other bytes than asked for is not trusted on a retry either.
        """
        path = self.corpus.shard_path(self.corpus.shards[shard])
        for attempt in range(self.retries + 1):
            try:
                with self.gate.slot(extra=self._parts(end - start) - 1) as parts:
                    if parts == 1:
                        data = self.fs.cat_file(path, start=start, end=end)
                    else:  # parts read at once on an async store; each is an exact range, as one read is
                        bounds = [start + (end - start) * i // parts for i in range(parts + 1)]
                        data = b"".join(self.fs.cat_ranges([path] * parts, bounds[:-1], bounds[1:], on_error="raise"))
                break
            except FileNotFoundError:
                raise LoaderError(f"{self._where(shard)}: shard listed in the manifest is missing") from None
            except _PERMANENT:
                raise
            except Exception as exc:  # noqa: BLE001 - storage clients raise many types for transient faults
                if attempt == self.retries:
                    raise LoaderError(f"{self._where(shard)}: reading {what} failed after {attempt + 1} "
                                      f"attempts: {type(exc).__name__}: {exc}") from exc
                if is_throttling(exc):
                    self.counters.add(throttled=1)
                    self.gate.throttled()
                self.counters.add(retries=1)
                # "full jitter": readers throttled together do not all come back at the same moment
                time.sleep(random.uniform(0, min(_BACKOFF_CAP, _BACKOFF_FIRST * 2 ** attempt)))
        if len(data) != end - start:
            problem = ("the shard ends early; the shard is truncated" if len(data) < end - start else
                       "the store sent more than asked for")
            raise LoaderError(f"{self._where(shard)}: {what} is bytes [{start}, {end}) but the read returned "
                              f"{len(data)} of {end - start} bytes: {problem}")
        self.gate.finished(len(data))
        self.counters.add(bytes_read=len(data), reads=1)
        return data

    def _parts(self, nbytes: int) -> int:
        """Into how many parts a read of ``nbytes`` may be split when the link is idle (see ``ReadGate.slot``):
        at least ``PART_BYTES`` each, at most ``MAX_PARTS``, and only on a store that reads them at once."""
        if not self._async:
            return 1
        return max(1, min(MAX_PARTS, nbytes // PART_BYTES))

    def has_footer(self, shard: int) -> bool:
        return shard in self._footers

    def footer(self, shard: int) -> tuple[pq.FileMetaData, bytes]:
        """The shard's Parquet metadata, read once and checked against the manifest."""
        with self._lock:
            found = self._footers.get(shard)
            if found is not None:
                self._footers.move_to_end(shard)
                return found
            lock = self._locks.setdefault(shard, threading.Lock())
        with lock:
            found = self._footers.get(shard)
            if found is not None:
                return found
            info = self.corpus.shards[shard]
            if self.verify_checksums:
                result = self.corpus.verify_shard(info)
                if not result.ok:
                    raise LoaderError(f"{self._where(shard)}: {result.detail}")
            tail = self._fetch(shard, info.footer_offset, info.bytes, "the footer")
            try:
                metadata = pq.read_metadata(pa.BufferReader(tail))
            except (pa.ArrowException, OSError) as exc:
                raise LoaderError(f"{self._where(shard)}: footer is corrupt ({exc})") from None
            counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
            listed = self.layout.rows[self.layout.blocks_of(shard)].tolist()
            if counts != listed:
                raise LoaderError(f"{self._where(shard)}: footer lists row groups of {counts} rows, the manifest "
                                  f"{listed}; the shard was replaced or is corrupt")
            stored = int(self.layout.length[self.layout.blocks_of(shard)].sum())
            if stored:
                decoded = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
                self._expansion = max(self._expansion, decoded / stored)  # over- rather than under-reserve
            self._keep_footer(shard, (metadata, tail))
            return metadata, tail

    def _keep_footer(self, shard: int, footer: tuple[pq.FileMetaData, bytes]) -> None:
        """Cache a footer within ``FOOTER_CACHE_BYTES`` (its stored size; the parsed metadata is about as
        big), dropping the least recently used; a dropped footer is read again when next needed."""
        with self._lock:
            self._footers[shard] = footer
            self._footer_bytes += len(footer[1])
            while self._footer_bytes > FOOTER_CACHE_BYTES and len(self._footers) > 1:
                dropped, (_, tail) = self._footers.popitem(last=False)
                self._footer_bytes -= len(tail)
                self._locks.pop(dropped, None)
                self.counters.add(footers_dropped=1)

    def block_nbytes(self, block: int) -> int:
        """Decoded size of a block as its footer records it (used to budget prefetch memory)."""
        metadata, _ = self.footer(int(self.layout.shard[block]))
        return int(metadata.row_group(int(self.layout.group[block])).total_byte_size)

    def estimate_nbytes(self, block: int) -> int:
        """The block's decoded size without a read: the footer's figure if its shard's footer is in,
        else its stored size times the largest expansion seen (a footer read costs a round trip)."""
        found = self._footers.get(int(self.layout.shard[block]))
        if found is not None:
            return int(found[0].row_group(int(self.layout.group[block])).total_byte_size)
        return int(self.layout.length[block] * self._expansion)

    def runs(self, blocks: list[int]) -> list[list[int]]:
        """``blocks`` grouped into runs that one read can fetch: adjacent byte ranges of one shard, each
        run at most ``coalesce_bytes`` (or one block). Small row groups then cost one request, not many,
        while standard blocks keep a read (and so a connection) each, for parallelism."""
        layout = self.layout
        out: list[list[int]] = []
        for block in sorted(blocks, key=lambda b: (int(layout.shard[b]), int(layout.offset[b]))):
            if out:
                last = out[-1]
                begin = int(layout.offset[last[0]])
                if (layout.shard[last[-1]] == layout.shard[block]
                        and layout.byte_range(last[-1])[1] == int(layout.offset[block])
                        and layout.byte_range(block)[1] - begin <= self.coalesce_bytes):
                    last.append(block)
                    continue
            out.append([block])
        return out

    def cache_key(self, block: int) -> str:
        """The disk-cache name of a block: shard checksum plus byte range, so a rewritten shard never hits."""
        start, end = self.layout.byte_range(block)
        return self._key(self.corpus.shards[int(self.layout.shard[block])], start, end)

    @staticmethod
    def _key(info: ShardInfo, start: int, end: int) -> str:
        return f"{info.checksum.split(':')[-1][:32]}-{start}-{end}"

    def fetch(self, block: int) -> bytes:
        """The block's bytes: one ranged read of exactly the row group (or a disk-cache hit)."""
        return self.fetch_run([block])[block]

    def fetch_run(self, run: list[int]) -> dict[int, bytes]:
        """The bytes of a run of adjacent blocks (see ``runs``) with one ranged read.

        Each block is still its own disk-cache entry. The read starts at the first block that misses
        (blocks before it came from the cache, perhaps put there by another process) and goes to the
        end of the run.
        """
        shard = int(self.layout.shard[run[0]])
        last = self.layout.byte_range(run[-1])[1]
        groups = {b: int(self.layout.group[b]) for b in run}
        downloaded: list[tuple[int, bytes]] = []

        def download_from(block: int) -> bytes:
            start, end = self.layout.byte_range(block)
            if not downloaded:
                what = (f"row group {groups[block]}" if block == run[-1] else
                        f"row groups {groups[block]}-{groups[run[-1]]}") + f" (bytes [{start}, {last}))"
                downloaded.append((start, self._download(shard, start, last, what)))
            first, data = downloaded[0]
            return data[start - first:end - first]

        out = {}
        for block in run:
            start, end = self.layout.byte_range(block)
            out[block] = self._fetch(shard, start, end, f"row group {groups[block]} (bytes [{start}, {end}))",
                                     lambda b=block: download_from(b))
        self.counters.add(blocks_fetched=len(run))
        return out

    def decode(self, block: int, data: bytes, head_rows: int | None = None) -> pa.Table:
        """Decode fetched bytes: the whole row group, or only its first ``head_rows`` rows (first pages only)."""
        shard, group = int(self.layout.shard[block]), int(self.layout.group[block])
        info = self.corpus.shards[shard]
        metadata, tail = self.footer(shard)
        start, end = self.layout.byte_range(block)
        rows = int(self.layout.rows[block])
        what = f"row group {group} (bytes [{start}, {end}))"
        source = _RangeFile(info.bytes, [(start, data), (info.footer_offset, tail)], self._where(shard))
        expected = rows if head_rows is None else min(head_rows, rows)
        try:
            parquet = pq.ParquetFile(source, metadata=metadata, page_checksum_verification=True)
            if head_rows is not None:
                batch_rows = expected
            else:
                decoded = metadata.row_group(group).total_byte_size
                batch_rows = max(1, DECODE_BATCH_BYTES * rows // max(1, decoded))
            if batch_rows >= rows:
                table = parquet.read_row_group(group, columns=self.columns, use_threads=False)
            else:
                batches = parquet.iter_batches(batch_size=batch_rows, row_groups=[group], columns=self.columns,
                                               use_threads=False)
                table = pa.Table.from_batches([next(batches)] if head_rows is not None else list(batches))
        except LoaderError:
            raise
        except (pa.ArrowException, OSError, ValueError, StopIteration) as exc:
            raise LoaderError(f"{self._where(shard)}: {what} is corrupt and cannot be decoded "
                              f"({type(exc).__name__}: {exc})") from None
        if table.num_rows != expected:
            raise LoaderError(f"{self._where(shard)}: {what} decoded to {table.num_rows} rows, the manifest "
                              f"says {expected}")
        return table

    def read(self, block: int) -> pa.Table:
        """Fetch and decode one whole block."""
        return self.decode(block, self.fetch(block))
