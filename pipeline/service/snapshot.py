"""Snapshots of the live index in the service's state folder, and the folder's layout.

```
STATE/lock                  held (flock) by the one process using the folder
STATE/rows.u64              one row per document: content hash, length, signature (memory-mapped)
STATE/snapshot.G/           the index as of generation G: meta.json, bands.keys, bands.docs,
                            exact.keys, exact.docs, ids.arrow
STATE/inserts.G.log         sealed insert logs: what generation G added after snapshot G-1
STATE/inserts.log           the active insert log
```

A snapshot is written into ``snapshot.G.tmp`` (every file fsynced, ``meta.json`` last with the
xxh3-64 digest and length of every file and of every segment of ``rows.u64`` it covers), then renamed
to ``snapshot.G`` and the folder fsynced: the rename is the commit. Only then do older snapshots and
sealed logs up to G go. A restart loads the highest ``snapshot.G`` and replays the sealed logs after
G, then the active log; a crash at any step leaves either the old snapshot with every log after it,
or the new one. Everything read back is checked (sizes, digests, document numbers, sort order)
before it is used, and a bad file is a :class:`StateError` naming it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import xxhash

from gristmill.pipeline.format.signature_index import IndexParams, params_to_dict
from gristmill.pipeline.service.columns import BUCKET_SHIFT, BUCKETS, IdColumn, KeyTable, RowStore, Run
from gristmill.pipeline.service.index import LiveIndex

SNAPSHOT_FORMAT = 1
ROWS_NAME = "rows.u64"
LOG_NAME = "inserts.log"
NEXT_SUFFIX = ".next"  # the next active log, made before a rotation (and made anew by the next one)
META_NAME = "meta.json"
MAX_META_BYTES = 64 * 1024 * 1024
READ_CHUNK = 16 * 1024 * 1024
_SNAPSHOT = re.compile(r"snapshot\.(\d{1,18})")
_SEALED = re.compile(r"inserts\.(\d{1,18})\.log")
TABLES = ("bands", "exact")


class StateError(Exception):
    """The state folder cannot be used as found; the message names the file."""


def lock_state(folder: str) -> BinaryIO:
    """Create ``folder`` if needed and hold its lock for as long as the returned file stays open.

    The lock (``flock``, released by the kernel when the process dies) keeps a second server or an
    ``--export`` from reading, or cutting, a log or snapshot that a live server is writing.
    """
    os.makedirs(folder, exist_ok=True)
    handle = open(os.path.join(folder, "lock"), "a+b")  # noqa: SIM115 - held for the service's life
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise StateError(f"{folder}: in use by another gristmill serve; stop it first") from None
    return handle


def fsync_dir(folder: str) -> None:
    """Make a new or renamed entry of ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def snapshots(folder: str) -> list[int]:
    """Generations of the committed snapshots, oldest first (``.tmp`` folders are not committed)."""
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := _SNAPSHOT.fullmatch(name)))


def sealed_logs(folder: str) -> list[int]:
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := _SEALED.fullmatch(name)))


def sealed_log_path(folder: str, generation: int) -> str:
    return os.path.join(folder, f"inserts.{generation}.log")


def snapshot_path(folder: str, generation: int) -> str:
    return os.path.join(folder, f"snapshot.{generation}")


def remove_uncommitted(folder: str) -> None:
    """Snapshots a crash left half-written: never committed, so nothing refers to them."""
    for name in os.listdir(folder):
        if name.startswith("snapshot.") and name.endswith(".tmp"):
            shutil.rmtree(os.path.join(folder, name))


def remove_before(folder: str, generation: int) -> None:
    """What snapshot ``generation`` makes redundant: older snapshots and the sealed logs it covers."""
    for old in snapshots(folder):
        if old < generation:
            shutil.rmtree(snapshot_path(folder, old))
    for old in sealed_logs(folder):
        if old <= generation:
            os.remove(sealed_log_path(folder, old))


@dataclass(frozen=True)
class SnapshotView:
    """What a snapshot holds, taken on the event loop at a log rotation; the pieces are immutable."""

    generation: int
    documents: int
    base_documents: int
    base: str | None
    params: IndexParams
    ids: list[pa.Array]
    rows: RowStore
    rows_segments: list[list[Any]]  # [end, digest] of every rows segment an earlier snapshot checked


