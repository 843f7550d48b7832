"""The reader: a committed corpus, exactly what its manifest lists, with checksum verification on demand.

This module imports neither Ray nor aiohttp, so the loader and the commands can use it cheaply.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import xxhash

from gristmill.pipeline.format.manifest import (
    CHECKSUM_ALGORITHM,
    MANIFEST_NAME,
    MANIFEST_NAMES,
    BlocksMissing,
    CorpusError,
    Manifest,
    ShardInfo,
    manifest_location,
    member_path,
)
from gristmill.pipeline.format.storage import is_local, naming, open_fs


def checksum_of(fs: fsspec.AbstractFileSystem, path: str, chunk_bytes: int = 8 * 1024 * 1024) -> str:
    """Stream a file through xxh3-128 without holding it in memory."""
    digest = xxhash.xxh3_128()
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return f"{CHECKSUM_ALGORITHM}:{digest.hexdigest()}"


def _check_inside(root: str, path: str, where: str, what: str) -> None:
    """On a local disk, refuse a listed file that is a symbolic link to somewhere outside the corpus folder."""
    real_root = os.path.realpath(root)
    if not os.path.realpath(path).startswith(real_root.rstrip(os.sep) + os.sep):
        raise CorpusError(f"{where}: {what} {posixpath.relpath(path, root)!r} resolves outside the "
                          "corpus folder (a symbolic link); a manifest may only name files inside its corpus folder")


def _read_manifest(url: str, fs: fsspec.AbstractFileSystem, root: str) -> tuple[str, str]:
    """The manifest's text and how errors name it: ``_manifest.json``, else a format 1 or 2 corpus's
    ``manifest.json``. None there is an error that says how to make one."""
    for name in MANIFEST_NAMES:
        where = manifest_location(url, fs, root, name)
        try:
            # start=0: one GET. Without a range, s3fs asks the size first (a HEAD): a round trip
            # more for each of the two reads before a first batch (0.1 s each at 100 ms latency).
            with naming(where, "read", is_local(fs)):
                return fs.cat_file(posixpath.join(root, name), start=0).decode("utf-8"), where
        except (FileNotFoundError, NotADirectoryError):
            continue
        except UnicodeDecodeError:
            raise CorpusError(f"{where}: manifest is not UTF-8 text") from None
    folder = url.rstrip("/")
    if fs.isfile(root):
        raise CorpusError(f"{url}: a file, not a corpus folder; a corpus is a folder of Parquet files with a "
                          f"manifest. {how_to_make_one(posixpath.dirname(folder) or '.')}")
    raise CorpusError(f"{manifest_location(url, fs, root)}: no manifest, so not a corpus (or its writer never "
                      f"committed). {how_to_make_one(folder)}")


def how_to_make_one(folder: str) -> str:
    """The two ways to make a corpus of Parquet files, for errors about a folder without a manifest."""
    return (f"To stream Parquet files as they are, index them: `gristmill index {folder}` (writes a manifest, "
            f"rewrites nothing); or write a table with a text column as a corpus from Python: "
            f"`gristmill.pipeline.format.write_corpus(table, {folder!r})`")


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
        self.manifest_name = MANIFEST_NAME  # manifest.json for a corpus of format 1 or 2

    @classmethod
    def open(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> Corpus:
        fs, root = open_fs(url, storage_options)
        where = manifest_location(url, fs, root)

        def read_member(relative: str) -> bytes:
            path = member_path(root, relative, where, "block table path")
            if is_local(fs):
                _check_inside(root, path, where, "block table path")
            with naming(posixpath.join(posixpath.dirname(where), relative), "read", is_local(fs)):
                return fs.cat_file(path, start=0)

        for attempt in range(2):
            text, where = _read_manifest(url, fs, root)
            try:
                manifest = Manifest.from_json(text, where, read_member)
                break
            except BlocksMissing:
                if attempt:  # a commit in between removes the block table the old manifest named: read again
                    raise
        corpus = cls(url, manifest, fs, root)
        corpus.manifest_name = posixpath.basename(where)
        corpus._check_local_links()
        return corpus

    def member_path(self, relative: Any, what: str) -> str:
        """The full path of a file the manifest names (an index or rejects file in ``extra``), if it is
        inside the corpus folder; :class:`CorpusError` naming the manifest and the entry otherwise."""
        path = member_path(self.root, relative, self._where, what)
        if is_local(self.fs):
            self._check_inside(path, what)
        return path

    def read_members(self, names: Iterable[Any], schema: pa.Schema, what: str) -> pa.Table:
        """The Parquet files ``extra`` names (index files, statistics tables) as one table of ``schema``:
        each path checked by :meth:`member_path`, each unreadable file a :class:`CorpusError` naming it."""
        tables = []
        for name in names:
            path = self.member_path(name, what)
            try:
                with self.fs.open(path, "rb") as handle:
                    tables.append(pq.read_table(handle, schema=schema, page_checksum_verification=True))
            except (OSError, pa.ArrowException) as exc:
                raise CorpusError(f"{self.url}/{name}: cannot read {what} ({exc})") from None
        return pa.concat_tables(tables) if tables else schema.empty_table()

    @property
    def _where(self) -> str:
        return manifest_location(self.url, self.fs, self.root, self.manifest_name)

    def _check_local_links(self) -> None:
        """On a local disk a listed name may still be a symbolic link to a file elsewhere: refuse it.

        One listing of the folder finds the links among top-level names (resolving 40 k paths one by one
        took seconds); names in subfolders are resolved each.
        """
        if not is_local(self.fs):
            return
        try:
            links = {entry.name for entry in os.scandir(self.root) if entry.is_symlink()}
        except OSError:
            links = None
        for shard in self.shards:
            if links is None or "/" in shard.path or shard.path in links:
                self._check_inside(self.shard_path(shard), "shard path")

    def _check_inside(self, path: str, what: str) -> None:
        _check_inside(self.root, path, self._where, what)

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
        """One shard, each page checked against its CRC; a shard that fails is a CorpusError naming it."""
        path = self.shard_path(shard)
        try:
            with self.fs.open(path, "rb") as handle:
                # use_threads=False: threaded reads through a Python file object abort the process at exit
                # now and then (apache/arrow#34314); one shard at a time needs no threads.
                return pq.read_table(handle, columns=columns, use_threads=False, page_checksum_verification=True)
        except (OSError, pa.ArrowException) as exc:
            raise CorpusError(f"{path}: a shard cannot be read ({type(exc).__name__}: {exc})") from None

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
