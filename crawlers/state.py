"""Where a crawl's state lives: the frontier on a local disk, checkpointed to durable storage.

Why a local file plus a checkpoint: the frontier is SQLite, which needs a POSIX file system (on NFS
its locks and WAL are unsafe, and an object store has neither), while on a cluster whose nodes share
no disk the only state that outlives a node is on the store. So with ``--state-dir URL`` on a store
(the default under a remote output: ``OUTPUT/_crawl``) the frontier lives in a scratch folder of the
node that runs it, and each commit, after its shards are recorded and before the listing of them is
published, uploads a consistent copy (SQLite's online backup) under a new final name (one PUT, see
:class:`Checkpoint` for why not one fixed name). A crawler always starts from the copy last accepted
(by the hub, for a partition; else the newest on the store), never
from what a scratch folder holds (it may be older than the store's, left by an earlier run on this
node): what it fetched after its last checkpoint is fetched again, and a shard it wrote after it is
an orphan that :meth:`crawlers.commits.Committer.remove_orphans` deletes, so no page is stored twice
and none is lost. A local ``--state-dir`` is the frontier's folder itself, as before.
"""

from __future__ import annotations

import os
import posixpath
import re
import sqlite3
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import fsspec
import xxhash

from gristmill.pipeline.format import open_fs

STATE_FILE = "frontier.sqlite"
# A checkpoint's name on the store: frontier-<generation>-<save>.sqlite (unnumbered: written before generations)
CHECKPOINT_NAME = re.compile(r"frontier(?:-(?P<generation>\d+)-(?P<save>\d+))?\.sqlite")
SCRATCH = "gristmill-crawl"
# Stores a frontier cannot be kept on: read-only ones, and memory:// (each process has its own).
UNFIT = {"http": "read-only", "https": "read-only", "memory": "private to one process",
         "zip": "read-only", "tar": "read-only", "github": "read-only", "reference": "read-only"}


class Fenced(RuntimeError):
    """A call from a stale incarnation of a partition: another joined since, so this one must stop.

    Raised by the hub (:mod:`gristmill.crawlers.hub`), which is the authority on generations; defined
    here, with the checkpoints it protects, which delete a copy only once its refusal is certain."""

    def __init__(self, index: int, generation: int, current: int) -> None:
        super().__init__(index, generation, current)  # args rebuild it when pickled (a Ray actor's error)
        self.index, self.generation, self.current = index, generation, current

    def __str__(self) -> str:
        return (f"partition {self.index} generation {self.generation} is fenced: generation {self.current} "
                "joined since (this incarnation was restarted elsewhere); it stops and writes nothing more")


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


def holds_frontier(url: str, storage_options: Mapping[str, Any] | None = None) -> bool:
    """Whether the state ``url`` holds one crawler's frontier: the file itself, or checkpoints of it."""
    if not is_remote(url):
        return os.path.exists(os.path.join(url, STATE_FILE))
    return bool(Checkpoint(url, storage_options).stored)


def scratch_folder(url: str) -> str:
    """The local folder that holds the frontier of durable state ``url`` on this node (the same name
    on every node, so a restart on the same node reuses the folder)."""
    return os.path.join(tempfile.gettempdir(), SCRATCH, xxhash.xxh64_hexdigest(url.encode()))


def local_folder(url: str) -> str:
    """Where the frontier of state ``url`` lives on this node: the folder itself, or a scratch folder."""
    return scratch_folder(url) if is_remote(url) else url