class _HashingFile:
    """A file being written that keeps the xxh3-64 digest and length of what went in."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.handle = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.digest = xxhash.xxh3_64()
        self.size = 0

    closed = False  # what pyarrow's writers ask of a Python file

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.handle.write(view)
        self.size += len(view)
        return len(view)

    def close(self) -> dict[str, Any]:
        self.handle.flush()
        os.fsync(self.handle.fileno())
        self.handle.close()
        return {"bytes": self.size, "xxh3": self.digest.hexdigest()}


def rows_digest(rows: RowStore, start: int, stop: int) -> str:
    digest = xxhash.xxh3_64()
    step = max(1, READ_CHUNK // rows.row_bytes)
    matrix = rows.rows
    for lo in range(start, stop, step):
        digest.update(np.ascontiguousarray(matrix[lo : min(stop, lo + step)]))
    return digest.hexdigest()


def write_snapshot(folder: str, view: SnapshotView, bands: KeyTable, exact: KeyTable) -> list[list[Any]]:
    """Write and commit snapshot ``view.generation``; returns its rows segments (for the next one)."""
    view.rows.flush()
    segments = list(view.rows_segments)
    covered = segments[-1][0] if segments else 0
    if view.documents > covered:
        segments.append([view.documents, rows_digest(view.rows, covered, view.documents)])
    final = snapshot_path(folder, view.generation)
    tmp = final + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        _write_pieces(tmp, view, bands, exact, segments)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a full disk: give the space back, the old snapshot stands
        raise
    os.rename(tmp, final)
    fsync_dir(folder)
    return segments


def _write_pieces(tmp: str, view: SnapshotView, bands: KeyTable, exact: KeyTable, segments: list[list[Any]]) -> None:
    """Every file of a snapshot into ``tmp``, fsynced, ``meta.json`` last."""
    files: dict[str, Any] = {}
    pieces: dict[str, list[int]] = {}
    for name, table in zip(TABLES, (bands, exact), strict=True):
        runs = table.pieces()
        pieces[name] = [len(_upto(r, view.documents)) for r in runs]
        for part, dtype in (("keys", np.uint64), ("docs", np.uint32)):
            out = _HashingFile(os.path.join(tmp, f"{name}.{part}"))
            for run in runs:
                out.write(np.ascontiguousarray(getattr(_upto(run, view.documents), part), dtype))
            files[f"{name}.{part}"] = out.close()
    out = _HashingFile(os.path.join(tmp, "ids.arrow"))
    with pa.ipc.new_file(pa.PythonFile(out, mode="w"), pa.schema([("id", pa.string())])) as writer:
        for chunk in view.ids:
            writer.write_batch(pa.record_batch([chunk], names=["id"]))
    files["ids.arrow"] = out.close()
    meta = {"format": SNAPSHOT_FORMAT, "generation": view.generation, "documents": view.documents,
            "base_documents": view.base_documents, "base": view.base, "params": params_to_dict(view.params),
            "row_width": view.rows.width, "rows": segments, "pieces": pieces, "files": files}
    out = _HashingFile(os.path.join(tmp, META_NAME))
    out.write(json.dumps(meta, indent=1).encode())
    out.close()
    fsync_dir(tmp)


def _upto(run: Run, documents: int) -> Run:
    """``run`` without documents numbered ``documents`` or later: a background step may have sorted
    keys added after the snapshot's log rotation, which the logs after it replay."""
    if not run.docs.size or int(run.docs.max()) < documents:
        return run
    keep = run.docs < documents
    return Run(run.keys[keep], run.docs[keep])


# -- reading one back ----------------------------------------------------------------------------
def read_meta(path: str) -> dict[str, Any]:
    """A snapshot's meta.json, its fields checked for type and range; StateError naming it otherwise."""
    where = os.path.join(path, META_NAME)
    try:
        with open(where, "rb") as handle:
            raw = handle.read(MAX_META_BYTES + 1)
    except OSError as exc:
        raise StateError(f"{where}: cannot read the snapshot's description ({exc})") from None
    if len(raw) > MAX_META_BYTES:
        raise StateError(f"{where}: larger than {MAX_META_BYTES} bytes; not a snapshot description")
    try:
        meta = json.loads(raw.decode("utf-8"))
        _check_meta(meta)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise StateError(f"{where}: not a valid snapshot description ({exc})") from None
    return meta


