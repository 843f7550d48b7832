"""Existing Parquet as a corpus: a manifest written over files as they are (``gristmill index``).

A folder of Parquet files from another tool (a Hugging Face dataset, datatrove or Spark output) has
everything a loader needs but the manifest: each file's footer gives its row groups' rows and byte
ranges. This module checks each file (a readable footer, a string text column, the same columns and
types as the others) and commits a manifest listing them, rewriting none. A file that fails a check
is named in the error and nothing is written. Files and folders whose names start with ``_`` or
``.`` are skipped, as Parquet readers skip them (Spark's ``_SUCCESS``, checksum files, a corpus's own
side folders).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.pipeline.format.blocks import RowGroups
from gristmill.pipeline.format.errors import CorpusError
from gristmill.pipeline.format.manifest import Manifest, ShardInfo, has_manifest, write_manifest
from gristmill.pipeline.format.reader import Corpus, checksum_of
from gristmill.pipeline.format.storage import open_fs
from gristmill.pipeline.format.writer import check_text_column, row_group_ranges

INDEXED_KIND = "indexed"  # ``extra.kind`` of a manifest written over existing files
FILES_AT_ONCE = 8  # files checked (footer read, checksummed) at a time: an object store's latency overlaps


def parquet_files(fs: fsspec.AbstractFileSystem, root: str) -> list[str]:
    """The ``*.parquet`` files under ``root`` (relative, sorted), leaving out any path with a part
    that starts with ``_`` or ``.``."""
    found = []
    for path in fs.find(root):
        relative = posixpath.relpath(path, root)
        if relative.endswith(".parquet") and not any(part.startswith(("_", ".")) for part in relative.split("/")):
            found.append(relative)
    return sorted(found)


def _shard(fs: fsspec.AbstractFileSystem, root: str, relative: str, shown: str) -> tuple[ShardInfo, pa.Schema]:
    """One file's manifest entry and schema, after reading its footer and checksumming its bytes."""
    path = posixpath.join(root, relative)
    try:
        with fs.open(path, "rb") as handle:
            metadata = pq.ParquetFile(handle).metadata
            schema = metadata.schema.to_arrow_schema()
        size = int(fs.size(path))
        checksum = checksum_of(fs, path)
    except (OSError, pa.ArrowException) as exc:
        raise CorpusError(f"{shown}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
    groups = row_group_ranges(metadata)
    data_end = max((g.offset + g.length for g in groups), default=4)
    if data_end > size or sum(g.rows for g in groups) != metadata.num_rows:
        raise CorpusError(f"{shown}: its footer does not describe the file (row groups end at byte {data_end} of "
                          f"{size}, or hold other than its {metadata.num_rows} rows)")
    check_text_column(schema, shown)
    info = ShardInfo(path=relative, rows=metadata.num_rows, bytes=size, checksum=checksum,
                     row_groups=RowGroups.of(groups), footer_offset=data_end, footer_length=size - data_end)
    return info, schema


def index_parquet(url: str, storage_options: Mapping[str, Any] | None = None, replace: bool = False) -> Manifest:
    """Commit a manifest over the Parquet files under ``url`` as they are; returns it.

    Every file must have a readable footer, a string ``text`` column and the first file's columns and
    types (CorpusError naming the file otherwise). A folder that is already a corpus is refused unless
    ``replace`` (an earlier index of the same folder is always replaced).
    """
    fs, root = open_fs(url, storage_options)
    if not fs.isdir(root):
        raise CorpusError(f"{url}: not a folder; index the folder that holds the Parquet files")
    if has_manifest(fs, root) and not replace:
        try:
            kind = Corpus.open(url, storage_options).manifest.extra.get("kind")
        except CorpusError:
            kind = None
        if kind != INDEXED_KIND:
            raise CorpusError(f"{url}: already holds a manifest that gristmill index did not write; "
                              "pass --replace to index its Parquet files instead")
    relatives = parquet_files(fs, root)
    if not relatives:
        raise CorpusError(f"{url}: no .parquet files (names starting with '_' or '.' are skipped)")
    base = url.rstrip("/")
    with ThreadPoolExecutor(FILES_AT_ONCE) as pool:
        entries = list(pool.map(lambda relative: _shard(fs, root, relative, f"{base}/{relative}"), relatives))
    first_schema = entries[0][1].remove_metadata()
    for (_, schema), relative in zip(entries, relatives, strict=True):
        if not schema.remove_metadata().equals(first_schema):
            raise CorpusError(f"{base}/{relative}: {_difference(schema, first_schema)} (the first file, "
                              f"{base}/{relatives[0]}, sets the schema); a corpus has one schema: index files of "
                              "another schema in a folder of their own")
    return write_manifest(url, [info for info, _ in entries], entries[0][1], storage_options=storage_options,
                          extra={"kind": INDEXED_KIND})


def _difference(schema: pa.Schema, expected: pa.Schema) -> str:
    """How ``schema`` differs from ``expected``, for the error: the first column that does."""
    for spec in expected:
        if spec.name not in schema.names:
            return f"no {spec.name!r} column"
        if not schema.field(spec.name).type.equals(spec.type):
            return f"column {spec.name!r} is {schema.field(spec.name).type}, not {spec.type}"
    more = [name for name in schema.names if name not in expected.names]
    return f"a column {more[0]!r} more" if more else "its columns in another order"
