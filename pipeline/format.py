"""The gristmill corpus format: Arrow schema, shard writer, manifest, reader.

A corpus is a folder (any fsspec URL) of Parquet shards plus one ``manifest.json``. Shards are
written first under unique names; the manifest is written last, atomically, and is the commit
point: readers only ever read what a manifest lists. This module imports neither Ray nor aiohttp,
so the loader and the crawler can use it cheaply. See docs/FORMAT.md.
"""

from __future__ import annotations

import base64
import datetime as _dt
import fnmatch
import json
import os
import posixpath
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, BinaryIO

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

FORMAT_NAME = "gristmill-corpus"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
CHECKSUM_ALGORITHM = "xxh3_128"

DEFAULT_SHARD_BYTES = 256 * 1024 * 1024
DEFAULT_ROW_GROUP_BYTES = 4 * 1024 * 1024
# Parquet checks a page against its size limit (1 MiB) only every this many rows; at pyarrow's default
# of 1,024 a page of web documents grows to ~10 MB, so a loader's first batch decompresses all of it.
PAGE_CHECK_ROWS = 64
DEFAULT_COMPRESSION = "zstd"

# The columns of a deduplicated corpus; docs/FORMAT.md explains each one.
CORPUS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("domain", pa.string()),
        pa.field("language", pa.string()),
        pa.field("fetch_time", pa.timestamp("ms", tz="UTC")),
        pa.field("content_hash", pa.string()),
        pa.field("cluster_id", pa.string()),
        pa.field("cluster_size", pa.int32()),
        pa.field("is_representative", pa.bool_()),
    ]
)
REQUIRED_COLUMNS = ("id", "text")
# Columns whose values are (nearly) unique per row: a dictionary page buys nothing and costs decode
# time (measured 20% faster block decode for text without it, same file size; docs/FORMAT.md).
UNIQUE_VALUED_COLUMNS = frozenset({"id", "text", "content_hash", "url", "final_url", "cluster_id"})


class CorpusError(Exception):
    """A corpus cannot be read or written as asked; the message names the file."""


class ChecksumMismatch(CorpusError):
    """A shard's bytes do not match the checksum its manifest recorded."""


@dataclass(frozen=True)
class RowGroupInfo:
    """One block a loader fetches with one ranged read: ``[offset, offset + length)``."""

    rows: int
    offset: int
    length: int


@dataclass(frozen=True)
class ShardInfo:
    """What the manifest records for one shard; ``path`` is relative to the corpus folder."""

    path: str
    rows: int
    bytes: int
    checksum: str
    row_groups: tuple[RowGroupInfo, ...]
    footer_offset: int
    footer_length: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ShardInfo:
        return cls(
            path=str(data["path"]),
            rows=int(data["rows"]),
            bytes=int(data["bytes"]),
            checksum=str(data["checksum"]),
            row_groups=tuple(RowGroupInfo(**rg) for rg in data["row_groups"]),
            footer_offset=int(data["footer_offset"]),
            footer_length=int(data["footer_length"]),
        )


def member_path(root: str, relative: Any, where: str, what: str) -> str:
    """``root/relative`` for a path a manifest names, after checking it cannot leave the corpus folder.

    A manifest is untrusted input: a shard or index path of ``../x``, ``/etc/x`` or ``s3://other/x``
    would make every reader follow it. The rule, one for every entry: a non-empty relative POSIX path,
    already normalised (no ``.``, ``..`` or empty parts), with no scheme, drive, backslash or control
    character. ``where`` names the manifest and ``what`` the entry in the error.
    """
    reason = _unsafe_member(relative)
    if reason:
        raise CorpusError(f"{where}: {what} {relative!r} {reason}; a manifest may only name files inside its corpus folder")
    return posixpath.join(root, relative)


def _unsafe_member(relative: Any) -> str | None:
    """Why ``relative`` may not be used as a path inside a corpus folder, or None when it may."""
    if not isinstance(relative, str) or not relative:
        return "is not a non-empty string"
    if any(ord(ch) < 32 or ch in "\\:" or ord(ch) == 127 for ch in relative):
        return "holds a control character, a backslash or a colon (a scheme or drive)"
    if relative.startswith("/"):
        return "is absolute"
    parts = relative.split("/")
    if ".." in parts:
        return "climbs out of its folder (..)"
    if any(part in ("", ".") for part in parts):
        return "is not a normalised relative path"
    return None


