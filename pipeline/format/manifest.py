"""The manifest: the commit point of a corpus, and every rule about the paths it names.

A corpus is a folder (any fsspec URL) of Parquet shards plus one ``_manifest.json``. Shards are
written first under unique names; the manifest is written last, atomically, and is the commit
point: readers only ever read what a manifest lists. A manifest is untrusted input, so every path it
names is checked here (:func:`member_path`) before anyone follows it. See docs/FORMAT.md.
"""

from __future__ import annotations

import base64
import datetime as _dt
import fnmatch
import json
import math
import posixpath
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import xxhash

from gristmill.pipeline.format.blocks import BLOCKS_FOLDER, INT64_MAX, BlockTable, RowGroups, check_blocks
from gristmill.pipeline.format.errors import CorpusError
from gristmill.pipeline.format.storage import is_local, naming, open_fs, write_whole

FORMAT_NAME = "gristmill-corpus"
# Version 2 moved the row groups out of manifest.json into the block table sidecar (pipeline/format/blocks.py);
# version 3 renamed gristmill's ``source`` column ``gristmill_source`` and lets the input's own columns
# follow gristmill's (pipeline/format/schemas.py). Versions 1 and 2 are still read.
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
# A block table this small (about 37 k row groups, 150 GB of 4 MB blocks) also travels inside the manifest
# as base64: a reader then needs one read before its first block instead of two (0.1 s at 100 ms).
INLINE_BLOCKS_BYTES = 256 * 1024
# Format 3 names the manifest with a leading "_", which Parquet readers (pyarrow and pandas datasets,
# Spark, DuckDB globs of *.parquet) skip: the folder reads as a plain Parquet dataset. Corpora of
# formats 1 and 2 keep ``manifest.json``, which every reader here still reads.
MANIFEST_NAME = "_manifest.json"
LEGACY_MANIFEST_NAME = "manifest.json"
MANIFEST_NAMES = (MANIFEST_NAME, LEGACY_MANIFEST_NAME)  # the order a reader looks for them
CHECKSUM_ALGORITHM = "xxh3_128"
JOB_FINGERPRINT_KEY = "job_fingerprint"  # in a manifest's ``extra``: which job wrote the corpus
STATS_TABLE_KEY = "stats_table"  # in a manifest's ``extra``: {"files": [...]}, the statistics table
PAIRS_KEY = "pairs"  # in a manifest's ``extra``: {"files": [...], ...}, the candidate pairs table (pairs_table.py)
SPANS_CUT_KEY = "spans_cut"  # in a removed corpus's ``extra``: {"files": [...]}, the spans --spans cut


