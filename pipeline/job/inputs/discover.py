"""Which files the INPUT arguments name: files, globs, folders and corpus folders, expanded into one
sorted, unique list of :class:`InputFile` s (a corpus contributes the shards its manifest lists)."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import fsspec

from gristmill.pipeline.format import MANIFEST_NAMES, Corpus, CorpusError, has_manifest
from gristmill.pipeline.format.storage import is_local
from gristmill.pipeline.job.inputs.records import InputError, InputFile, printable

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
# The listing fields that change when a file's content is rewritten: ETag and version id on S3,
# generation on GCS, modification time where a store lists one, creation time on memory:// (a local
# disk is asked for its nanosecond mtime and inode instead). The size alone let a same-length rewrite
# return the old corpus.
IDENTITY_FIELDS = ("mtime", "ino", "ETag", "VersionId", "generation", "etag")
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}


def classify(path: str) -> tuple[str, str | None] | None:
    """Map a file name to (kind, compression); None for files that are not inputs."""
    name = path.lower()
    compression = None
    for suffix, codec in COMPRESSIONS.items():
        if name.endswith(suffix):
            compression, name = codec, name[: -len(suffix)]
            break
    if name.endswith(".parquet"):
        return ("parquet", None) if compression is None else None
    if name.endswith(".warc"):
        return "warc", compression
    if name.endswith(JSONL_SUFFIXES):
        return "jsonl", compression
    return None


def _protocol_prefix(url: str) -> str:
    scheme = urlsplit(url).scheme
    return f"{scheme}://" if scheme and len(scheme) > 1 else ""


def resolve_inputs(inputs: Sequence[str], storage_options: Mapping[str, Any] | None = None) -> list[InputFile]:
    """Expand INPUT arguments (files, globs, folders, corpus folders) into a sorted, unique file list."""
    found: dict[str, InputFile] = {}
    for spec in inputs:
        fs, _ = fsspec.core.url_to_fs(spec, **dict(storage_options or {}))
        prefix = _protocol_prefix(spec)
        paths = _expand(fs, spec, storage_options)
        if not paths:
            raise InputError(f"{spec}: matches no Parquet, JSONL or WARC file")
        for path, size, rows, version in paths:
            kind = classify(path)
            if kind is None:
                continue
            url = prefix + path if prefix and not path.startswith(prefix) else path
            found.setdefault(url, InputFile(url, kind[0], kind[1], size, printable(spec), rows, version))
    return [found[url] for url in sorted(found)]


def content_identity(fs: fsspec.AbstractFileSystem, path: str, info: Mapping[str, Any]) -> str:
    """A file's version as its listing shows it (``IDENTITY_FIELDS``), for the job's fingerprint; on a
    local disk the modification time in nanoseconds (the listing's float seconds lose the last digits)."""
    if is_local(fs):
        stat = os.stat(path)
        return f"mtime_ns={stat.st_mtime_ns};ino={stat.st_ino}"
    fields = IDENTITY_FIELDS if "mtime" in info else (*IDENTITY_FIELDS, "created")
    return ";".join(f"{name}={info[name]}" for name in fields if info.get(name) not in (None, ""))


Found = tuple[str, int, int | None, str]  # (path, size, the rows a manifest lists, content identity)


def _expand(fs: fsspec.AbstractFileSystem, spec: str, storage_options: Mapping[str, Any] | None) -> list[Found]:
    """(path, size, manifest rows, identity) of every candidate file an INPUT names; a corpus folder yields
    its manifest's shards with their row counts (a shard that is gone still counts its rows) and checksums."""
    _, path = fsspec.core.url_to_fs(spec, **dict(storage_options or {}))
    if fs.isdir(path):
        if has_manifest(fs, path):
            return _corpus_shards(fs, path, storage_options)
        found = {p: info for p, info in fs.find(path, detail=True).items()
                 if classify(p) is not None or posixpath.basename(p) in MANIFEST_NAMES}
        return _outside_corpora(fs, path, found, storage_options, walked=True)
    if any(ch in path for ch in "*?["):
        found = {p: info for p, info in fs.glob(path, detail=True).items() if info.get("type") != "directory"}
        prefix = path[: min(path.index(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
        return _outside_corpora(fs, prefix, found, storage_options, walked=False)
    if fs.exists(path):
        if classify(path) is None:
            raise InputError(f"{spec}: not a Parquet, JSONL (.jsonl/.gz/.zst) or WARC (.warc/.warc.gz) file")
        info = fs.info(path)
        return [(path, int(info.get("size") or 0), None, content_identity(fs, path, info))]
    return []


def _corpus_shards(fs: fsspec.AbstractFileSystem, folder: str,
                   storage_options: Mapping[str, Any] | None) -> list[Found]:
    """The shards a corpus folder's manifest lists, with their rows (a shard that is gone still counts)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    url = folder if protocol in ("file", "local") else f"{protocol}://{folder}"
    try:
        corpus = Corpus.open(url, storage_options)
    except CorpusError as exc:
        raise InputError(str(exc)) from None
    return [(corpus.shard_path(s), s.bytes, s.rows, s.checksum) for s in corpus.shards]


def _outside_corpora(fs: fsspec.AbstractFileSystem, top: str, found: Mapping[str, Mapping[str, Any]],
                     storage_options: Mapping[str, Any] | None, walked: bool) -> list[Found]:
    """Files a folder walk or a glob found, never a corpus's own files: a corpus folder among them
    (one holding a manifest) contributes the shards its manifest lists, not its index, rejects, work or
    unlisted files. A walk takes every listed shard of a corpus it finds; a glob keeps only the listed
    shards it matched."""
    holds_manifest: dict[str, bool] = {}

    def corpus_folder(file: str) -> str | None:
        folder = posixpath.dirname(file)
        while folder.startswith(top) and folder != posixpath.dirname(folder):
            if folder not in holds_manifest:
                holds_manifest[folder] = has_manifest(fs, folder)
            if holds_manifest[folder]:
                return folder
            folder = posixpath.dirname(folder)
        return None

    result: list[Found] = []
    listed: dict[str, dict[str, tuple[int, int | None, str]]] = {}
    for file, info in sorted(found.items()):
        folder = corpus_folder(file)
        if folder is None:
            if posixpath.basename(file) not in MANIFEST_NAMES:
                result.append((file, int(info.get("size") or 0), None, content_identity(fs, file, info)))
            continue
        if folder not in listed:
            shards = _corpus_shards(fs, folder, storage_options)
            listed[folder] = {path: (size, rows, checksum) for path, size, rows, checksum in shards}
            if walked:
                result.extend(shards)
        if not walked and file in listed[folder]:
            result.append((file, *listed[folder][file]))
    return result


