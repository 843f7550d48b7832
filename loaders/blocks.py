"""Fetch and decode one block (a Parquet row group) with one ranged read, plus the optional disk cache.

A shard's footer is read once (one ranged read of the bytes after the last row group, cached) and
checked against the manifest. A block is then one ``fs.cat_file(path, start, end)`` of exactly the
row group's byte range, decoded by pyarrow from a small file-like object that serves that range and
the footer. Decoding releases the GIL, so blocks decode in parallel on background threads.

Integrity: whole-shard checksums would mean reading a whole shard per block, so by default a block is
trusted when its footer matches the manifest (row groups, row counts) and it decodes to the row count
the manifest promised; Parquet's decoder rejects most damage (bad page headers, failed decompression).
``verify_checksums=True`` additionally streams each shard through xxh3-128 once, on first touch.
"""

from __future__ import annotations

import io
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq

from loaders.cache import DiskCache
from loaders.layout import Layout
from pipeline.format import Corpus, CorpusError, ShardInfo


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
    """What a trainer can log: bytes read, blocks fetched, cache hits, time spent waiting for data."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_read = 0
        self.blocks_fetched = 0
        self.cache_hits = 0
        self.retries = 0
        self.wait_seconds = 0.0
        self.batches = 0
        self.distinct_blocks_in_batches = 0

    def add(self, **amounts: float) -> None:
        with self._lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def as_dict(self) -> dict[str, float]:
        """A snapshot; ``blocks_per_batch`` is the shuffle-quality figure (distinct blocks in a batch)."""
        with self._lock:
            out = {name: getattr(self, name) for name in (
                "bytes_read", "blocks_fetched", "cache_hits", "retries", "wait_seconds", "batches")}
            out["blocks_per_batch"] = self.distinct_blocks_in_batches / self.batches if self.batches else 0.0
        return out


def check_columns(corpus: Corpus, columns: list[str]) -> None:
    """Raise LoaderError naming the columns the corpus lacks (before any block is read)."""
    missing = [c for c in columns if c not in corpus.schema.names]
    if missing:
        raise LoaderError(f"{corpus.url}: corpus has no column(s) {missing}; it has {corpus.schema.names}")


_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError, LoaderError)


class BlockSource:
    """Reads blocks of one corpus: footers once per shard, each block with one ranged read, with retries."""

    def __init__(self, corpus: Corpus, columns: list[str], *, retries: int = 4, cache: DiskCache | None = None,
                 verify_checksums: bool = False, counters: Counters | None = None) -> None:
        check_columns(corpus, columns)
        self.corpus = corpus
        self.columns = columns
        self.layout = Layout.of(corpus.shards)
        self.retries = retries
        self.cache = cache
        self.verify_checksums = verify_checksums
        self.counters = counters or Counters()
        self._footers: dict[int, tuple[pq.FileMetaData, bytes]] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    def _where(self, shard: int) -> str:
        info = self.corpus.shards[shard]
        if "://" not in self.corpus.url:
            return self.corpus.shard_path(info)
        return f"{self.corpus.url.rstrip('/')}/{info.path}"

    def _fetch(self, shard: int, start: int, end: int, what: str) -> bytes:
        """One ranged read, through the disk cache when there is one."""
        if self.cache is None:
            return self._download(shard, start, end, what)
        data, hit = self.cache.fetch(self._key(self.corpus.shards[shard], start, end), end - start,
                                     lambda: self._download(shard, start, end, what))
        if hit:
            self.counters.add(cache_hits=1)
        return data

    def _download(self, shard: int, start: int, end: int, what: str) -> bytes:
        """One ranged read from storage, retrying transient errors; a short read is an error."""
        info = self.corpus.shards[shard]
        delay = 0.05
        for attempt in range(self.retries + 1):
            try:
                data = self.corpus.fs.cat_file(self.corpus.shard_path(info), start=start, end=end)
                break
            except FileNotFoundError:
                raise LoaderError(f"{self._where(shard)}: shard listed in the manifest is missing") from None
            except _PERMANENT:
                raise
            except Exception as exc:  # noqa: BLE001 - storage clients raise many types for transient faults
                if attempt == self.retries:
                    raise LoaderError(f"{self._where(shard)}: reading {what} failed after {attempt + 1} "
                                      f"attempts: {type(exc).__name__}: {exc}") from exc
                self.counters.add(retries=1)
                time.sleep(delay)
                delay *= 2
        if len(data) != end - start:
            raise LoaderError(f"{self._where(shard)}: {what} is bytes [{start}, {end}) but the shard ends early "
                              f"({len(data)} of {end - start} bytes read); the shard is truncated")
        self.counters.add(bytes_read=len(data))
        return data

    def footer(self, shard: int) -> tuple[pq.FileMetaData, bytes]:
        """The shard's Parquet metadata, read once and checked against the manifest."""
        found = self._footers.get(shard)
        if found is not None:
            return found
        with self._lock:
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
            self._footers[shard] = (metadata, tail)
            return metadata, tail

    def block_nbytes(self, block: int) -> int:
        """Decoded size of a block as its footer records it (used to budget prefetch memory)."""
        metadata, _ = self.footer(int(self.layout.shard[block]))
        return int(metadata.row_group(int(self.layout.group[block])).total_byte_size)

    def cache_key(self, block: int) -> str:
        """The disk-cache name of a block: shard checksum plus byte range, so a rewritten shard never hits."""
        start, end = self.layout.byte_range(block)
        return self._key(self.corpus.shards[int(self.layout.shard[block])], start, end)

    @staticmethod
    def _key(info: ShardInfo, start: int, end: int) -> str:
        return f"{info.checksum.split(':')[-1][:32]}-{start}-{end}"

    def fetch(self, block: int) -> bytes:
        """The block's bytes: exactly one ranged read of the row group (or a disk-cache hit)."""
        shard, group = int(self.layout.shard[block]), int(self.layout.group[block])
        start, end = self.layout.byte_range(block)
        self.footer(shard)
        data = self._fetch(shard, start, end, f"row group {group} (bytes [{start}, {end}))")
        self.counters.add(blocks_fetched=1)
        return data

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
            parquet = pq.ParquetFile(source, metadata=metadata)
            if head_rows is None:
                table = parquet.read_row_group(group, columns=self.columns, use_threads=False)
            else:
                batch = next(parquet.iter_batches(batch_size=expected, row_groups=[group], columns=self.columns,
                                                  use_threads=False))
                table = pa.Table.from_batches([batch])
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