@dataclass(frozen=True)
class ShardInfo:
    """What the manifest records for one shard; ``path`` is relative to the corpus folder."""

    path: str
    rows: int
    bytes: int
    checksum: str
    row_groups: RowGroups
    footer_offset: int
    footer_length: int

    def to_dict(self, row_groups: bool = True) -> dict[str, Any]:
        """As JSON: with the row groups inline (how writers hand shards to a committer), or without
        (a version 2 manifest's entry, the row groups being in the block table)."""
        out: dict[str, Any] = {"path": self.path, "rows": self.rows, "bytes": self.bytes, "checksum": self.checksum}
        if row_groups:
            out["row_groups"] = [{"rows": g.rows, "offset": g.offset, "length": g.length} for g in self.row_groups]
        return {**out, "footer_offset": self.footer_offset, "footer_length": self.footer_length}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], row_groups: RowGroups | None = None) -> ShardInfo:
        """From :meth:`to_dict`'s form; ``row_groups`` given when they come from a block table instead."""
        return cls(
            path=str(data["path"]),
            rows=int(data["rows"]),
            bytes=int(data["bytes"]),
            checksum=str(data["checksum"]),
            row_groups=RowGroups.of(data["row_groups"]) if row_groups is None else row_groups,
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


_FORBIDDEN_CHARACTERS = re.compile(r"[\x00-\x1f\x7f\\:]")


def _unsafe_member(relative: Any) -> str | None:
    """Why ``relative`` may not be used as a path inside a corpus folder, or None when it may."""
    if not isinstance(relative, str) or not relative:
        return "is not a non-empty string"
    if _FORBIDDEN_CHARACTERS.search(relative):
        return "holds a control character, a backslash or a colon (a scheme or drive)"
    if relative.startswith("/"):
        return "is absolute"
    parts = relative.split("/")
    if ".." in parts:
        return "climbs out of its folder (..)"
    if any(part in ("", ".") for part in parts):
        return "is not a normalised relative path"
    return None


@dataclass
class Manifest:
    """The parsed manifest: every shard, the schema, and the run's statistics."""

    shards: list[ShardInfo]
    schema: pa.Schema
    stats: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    created: str = ""
    format_version: int = FORMAT_VERSION
    blocks_file: dict[str, Any] = field(default_factory=dict)  # the block table's path, bytes, checksum, count

    @cached_property
    def blocks(self) -> BlockTable:
        """Every row group of the corpus as flat arrays (the block table the shards' row groups are views of)."""
        return BlockTable.of(self.shards)

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
                "blocks": self.blocks_file,
                "shards": [s.to_dict(row_groups=False) for s in self.shards],
                "stats": self.stats,
                "extra": self.extra,
            },
            indent=1,
            sort_keys=False,
        )

    @classmethod
    def from_json(cls, text: str, where: str, read_member: Callable[[str], bytes] | None = None) -> Manifest:
        """Parse and check a manifest; ``read_member(relative path)`` reads its block table (version 2)."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{where}: manifest is not valid JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise CorpusError(f"{where}: not a gristmill corpus manifest (no \"format\": \"{FORMAT_NAME}\")")
        version = data.get("format_version")
        if version not in READABLE_VERSIONS:
            raise CorpusError(
                f"{where}: manifest format version {version!r} is not supported by this gristmill "
                f"(it reads versions {', '.join(map(str, READABLE_VERSIONS))}); upgrade gristmill or rewrite the corpus"
            )
        blocks_file: dict[str, Any] = {}
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(data["schema"]["arrow"])))
            entries = data["shards"]
            if version == 1:  # versions 2 and 3 share the manifest's layout
                shards = [ShardInfo.from_dict(s) for s in entries]
                table = BlockTable.of(shards)
            else:
                blocks_file = _blocks_entry(data["blocks"], where)
                if read_member is None:
                    raise CorpusError(f"{where}: a version 2 manifest needs its block table read with it")
                table = _read_blocks(blocks_file, len(entries), read_member, where)
                bounds = table.shard_bounds(len(entries)).tolist()
                shards = [ShardInfo.from_dict(s, RowGroups(table, bounds[i], bounds[i + 1]))
                          for i, s in enumerate(entries)]
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError, pa.ArrowInvalid) as exc:
            raise CorpusError(f"{where}: manifest is malformed ({type(exc).__name__}: {exc})") from None
        _check_shards(shards, where)
        numbers = [(s.rows, s.footer_offset) for s in shards]
        check_blocks(table, *np.asarray(numbers, dtype=np.int64).reshape(-1, 2).T,
                     posixpath.join(posixpath.dirname(where), blocks_file.get("path", "")) if blocks_file else where)
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
            blocks_file=blocks_file,
        )


def _check_shards(shards: list[ShardInfo], where: str) -> None:
    """Refuse shard entries a reader could be misled by: paths leaving the folder, impossible numbers.
    Their row groups are checked as one table by :func:`check_blocks`."""
    seen: set[str] = set()
    for shard in shards:
        member_path("", shard.path, where, "shard path")
        if shard.path in seen:
            raise CorpusError(f"{where}: shard {shard.path!r} is listed twice")
        seen.add(shard.path)
        numbers = [shard.rows, shard.bytes, shard.footer_offset, shard.footer_length]
        if min(numbers) < 0 or max(numbers) > INT64_MAX or shard.footer_offset + shard.footer_length != shard.bytes:
            raise CorpusError(f"{where}: shard {shard.path!r} has inconsistent sizes (negative numbers, or a footer "
                              "that does not end the file)")


class BlocksMissing(CorpusError):
    """The block table a manifest names is gone: a newer commit replaced both (read the manifest again)."""


def _blocks_entry(entry: Any, where: str) -> dict[str, Any]:
    """The manifest's ``blocks`` entry, checked: a contained path, a size, a checksum and a block count,
    and the table itself as base64 (``inline``) when it is small (see ``INLINE_BLOCKS_BYTES``)."""
    if not isinstance(entry, Mapping):
        raise CorpusError(f"{where}: manifest is malformed ('blocks' is not an object)")
    member_path("", entry.get("path"), where, "block table path")
    out = {"path": entry["path"], "bytes": int(entry["bytes"]), "checksum": str(entry["checksum"]),
           "count": int(entry["count"])}
    if not 0 <= out["bytes"] <= INT64_MAX or not 0 <= out["count"] <= INT64_MAX:
        raise CorpusError(f"{where}: manifest is malformed ('blocks' has impossible sizes)")
    if "inline" in entry:
        inline = entry["inline"]
        if not isinstance(inline, str) or len(inline) != 4 * math.ceil(out["bytes"] / 3):
            raise CorpusError(f"{where}: manifest is malformed ('blocks.inline' is not the base64 of "
                              f"{out['bytes']} bytes)")
        out["inline"] = inline
    return out


def _read_blocks(entry: Mapping[str, Any], shards: int, read_member: Callable[[str], bytes],
                 where: str) -> BlockTable:
    """The block table a manifest names, checked to be that table: size, checksum, block count.

    A table carried inline is used as it is (no read: one round trip less before a first batch); the
    file it copies stays for readers of format 2 from before inline tables, which ignore the key.
    """
    if "inline" in entry:
        location = f"{where} ('blocks.inline')"
        data = base64.b64decode(entry["inline"], validate=True)
    else:
        location = posixpath.join(posixpath.dirname(where), entry["path"])
        try:
            data = read_member(entry["path"])
        except FileNotFoundError:
            raise BlocksMissing(f"{location}: block table named by the manifest is missing") from None
    if len(data) != entry["bytes"] or checksum_bytes(data) != entry["checksum"]:
        raise CorpusError(f"{location}: block table is {len(data)} bytes with checksum {checksum_bytes(data)}, the "
                          f"manifest says {entry['bytes']} bytes, {entry['checksum']}; it was replaced or is damaged")
    table = BlockTable.from_parquet(data, location)
    if len(table) != entry["count"]:
        raise CorpusError(f"{location}: block table has {len(table)} row groups, the manifest says {entry['count']}")
    return table


def checksum_bytes(data: bytes) -> str:
    """The format's checksum of bytes in memory (shards are checksummed while written, see the writer)."""
    return f"{CHECKSUM_ALGORITHM}:{xxhash.xxh3_128_hexdigest(data)}"


