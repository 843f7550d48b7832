"""The manifest: the commit point of a corpus, and every rule about the paths it names.

A corpus is a folder (any fsspec URL) of Parquet shards plus one ``manifest.json``. Shards are
written first under unique names; the manifest is written last, atomically, and is the commit
point: readers only ever read what a manifest lists. A manifest is untrusted input, so every path it
names is checked here (:func:`member_path`) before anyone follows it. See docs/FORMAT.md.
"""

from __future__ import annotations

import base64
import datetime as _dt
import fnmatch
import json
import os
import posixpath
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
import pyarrow as pa

from pipeline.format.storage import is_local, open_fs

FORMAT_NAME = "gristmill-corpus"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
CHECKSUM_ALGORITHM = "xxh3_128"
JOB_FINGERPRINT_KEY = "job_fingerprint"  # in a manifest's ``extra``: which job wrote the corpus
STATS_TABLE_KEY = "stats_table"  # in a manifest's ``extra``: {"files": [...]}, the statistics table


class CorpusError(Exception):
    """A corpus cannot be read or written as asked; the message names the file."""


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
    if is_local(fs):
        temporary = f"{target}.tmp-{uuid.uuid4().hex}"
        with open(temporary, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, target)
    else:
        fs.pipe_file(target, payload)
    return manifest

def manifest_location(url: str, fs: fsspec.AbstractFileSystem, root: str) -> str:
    """How errors name a corpus's manifest: the local path, or the URL as the user gave it."""
    return posixpath.join(root, MANIFEST_NAME) if is_local(fs) else f"{url.rstrip('/')}/{MANIFEST_NAME}"


# Files a gristmill writer puts in a corpus folder (fnmatch patterns, relative to the folder): what a
# job may treat as its own when it checks a folder before writing and cleans up after committing.
OWNED_PATTERNS = ("manifest.json", "manifest.json.tmp-*", "*.parquet.tmp-*", "part-*.parquet", "removed-*.parquet",
                  "_index/index-*.parquet", "_index/bands-*.parquet", "_index/*.tmp-*", "_rejects/rejects-*.parquet",
                  "_rejects/*.tmp-*", "_stats/stats-*.parquet", "_stats/*.tmp-*", "_work/*")


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
    """The files besides shards that a manifest's ``extra`` names (signature index and its band files,
    rejects, statistics table)."""
    files: list[Any] = []
    for key, lists in (("signature_index", ("files", "band_files")), (STATS_TABLE_KEY, ("files",))):
        entry = manifest.extra.get(key)
        if isinstance(entry, Mapping):
            for name in lists:
                listed = entry.get(name)
                files += listed if isinstance(listed, list) else []
    if isinstance(manifest.extra.get("rejects"), str):
        files.append(manifest.extra["rejects"])
    return [name for name in files if isinstance(name, str)]
