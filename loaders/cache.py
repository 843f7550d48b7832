"""The optional local disk cache of fetched blocks, for corpora on remote storage."""

from __future__ import annotations

import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable


class DiskCache:
    """A size-limited local directory of fetched blocks for remote corpora.

    Blocks are files named after the shard checksum and byte range, written atomically. When the limit
    would be exceeded the least recently used blocks go first, but never a block pinned as in use; when
    only pinned blocks remain, the new block is simply not cached. Several processes (DataLoader
    workers) may share a directory: each enforces the limit on the files it can see.
    """

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        os.makedirs(directory, exist_ok=True)
        self._lock = threading.Lock()
        self._pinned: dict[str, int] = {}
        self._sizes: OrderedDict[str, int] = OrderedDict()
        entries = sorted(os.scandir(directory), key=lambda e: e.stat().st_mtime)
        for entry in entries:
            if entry.is_file() and not entry.name.startswith("."):
                self._sizes[entry.name] = entry.stat().st_size

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(self._sizes.values())

    def pin(self, key: str) -> None:
        with self._lock:
            self._pinned[key] = self._pinned.get(key, 0) + 1

    def unpin(self, key: str) -> None:
        with self._lock:
            left = self._pinned.get(key, 0) - 1
            if left > 0:
                self._pinned[key] = left
            else:
                self._pinned.pop(key, None)

    def get(self, key: str) -> bytes | None:
        try:
            with open(os.path.join(self.directory, key), "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            with self._lock:
                self._sizes.pop(key, None)
            return None
        with self._lock:
            if key in self._sizes:
                self._sizes.move_to_end(key)
        return data

    def fetch(self, key: str, size: int, download: Callable[[], bytes]) -> tuple[bytes, bool]:
        """The block under ``key`` (``size`` bytes), from the cache or else downloaded and stored.

        Returns the bytes and whether they came from the cache; a cached file of the wrong size is
        ignored (a torn or foreign file) and replaced.
        """
        data = self.get(key)
        if data is not None and len(data) == size:
            return data, True
        data = download()
        self.put(key, data)
        return data, False

    def put(self, key: str, data: bytes) -> bool:
        """Store a block; returns False when it could not fit without evicting a pinned block."""
        with self._lock:
            if len(data) > self.max_bytes:
                return False
            used = sum(self._sizes.values())
            victims = []
            for name, size in self._sizes.items():
                if used + len(data) <= self.max_bytes:
                    break
                if name in self._pinned or name == key:
                    continue
                victims.append(name)
                used -= size
            if used + len(data) > self.max_bytes:
                return False
            for name in victims:
                del self._sizes[name]
                try:
                    os.remove(os.path.join(self.directory, name))
                except FileNotFoundError:
                    pass
            self._sizes[key] = len(data)
        temporary = os.path.join(self.directory, f".tmp-{uuid.uuid4().hex}")
        with open(temporary, "wb") as handle:
            handle.write(data)
        os.replace(temporary, os.path.join(self.directory, key))
        return True