def write_blocks(fs: fsspec.AbstractFileSystem, root: str, table: BlockTable) -> dict[str, Any]:
    """Write a block table under a name unique to this commit; returns the manifest's ``blocks`` entry.

    A unique name plus the checksum in the manifest mean a crash can never pair a new manifest with an
    old block table, nor an old manifest with a new one.
    """
    payload = table.to_parquet()
    relative = posixpath.join(BLOCKS_FOLDER, f"blocks-{uuid.uuid4().hex}.parquet")
    fs.makedirs(posixpath.join(root, BLOCKS_FOLDER), exist_ok=True)
    fs.pipe_file(posixpath.join(root, relative), payload)
    entry = {"path": relative, "bytes": len(payload), "checksum": checksum_bytes(payload), "count": len(table)}
    if len(payload) <= INLINE_BLOCKS_BYTES:
        entry["inline"] = base64.b64encode(payload).decode("ascii")
    return entry


def write_manifest(
    url: str,
    shards: Iterable[ShardInfo],
    schema: pa.Schema,
    *,
    stats: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Manifest:
    """Publish a corpus: the block table first, then the manifest, which appears whole or not at all.

    Local disks get write-to-temp plus ``os.replace``; object stores (s3, gcs, memory) make a single
    PUT visible atomically, so there the manifest is written in one call. Block tables of earlier
    commits are removed afterwards (a reader that loses that race reads the new manifest, see the reader).
    """
    manifest = Manifest(
        shards=list(shards),
        schema=schema,
        stats=dict(stats or {}),
        extra=dict(extra or {}),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    fs, root = open_fs(url, storage_options)
    where = manifest_location(url, fs, root)
    with naming(posixpath.join(posixpath.dirname(where), BLOCKS_FOLDER), "write", is_local(fs)):
        manifest.blocks_file = write_blocks(fs, root, manifest.blocks)
    payload = manifest.to_json().encode("utf-8")
    with naming(where, "write", is_local(fs)):
        write_whole(fs, posixpath.join(root, MANIFEST_NAME), payload)
    try:  # a format 1 or 2 manifest of an earlier commit here: it lists shards cleanup may delete
        fs.rm_file(posixpath.join(root, LEGACY_MANIFEST_NAME))
    except FileNotFoundError:
        pass
    _remove_old_blocks(fs, root, manifest.blocks_file["path"])
    return manifest


def has_manifest(fs: fsspec.AbstractFileSystem, root: str) -> bool:
    """Whether a folder holds a manifest (of any format version)."""
    return any(fs.exists(posixpath.join(root, name)) for name in MANIFEST_NAMES)


def _remove_old_blocks(fs: fsspec.AbstractFileSystem, root: str, current: str) -> None:
    """Delete the block tables of earlier commits (a crawl commits every few thousand documents)."""
    folder = posixpath.join(root, BLOCKS_FOLDER)
    for path in fs.find(folder):
        relative = posixpath.relpath(path, root)
        if relative != current and fnmatch.fnmatchcase(relative, f"{BLOCKS_FOLDER}/blocks-*.parquet"):
            try:
                fs.rm_file(path)
            except FileNotFoundError:
                pass

def manifest_location(url: str, fs: fsspec.AbstractFileSystem, root: str, name: str = MANIFEST_NAME) -> str:
    """How errors name a corpus's manifest: the local path, or the URL as the user gave it."""
    return posixpath.join(root, name) if is_local(fs) else f"{url.rstrip('/')}/{name}"


# Files a gristmill writer puts in a corpus folder (fnmatch patterns, relative to the folder): what a
# job may treat as its own when it checks a folder before writing and cleans up after committing.
OWNED_PATTERNS = ("_manifest.json", "_manifest.json.tmp-*", "manifest.json", "manifest.json.tmp-*", "*.parquet.tmp-*", "part-*.parquet", "removed-*.parquet",
                  "_index/index-*.parquet", "_index/bands-*.parquet", "_index/*.tmp-*", "_rejects/rejects-*.parquet",
                  "_rejects/*.tmp-*", "_stats/stats-*.parquet", "_stats/*.tmp-*", "_blocks/blocks-*.parquet", "_work/*",
                  "_pairs/pairs-*.parquet", "_pairs/*.tmp-*", "_spans/cut-*.parquet", "_spans/index-*.parquet", "_spans/*.tmp-*", "_lease.json", "_lease.json.tmp-*", "_retired.json",
                  "_retired.json.tmp-*")


def is_owned_file(relative: str) -> bool:
    """True for a path (relative to a corpus folder) of a kind gristmill writers create there."""
    return any(fnmatch.fnmatchcase(relative, pattern) for pattern in OWNED_PATTERNS)


def manifest_extra_files(manifest: Manifest) -> list[str]:
    """The files besides shards that a manifest's ``extra`` names (signature index and its band files,
    rejects, statistics table, candidate pairs table, spans cut, span index)."""
    files: list[Any] = []
    for key, lists in (("signature_index", ("files", "band_files")), (STATS_TABLE_KEY, ("files",)),
                       (PAIRS_KEY, ("files",)), (SPANS_CUT_KEY, ("files",)), ("span_index", ("files",))):
        entry = manifest.extra.get(key)
        if isinstance(entry, Mapping):
            for name in lists:
                listed = entry.get(name)
                files += listed if isinstance(listed, list) else []
    if isinstance(manifest.extra.get("rejects"), str):
        files.append(manifest.extra["rejects"])
    return [name for name in files if isinstance(name, str)]
