"""Which files the INPUT arguments name: files, globs, folders and corpus folders, expanded into one
sorted, unique list of :class:`InputFile` s (a corpus contributes the shards its manifest lists)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import fsspec

from pipeline.format import MANIFEST_NAMES, Corpus, CorpusError, has_manifest
from pipeline.job.inputs.records import InputError, InputFile, printable

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
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
        for path, size, rows in paths:
            kind = classify(path)
            if kind is None:
                continue
            url = prefix + path if prefix and not path.startswith(prefix) else path
            found.setdefault(url, InputFile(url, kind[0], kind[1], size, printable(spec), rows))
    return [found[url] for url in sorted(found)]


def _expand(fs: fsspec.AbstractFileSystem, spec: str,
            storage_options: Mapping[str, Any] | None) -> list[tuple[str, int, int | None]]:
    """(path, size, manifest rows) of every candidate file an INPUT names; a corpus folder yields its
    manifest's shards with their row counts, so a shard that is gone still counts its rows."""
    _, path = fsspec.core.url_to_fs(spec, **dict(storage_options or {}))
    if fs.isdir(path):
        if has_manifest(fs, path):
            return _corpus_shards(fs, path, storage_options)
        found = {p: int(info.get("size") or 0) for p, info in fs.find(path, detail=True).items()
                 if classify(p) is not None or posixpath.basename(p) in MANIFEST_NAMES}
        return _outside_corpora(fs, path, found, storage_options, walked=True)
    if any(ch in path for ch in "*?["):
        found = {p: int(info.get("size") or 0) for p, info in fs.glob(path, detail=True).items()
                 if info.get("type") != "directory"}
        prefix = path[: min(path.index(ch) for ch in "*?[" if ch in path)].rsplit("/", 1)[0]
        return _outside_corpora(fs, prefix, found, storage_options, walked=False)
    if fs.exists(path):
        if classify(path) is None:
            raise InputError(f"{spec}: not a Parquet, JSONL (.jsonl/.gz/.zst) or WARC (.warc/.warc.gz) file")
        return [(path, int(fs.size(path) or 0), None)]
    return []


def _corpus_shards(fs: fsspec.AbstractFileSystem, folder: str,
                   storage_options: Mapping[str, Any] | None) -> list[tuple[str, int, int | None]]:
    """The shards a corpus folder's manifest lists, with their rows (a shard that is gone still counts)."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    url = folder if protocol in ("file", "local") else f"{protocol}://{folder}"
    try:
        corpus = Corpus.open(url, storage_options)
    except CorpusError as exc:
        raise InputError(str(exc)) from None
    return [(corpus.shard_path(s), s.bytes, s.rows) for s in corpus.shards]


def _outside_corpora(fs: fsspec.AbstractFileSystem, top: str, found: Mapping[str, int],
                     storage_options: Mapping[str, Any] | None,
                     walked: bool) -> list[tuple[str, int, int | None]]:
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

    result: list[tuple[str, int, int | None]] = []
    listed: dict[str, dict[str, tuple[int, int | None]]] = {}
    for file, size in sorted(found.items()):
        folder = corpus_folder(file)
        if folder is None:
            if posixpath.basename(file) not in MANIFEST_NAMES:
                result.append((file, size, None))
            continue
        if folder not in listed:
            shards = _corpus_shards(fs, folder, storage_options)
            listed[folder] = {path: (size, rows) for path, size, rows in shards}
            if walked:
                result.extend(shards)
        if not walked and file in listed[folder]:
            result.append((file, *listed[folder][file]))
    return result