def _count(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value < 1 << 62:
        raise ValueError(f"{what} must be a non-negative integer, not {value!r}")
    return value


def _check_meta(meta: Any) -> None:
    if meta["format"] != SNAPSHOT_FORMAT:
        raise ValueError(f"format {meta['format']!r}, this gristmill reads {SNAPSHOT_FORMAT}")
    documents = _count(meta["documents"], "documents")
    if _count(meta["base_documents"], "base_documents") > documents:
        raise ValueError("more base documents than documents")
    _count(meta["generation"], "generation")
    if meta["base"] is not None and not isinstance(meta["base"], str):
        raise ValueError("base must be a string or null")
    if not isinstance(meta["params"], dict):
        raise ValueError("params must be an object")
    _count(meta["row_width"], "row_width")
    end = 0
    for segment in meta["rows"]:
        new_end, digest = segment
        if _count(new_end, "a rows segment end") <= end or not isinstance(digest, str):
            raise ValueError("rows segments must grow and carry a digest")
        end = new_end
    if end != documents:
        raise ValueError(f"rows segments cover {end} documents, not {documents}")
    for name in TABLES:
        sizes = meta["pieces"][name]
        if not isinstance(sizes, list) or len(sizes) < BUCKETS:
            raise ValueError(f"pieces.{name} must list at least {BUCKETS} sizes")
        for size in sizes:
            _count(size, f"a size in pieces.{name}")
    for name in (*(f"{t}.{p}" for t in TABLES for p in ("keys", "docs")), "ids.arrow"):
        entry = meta["files"][name]
        _count(entry["bytes"], f"files.{name}.bytes")
        if not isinstance(entry["xxh3"], str):
            raise ValueError(f"files.{name}.xxh3 must be a string")


def _read_checked(path: str, entry: dict[str, Any]) -> Iterator[bytes]:
    """The bytes of ``path`` in chunks, raising StateError if its size or digest is not the one recorded."""
    digest = xxhash.xxh3_64()
    size = os.path.getsize(path) if os.path.exists(path) else -1
    if size != entry["bytes"]:
        raise StateError(f"{path}: {size if size >= 0 else 'missing'} bytes, the snapshot recorded {entry['bytes']}")
    with open(path, "rb") as handle:
        while chunk := handle.read(READ_CHUNK):
            digest.update(chunk)
            yield chunk
    if digest.hexdigest() != entry["xxh3"]:
        raise StateError(f"{path}: checksum mismatch; the snapshot is damaged")


def _read_array(path: str, entry: dict[str, Any], dtype: Any, count: int) -> np.ndarray:
    """A raw array file read straight into its final place (no second copy), size and digest checked."""
    out = np.empty(count, dtype)
    view = memoryview(out).cast("B")
    if entry["bytes"] != len(view):
        raise StateError(f"{path}: the snapshot records {entry['bytes']} bytes for {count} values")
    at = 0
    for chunk in _read_checked(path, entry):
        view[at : at + len(chunk)] = chunk
        at += len(chunk)
    return out


def _read_table(folder: str, meta: dict[str, Any], name: str) -> KeyTable:
    sizes = meta["pieces"][name]
    keys = _read_array(os.path.join(folder, f"{name}.keys"), meta["files"][f"{name}.keys"], np.uint64, sum(sizes))
    docs = _read_array(os.path.join(folder, f"{name}.docs"), meta["files"][f"{name}.docs"], np.uint32, sum(sizes))
    if docs.size and int(docs.max()) >= meta["documents"]:
        raise StateError(f"{folder}/{name}.docs: names a document beyond the {meta['documents']} it holds")
    runs, at = [], 0
    for i, size in enumerate(sizes):
        run = Run(keys[at : at + size], docs[at : at + size])
        at += size
        if size and (np.any(run.keys[1:] < run.keys[:-1]) or (i < BUCKETS and np.any(run.keys >> BUCKET_SHIFT != i))):
            raise StateError(f"{folder}/{name}.keys: piece {i} is not sorted into its place")
        runs.append(run)
    return KeyTable(runs[:BUCKETS], runs[BUCKETS:])


def read_snapshot(folder: str, params: IndexParams, rows: RowStore) -> tuple[LiveIndex, dict[str, Any]]:
    """Snapshot ``folder`` as a live index over ``rows`` (whose segments it checks), with its meta."""
    meta = read_meta(folder)
    if meta["params"] != params_to_dict(params) or meta["row_width"] != rows.width:
        raise StateError(f"{folder}/{META_NAME}: written for index parameters {meta['params']}, but this "
                         f"service has {params_to_dict(params)}")
    documents = meta["documents"]
    if rows.capacity() < documents:
        raise StateError(f"{rows.path}: holds {rows.capacity()} rows, the snapshot {folder} needs {documents}")
    start = 0
    for end, digest in meta["rows"]:
        if rows_digest(rows, start, end) != digest:
            raise StateError(f"{rows.path}: rows {start}-{end} do not match snapshot {folder} (checksum)")
        start = end
    rows.truncate(documents)
    ids_path = os.path.join(folder, "ids.arrow")
    data = b"".join(_read_checked(ids_path, meta["files"]["ids.arrow"]))
    try:
        table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        column = table.column("id")
        if column.type != pa.string() or len(column) != documents or column.null_count:
            raise ValueError(f"{len(column)} ids of type {column.type}, expected {documents} strings")
    except (pa.ArrowException, KeyError, ValueError) as exc:
        raise StateError(f"{ids_path}: not the snapshot's ids ({exc})") from None
    index = LiveIndex(params, rows, bands=_read_table(folder, meta, "bands"), exact=_read_table(folder, meta, "exact"),
                      ids=IdColumn(list(column.chunks)), base_count=meta["base_documents"])
    return index, meta