def open_fs(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve any fsspec URL (local path, memory://, s3://) to a filesystem and a root path."""
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs, root.rstrip("/") or root


def checksum_of(fs: fsspec.AbstractFileSystem, path: str, chunk_bytes: int = 8 * 1024 * 1024) -> str:
    """Stream a file through xxh3-128 without holding it in memory."""
    digest = xxhash.xxh3_128()
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return f"{CHECKSUM_ALGORITHM}:{digest.hexdigest()}"


class _HashingSink:
    """A write-only file wrapper that checksums and counts bytes as they pass, so a shard is never re-read."""

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle
        self._digest = xxhash.xxh3_128()
        self.position = 0
        self.closed = False

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        self._digest.update(view)
        self._handle.write(view)
        self.position += len(view)
        return len(view)

    def tell(self) -> int:
        return self.position

    def flush(self) -> None:
        self._handle.flush()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._handle.close()

    @property
    def checksum(self) -> str:
        return f"{CHECKSUM_ALGORITHM}:{self._digest.hexdigest()}"


def _row_group_ranges(metadata: pq.FileMetaData) -> list[RowGroupInfo]:
    ranges = []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        start, end = None, 0
        for column_index in range(group.num_columns):
            column = group.column(column_index)
            first = column.data_page_offset
            if column.has_dictionary_page and column.dictionary_page_offset:
                first = min(first, column.dictionary_page_offset)
            start = first if start is None else min(start, first)
            end = max(end, first + column.total_compressed_size)
        ranges.append(RowGroupInfo(rows=group.num_rows, offset=int(start or 0), length=int(end - (start or 0))))
    return ranges


def _as_table(data: pa.Table | pa.RecordBatch | Iterable[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        missing = [name for name in schema.names if name not in data.column_names]
        if missing:
            raise CorpusError(f"table lacks columns {missing} of the corpus schema")
        return data.select(schema.names).cast(schema)
    return pa.Table.from_pylist(list(data), schema=schema)


class ShardWriter:
    """Writes rows into Parquet shards cut at a target byte size, with row groups near a target byte size.

    Row-group size is steered by the compression ratio seen so far, so on-disk blocks land near the
    target. ``close()`` returns the shards written; ``commit()`` also writes the manifest. Nothing is
    visible to readers until a manifest lists it.
    """

    def __init__(
        self,
        url: str,
        schema: pa.Schema = CORPUS_SCHEMA,
        *,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        compression: str = DEFAULT_COMPRESSION,
        name_prefix: str = "part",
        run_id: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        for column in REQUIRED_COLUMNS:
            if column not in schema.names:
                raise CorpusError(f"schema must have a {column!r} column")
        if row_group_bytes <= 0 or shard_bytes < row_group_bytes:
            raise ValueError("need 0 < row_group_bytes <= shard_bytes")
        self.url = url
        self.schema = schema
        self.shard_bytes = shard_bytes
        self.row_group_bytes = row_group_bytes
        self.compression = compression
        self.name_prefix = name_prefix
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = open_fs(url, storage_options)
        self.fs.makedirs(self.root, exist_ok=True)
        self.shards: list[ShardInfo] = []
        self._pending: list[pa.Table] = []
        self._pending_bytes = 0
        self._compression_ratio = 0.5  # on-disk bytes per in-memory byte; learned as row groups are written
        self._sink: _HashingSink | None = None
        self._writer: pq.ParquetWriter | None = None
        self._shard_name = ""
        self._shard_rows = 0

    # -- writing -------------------------------------------------------------------------------
    def write(self, data: pa.Table | pa.RecordBatch | Iterable[Mapping[str, Any]]) -> None:
        """Buffer rows; full row groups go to disk as soon as the buffer holds one."""
        table = _as_table(data, self.schema)
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_bytes += table.nbytes
        while self._pending_bytes * self._compression_ratio >= self.row_group_bytes:
            self._flush_row_group(final=False)

    def _flush_row_group(self, final: bool) -> None:
        table = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]  # no copy
        bytes_per_row = max(table.nbytes / table.num_rows, 1.0)
        rows = max(1, int(self.row_group_bytes / (bytes_per_row * self._compression_ratio)))
        if final:
            rows = min(rows, table.num_rows)
        if rows >= table.num_rows and not final:
            rows = table.num_rows
        group, rest = table.slice(0, rows), table.slice(rows)
        self._write_row_group(group)
        self._pending = [rest] if rest.num_rows else []
        self._pending_bytes = rest.nbytes if rest.num_rows else 0

    def _write_row_group(self, group: pa.Table) -> None:
        if self._writer is None:
            self._open_shard()
        assert self._writer is not None and self._sink is not None
        before = self._sink.position
        self._writer.write_table(group, row_group_size=group.num_rows)
        written = self._sink.position - before
        if written > 0 and group.nbytes > 0:
            observed = written / group.nbytes
            self._compression_ratio = observed if not self.shards and self._shard_rows == 0 else (
                0.5 * self._compression_ratio + 0.5 * observed
            )
        self._shard_rows += group.num_rows
        if self._sink.position + self.row_group_bytes > self.shard_bytes:
            self._close_shard()

    def _open_shard(self) -> None:
        self._shard_name = f"{self.name_prefix}-{self.run_id}-{len(self.shards):05d}.parquet"
        handle = self.fs.open(posixpath.join(self.root, self._shard_name), "wb")
        self._sink = _HashingSink(handle)
        dictionary_columns = [name for name in self.schema.names if name not in UNIQUE_VALUED_COLUMNS]
        self._writer = pq.ParquetWriter(self._sink, self.schema, compression=self.compression,
                                        use_dictionary=dictionary_columns, write_batch_size=PAGE_CHECK_ROWS)
        self._shard_rows = 0

    def _close_shard(self) -> None:
        assert self._writer is not None and self._sink is not None
        self._writer.close()
        metadata = self._writer.writer.metadata
        self._sink.close()
        groups = _row_group_ranges(metadata)
        data_end = max((g.offset + g.length for g in groups), default=4)
        self.shards.append(
            ShardInfo(
                path=self._shard_name,
                rows=self._shard_rows,
                bytes=self._sink.position,
                checksum=self._sink.checksum,
                row_groups=tuple(groups),
                footer_offset=data_end,
                footer_length=self._sink.position - data_end,
            )
        )
        self._writer = None
        self._sink = None

    def close(self) -> list[ShardInfo]:
        """Flush what is buffered and close the open shard; return every shard written."""
        while self._pending:
            self._flush_row_group(final=True)
        if self._writer is not None:
            self._close_shard()
        return list(self.shards)

    def commit(self, stats: Mapping[str, Any] | None = None, extra: Mapping[str, Any] | None = None) -> Manifest:
        """Close and publish: write the manifest listing every shard, atomically."""
        shards = self.close()
        return write_manifest(self.url, shards, self.schema, stats=stats, extra=extra,
                              storage_options=self.storage_options)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()


# -- manifest ----------------------------------------------------------------------------------
@dataclass
class Manifest:
    """The parsed ``manifest.json``: every shard, the schema, and the run's statistics."""

    shards: list[ShardInfo]
    schema: pa.Schema
    stats: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    format_version: int = FORMAT_VERSION

    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": FORMAT_NAME,
                "format_version": self.format_version,
                "created": self.created,
                "rows": self.num_rows,
                "bytes": self.num_bytes,
                "checksum_algorithm": CHECKSUM_ALGORITHM,
                "schema": {
                    "fields": [
                        {"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in self.schema
                    ],
                    "arrow": base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii"),
                },
                "shards": [s.to_dict() for s in self.shards],
                "stats": self.stats,
                "extra": self.extra,
            },
            indent=1,
            sort_keys=False,
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{where}: manifest is not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise CorpusError(f"{where}: not a gristmill corpus manifest (no \"format\": \"{FORMAT_NAME}\")")
        version = data.get("format_version")
        if version != FORMAT_VERSION:
            raise CorpusError(
                f"{where}: manifest format version {version!r} is not supported by this gristmill "
                f"(it reads version {FORMAT_VERSION}); upgrade gristmill or rewrite the corpus"
            )
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["schema"]["arrow"])))
            shards = [ShardInfo.from_dict(s) for s in data["shards"]]
        except (KeyError, TypeError, ValueError, AttributeError, pa.ArrowInvalid) as exc:
            raise CorpusError(f"{where}: manifest is malformed ({type(exc).__name__}: {exc})") from None
        _check_shards(shards, where)
        for key in ("stats", "extra"):
            if not isinstance(data.get(key) or {}, dict):
                raise CorpusError(f"{where}: manifest is malformed ({key!r} is not an object)")
        return cls(
            shards=shards,
            schema=schema,
            stats=dict(data.get("stats") or {}),
            extra=dict(data.get("extra") or {}),
            created=str(data.get("created", "")),
            format_version=version,
        )


def _check_shards(shards: list[ShardInfo], where: str) -> None:
    """Refuse shard entries a reader could be misled by: paths leaving the folder, impossible numbers."""
    seen: set[str] = set()
    for shard in shards:
        member_path("", shard.path, where, "shard path")
        if shard.path in seen:
            raise CorpusError(f"{where}: shard {shard.path!r} is listed twice")
        seen.add(shard.path)
        numbers = [shard.rows, shard.bytes, shard.footer_offset, shard.footer_length]
        numbers += [n for g in shard.row_groups for n in (g.rows, g.offset, g.length)]
        if min(numbers, default=0) < 0 or sum(g.rows for g in shard.row_groups) != shard.rows or any(
                g.offset + g.length > shard.bytes for g in shard.row_groups):
            raise CorpusError(f"{where}: shard {shard.path!r} has inconsistent sizes (negative numbers, row groups "
                              "that do not add up to its rows, or byte ranges past its end)")


def write_manifest(
    url: str,
    shards: Iterable[ShardInfo],
    schema: pa.Schema,
    *,
    stats: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Manifest:
    """Publish a corpus: the manifest appears whole or not at all.

    Local disks get write-to-temp plus ``os.replace``; object stores (s3, gcs, memory) make a single
    PUT visible atomically, so there the manifest is written in one call.
    """
    manifest = Manifest(
        shards=list(shards),
        schema=schema,
        stats=dict(stats or {}),
        extra=dict(extra or {}),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    fs, root = open_fs(url, storage_options)
    payload = manifest.to_json().encode("utf-8")
    target = posixpath.join(root, MANIFEST_NAME)
    if _is_local(fs):
        temporary = f"{target}.tmp-{uuid.uuid4().hex}"
        with open(temporary, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    else:
        fs.pipe_file(target, payload)
    return manifest


def _manifest_location(url: str, fs: fsspec.AbstractFileSystem, root: str) -> str:
    """How errors name a corpus's manifest: the local path, or the URL as the user gave it."""
    return posixpath.join(root, MANIFEST_NAME) if _is_local(fs) else f"{url.rstrip('/')}/{MANIFEST_NAME}"


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


# Files a gristmill writer puts in a corpus folder (fnmatch patterns, relative to the folder): what a
# job may treat as its own when it checks a folder before writing and cleans up after committing.
OWNED_PATTERNS = ("manifest.json", "manifest.json.tmp-*", "*.parquet.tmp-*", "part-*.parquet", "removed-*.parquet",
                  "_index/index-*.parquet", "_index/*.tmp-*", "_rejects/rejects-*.parquet", "_rejects/*.tmp-*",
                  "_work/*")


def is_owned_file(relative: str) -> bool:
    """True for a path (relative to a corpus folder) of a kind gristmill writers create there."""
    return any(fnmatch.fnmatchcase(relative, pattern) for pattern in OWNED_PATTERNS)


def remove_unlisted(url: str, manifest: Manifest, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """After ``manifest`` committed at ``url``: delete the files of ours it does not list (an earlier
    job's shards, index and rejects files, temporary names left by a crash). ``_work`` and anything
    not of ours are left alone. Returns the relative paths removed."""
    fs, root = open_fs(url, storage_options)
    listed = {shard.path for shard in manifest.shards} | set(manifest_extra_files(manifest))
    stale = []
    for path in fs.find(root):
        relative = posixpath.relpath(path, root)
        if relative != MANIFEST_NAME and not relative.startswith("_work/") and is_owned_file(relative) \
                and relative not in listed:
            stale.append(relative)
    for relative in stale:
        fs.rm_file(posixpath.join(root, relative))
    return stale


def manifest_extra_files(manifest: Manifest) -> list[str]:
    """The files besides shards that a manifest's ``extra`` names (signature index, rejects)."""
    index = manifest.extra.get("signature_index")
    files = list(index.get("files") or []) if isinstance(index, Mapping) else []
    if isinstance(manifest.extra.get("rejects"), str):
        files.append(manifest.extra["rejects"])
    return [name for name in files if isinstance(name, str)]


# -- reader ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class VerifyResult:
    path: str
    ok: bool
    detail: str


class Corpus:
    """A committed corpus: what its manifest lists, with on-demand checksum verification."""

    def __init__(self, url: str, manifest: Manifest, fs: fsspec.AbstractFileSystem, root: str) -> None:
        self.url = url
        self.manifest = manifest
        self.fs = fs
        self.root = root

    @classmethod
    def open(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> Corpus:
        fs, root = open_fs(url, storage_options)
        where = _manifest_location(url, fs, root)
        try:
            text = fs.cat_file(posixpath.join(root, MANIFEST_NAME)).decode("utf-8")
        except FileNotFoundError:
            raise CorpusError(f"{where}: no manifest; not a corpus, or its writer never committed") from None
        except UnicodeDecodeError:
            raise CorpusError(f"{where}: manifest is not UTF-8 text") from None
        corpus = cls(url, Manifest.from_json(text, where), fs, root)
        corpus._check_local_links()
        return corpus

    def member_path(self, relative: Any, what: str) -> str:
        """The full path of a file the manifest names (an index or rejects file in ``extra``), if it is
        inside the corpus folder; :class:`CorpusError` naming the manifest and the entry otherwise."""
        path = member_path(self.root, relative, self._where, what)
        if _is_local(self.fs):
            self._check_inside(path, what)
        return path

    @property
    def _where(self) -> str:
        return _manifest_location(self.url, self.fs, self.root)

    def _check_local_links(self) -> None:
        """On a local disk a listed name may still be a symbolic link to a file elsewhere: refuse it."""
        if _is_local(self.fs):
            for shard in self.shards:
                self._check_inside(self.shard_path(shard), "shard path")

    def _check_inside(self, path: str, what: str) -> None:
        real_root = os.path.realpath(self.root)
        if not os.path.realpath(path).startswith(real_root.rstrip(os.sep) + os.sep):
            raise CorpusError(f"{self._where}: {what} {posixpath.relpath(path, self.root)!r} resolves outside the "
                              "corpus folder (a symbolic link); a manifest may only name files inside its corpus folder")

    @property
    def shards(self) -> list[ShardInfo]:
        return self.manifest.shards

    @property
    def schema(self) -> pa.Schema:
        return self.manifest.schema

    @property
    def stats(self) -> dict[str, Any]:
        return self.manifest.stats

    @property
    def num_rows(self) -> int:
        return self.manifest.num_rows

    def shard_path(self, shard: ShardInfo) -> str:
        return posixpath.join(self.root, shard.path)

    def verify_shard(self, shard: ShardInfo) -> VerifyResult:
        """Re-read one shard and compare its size and checksum with the manifest."""
        path = self.shard_path(shard)
        try:
            size = self.fs.size(path)
            if size != shard.bytes:
                return VerifyResult(path, False, f"size {size} bytes, manifest says {shard.bytes}")
            actual = checksum_of(self.fs, path)
        except FileNotFoundError:
            return VerifyResult(path, False, "missing")
        if actual != shard.checksum:
            return VerifyResult(path, False, f"checksum {actual}, manifest says {shard.checksum}")
        return VerifyResult(path, True, "ok")

    def verify(self) -> list[VerifyResult]:
        return [self.verify_shard(s) for s in self.shards]

    def read_shard(self, shard: ShardInfo, columns: list[str] | None = None) -> pa.Table:
        with self.fs.open(self.shard_path(shard), "rb") as handle:
            # use_threads=False: threaded reads through a Python file object abort the process at exit
            # now and then (apache/arrow#34314); one shard at a time needs no threads.
            return pq.read_table(handle, columns=columns, use_threads=False)

    def iter_tables(self, columns: list[str] | None = None) -> Iterator[pa.Table]:
        """Every shard in manifest order, one table each."""
        for shard in self.shards:
            yield self.read_shard(shard, columns)

    def to_table(self, columns: list[str] | None = None) -> pa.Table:
        tables = list(self.iter_tables(columns))
        if not tables:
            return self.schema.empty_table() if columns is None else pa.schema(
                [self.schema.field(c) for c in columns]).empty_table()
        return pa.concat_tables(tables)
