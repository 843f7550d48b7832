"""Where a crawl's state lives: the frontier on a local disk, checkpointed to durable storage.

Why a local file plus a checkpoint: the frontier is SQLite, which needs a POSIX file system (on NFS
its locks and WAL are unsafe, and an object store has neither), while on a cluster whose nodes share
no disk the only state that outlives a node is on the store. So with ``--state-dir URL`` on a store
(the default under a remote output: ``OUTPUT/_crawl``) the frontier lives in a scratch folder of the
node that runs it, and each commit, after its shards are recorded and before the listing of them is
published, uploads a consistent copy (SQLite's online backup) as ``URL/frontier.sqlite`` (one PUT, a
final name: readers see the old copy or the new one). A crawler always starts from that copy, never
from what a scratch folder holds (it may be older than the store's, left by an earlier run on this
node): what it fetched after its last checkpoint is fetched again, and a shard it wrote after it is
an orphan that :meth:`crawlers.commits.Committer.remove_orphans` deletes, so no page is stored twice
and none is lost. A local ``--state-dir`` is the frontier's folder itself, as before.
"""

from __future__ import annotations

import os
import posixpath
import sqlite3
import tempfile
from collections.abc import Mapping
from typing import Any

import fsspec
import xxhash

from gristmill.pipeline.format import open_fs

STATE_FILE = "frontier.sqlite"
SCRATCH = "gristmill-crawl"
# Stores a frontier cannot be kept on: read-only ones, and memory:// (each process has its own).
UNFIT = {"http": "read-only", "https": "read-only", "memory": "private to one process",
         "zip": "read-only", "tar": "read-only", "github": "read-only", "reference": "read-only"}


def is_remote(url: str) -> bool:
    """Whether ``url`` names a store rather than a local folder."""
    return "://" in url and not url.startswith("file://")


def state_url(output: str, state_dir: str | None) -> str:
    """The crawl's durable state: ``state_dir``, else ``OUTPUT/.crawl`` (local) or ``OUTPUT/_crawl``
    (remote: a name Parquet readers skip, beside the shards the crawl writes)."""
    if state_dir is not None:
        return state_dir.removeprefix("file://")
    if is_remote(output):
        return output.rstrip("/") + "/_crawl"
    return os.path.join(output.removeprefix("file://"), ".crawl")


def check_state_url(url: str, storage_options: Mapping[str, Any] | None = None, processes: int = 1) -> None:
    """Refuse (ValueError, one line naming the URL) a state URL that cannot hold a crawl's frontier:
    an unknown scheme, a read-only store, or ``memory://`` when more than one process shares it."""
    if not is_remote(url):
        return
    protocol = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as exc:
        raise ValueError(f"--state-dir {url}: no file system for {protocol}:// ({exc}); use a local folder or a "
                         "store such as s3://") from None
    why = UNFIT.get(protocol)
    if why is not None and (protocol != "memory" or processes > 1):
        raise ValueError(f"--state-dir {url}: {protocol}:// is {why} and cannot hold the crawl's frontier; use a "
                         "local folder or a store such as s3://")
    open_fs(url, storage_options)


def scratch_folder(url: str) -> str:
    """The local folder that holds the frontier of durable state ``url`` on this node (the same name
    on every node, so a restart on the same node reuses the folder)."""
    return os.path.join(tempfile.gettempdir(), SCRATCH, xxhash.xxh64_hexdigest(url.encode()))


def local_folder(url: str) -> str:
    """Where the frontier of state ``url`` lives on this node: the folder itself, or a scratch folder."""
    return scratch_folder(url) if is_remote(url) else url


class Checkpoint:
    """The frontier's copy on the store at ``url`` (a folder): restored before a crawl opens its
    frontier, saved at each commit when anything changed since the last save."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.fs, root = open_fs(url, storage_options)
        self.url = url
        self.path = posixpath.join(root, STATE_FILE)
        self._source: sqlite3.Connection | None = None
        self._version: int | None = None

    def restore(self, local: str) -> bool:
        """Replace the local frontier ``local`` by the store's copy (or remove it when the store has
        none); returns whether a copy was restored. Called with the frontier's lock held."""
        self.discard(local)
        if not self.fs.exists(self.path):
            return False
        partial = local + ".restoring"
        self.fs.get_file(self.path, partial)
        os.replace(partial, local)
        return True

    def save(self, local: str) -> bool:
        """Upload a consistent copy of the frontier ``local`` unless no transaction committed since
        the last save; returns whether it uploaded."""
        if self._source is None:
            self.fs.makedirs(posixpath.dirname(self.path), exist_ok=True)
            self._source = sqlite3.connect(local, check_same_thread=False, timeout=60.0)
        version = self._source.execute("PRAGMA data_version").fetchone()[0]
        if version == self._version:
            return False
        folder = os.path.dirname(local)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".checkpoint-", suffix=".sqlite") as copy:
            target = sqlite3.connect(copy.name)
            try:
                self._source.backup(target)
            finally:
                target.close()
            self.fs.put_file(copy.name, self.path)
        self._version = version
        return True

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    @staticmethod
    def discard(local: str) -> None:
        """Remove the local frontier ``local`` once closed (its lock file stays: a waiting crawler may
        hold it open): no crawler resumes from it, so scratch folders do not pile up on a node."""
        for leftover in (local, local + "-wal", local + "-shm"):
            if os.path.exists(leftover):
                os.remove(leftover)