class Checkpoint:
    """The frontier's copies on the store under ``url`` (a folder), one name per save,
    ``frontier-<generation>-<save>.sqlite``: restored before a crawl opens its frontier, saved at each
    commit when anything changed since the last save.

    Why a new name per save: a zombie (an incarnation of a partition that was restarted elsewhere)
    may still upload; under a fixed name its copy would replace the one the hub accepted, which the
    new incarnation (or a later one) restores, after it has deleted the zombie's unlisted shards as
    orphans, so pages would be lost. Here a save counts only once ``accept`` (the hub) took it; a
    refused copy is deleted, the previous accepted one once the next is accepted, and every copy listed
    at start-up once this run's first is. One LIST per start, one PUT and one DELETE per save.
    """

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.fs, self.root = open_fs(url, storage_options)
        self.url = url
        self.stored = self._listing()  # (generation, save) -> path, listed once at start-up
        self.generation = self.latest + 1  # a crawl with no hub is the only writer: one above the store's
        self.source = self.stored[max(self.stored)] if self.stored else None  # the copy restore() fetches
        self.accept: Callable[[str], None] | None = None  # the hub's acceptance of a save's name
        self._saves = 0
        self._superseded = sorted(self.stored.values())  # deleted once this run's first save is accepted
        self._source: sqlite3.Connection | None = None
        self._version: int | None = None

    def _listing(self) -> dict[tuple[int, int], str]:
        self.fs.invalidate_cache(self.root)  # another node may have written since this process last looked
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return {}
        found = {}
        for path in (entry["name"] for entry in entries if entry.get("type") == "file"):  # a folder never is one
            match = CHECKPOINT_NAME.fullmatch(posixpath.basename(path.rstrip("/")))
            if match is not None:
                found[(int(match["generation"] or 0), int(match["save"] or 0))] = path
        return found

    @property
    def latest(self) -> int:
        """The highest generation among the copies listed at start-up (0: none, or only the unnumbered
        ``frontier.sqlite`` of a crawl from before generations)."""
        return max((generation for generation, _save in self.stored), default=0)

    def begin(self, generation: int, accepted: str | None = None,
              accept: Callable[[str], None] | None = None) -> None:
        """Save as ``generation`` from now on, restoring copy ``accepted`` (a name the hub accepted last),
        else the newest copy listed; ``accept`` refuses a save by raising (the hub's :class:`Fenced`)."""
        self.generation, self.accept = generation, accept
        if accepted is not None:
            self.source = posixpath.join(self.root, accepted)
            self._superseded = sorted(set(self._superseded) | {self.source})

    def restore(self, local: str) -> bool:
        """Replace the local frontier ``local`` by the store's copy (or remove it when the store has
        none); returns whether a copy was restored. Called with the frontier's lock held."""
        self.discard(local)
        if self.source is None:
            return False
        partial = local + ".restoring"
        try:
            self.fs.get_file(self.source, partial)
        except FileNotFoundError:
            raise FileNotFoundError(f"{self.source}: the crawl's accepted checkpoint is missing from the "
                                    "store") from None
        os.replace(partial, local)
        return True

    def save(self, local: str) -> bool:
        """Upload a consistent copy of the frontier ``local`` unless no transaction committed since
        the last save, and have it accepted; returns whether it uploaded. A refused copy is deleted
        and the refusal raised."""
        if self._source is None:
            self.fs.makedirs(self.root, exist_ok=True)
            self._source = sqlite3.connect(local, check_same_thread=False, timeout=60.0)
        version = self._source.execute("PRAGMA data_version").fetchone()[0]
        if version == self._version:
            return False
        self._saves += 1  # a name per upload, accepted or not: none is ever written twice
        name = f"frontier-{self.generation}-{self._saves}.sqlite"
        path = posixpath.join(self.root, name)
        folder = os.path.dirname(local)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".checkpoint-", suffix=".sqlite") as copy:
            target = sqlite3.connect(copy.name)
            try:
                self._source.backup(target)
            finally:
                target.close()
            self.fs.put_file(copy.name, path)
        try:
            if self.accept is not None:
                self.accept(name)
        except Fenced:
            self._remove([path])  # nobody may restore a copy the hub refused
            raise
        except BaseException:
            self._superseded.append(path)  # the hub may have taken it: it goes once a later copy is accepted
            raise
        self._version = version
        superseded, self._superseded = self._superseded, [path]
        self._remove(superseded)
        return True

    def _remove(self, paths: list[str]) -> None:
        for path in paths:
            try:
                self.fs.rm(path)
            except FileNotFoundError:
                continue

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
