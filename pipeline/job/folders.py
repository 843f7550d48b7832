"""Which folders a dedup job may write, checked before any work: nothing read is overwritten or read back.

Three rules, each a clear error (``FolderError``) before the first task starts:

- The output, the removed corpus, every ``--against`` corpus and every input must not overlap: none
  equal to or inside another (the work folder lives inside the output). Overlap made a removed shard
  overwrite a kept one of the same name, and an output inside an input folder came back as input.
- A folder that holds a committed corpus written by a *different* job is only replaced with
  ``overwrite``; the *same* job (same fingerprint) finds its corpus complete and returns it, so re-running
  a command is an idempotent resume. A folder holding anything that is not ours is refused the same way.
- After the new manifest commits, files of ours that it does not list are removed
  (:func:`gristmill.pipeline.format.remove_unlisted`), never before.
- A ``--work-dir`` of its own is outside all of those (like them), and empty or a work folder of ours
  (it is removed after success: a folder of other files would go with it).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gristmill.pipeline.format import (
    JOB_FINGERPRINT_KEY,
    MANIFEST_NAME,
    Corpus,
    CorpusError,
    has_manifest,
    is_owned_file,
    open_fs,
)
from gristmill.pipeline.format.storage import is_local, naming


class FolderError(Exception):
    """The folders given to a job cannot be used as asked; the message says which and why."""


@dataclass(frozen=True)
class Location:
    """A folder or file reduced to what decides overlap: the filesystem and a normalised absolute path."""

    protocol: str
    path: str

    @classmethod
    def of(cls, url: str, storage_options: Mapping[str, Any] | None = None) -> Location:
        fs, root = open_fs(url, storage_options)
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if protocol in ("file", "local"):
            return cls("file", os.path.realpath(root))
        return cls(protocol, posixpath.normpath("/" + root.strip("/")))

    def contains(self, other: Location) -> bool:
        """True when ``other`` is this location or lies inside it."""
        if self.protocol != other.protocol:
            return False
        return other.path == self.path or other.path.startswith(self.path.rstrip("/") + "/")


def check_disjoint(outputs: Mapping[str, str | None], inputs: Iterable[tuple[str, str]],
                   storage_options: Mapping[str, Any] | None = None) -> None:
    """Refuse overlapping folders. ``outputs`` maps a flag (``-o``, ``--removed``, ``--against``) to its
    folder; ``inputs`` are (INPUT as given, one resolved file or folder it stands for)."""
    named = [(flag, url, Location.of(url, storage_options)) for flag, url in outputs.items() if url]
    for index, (flag, url, where) in enumerate(named):
        for other_flag, other_url, other in named[index + 1:]:
            if where.contains(other) or other.contains(where):
                raise FolderError(f"{flag} {url} and {other_flag} {other_url} overlap; each needs a folder of its own")
    for spec, resolved in inputs:
        place = Location.of(resolved, storage_options)
        for flag, url, where in named:
            if where.contains(place):
                raise FolderError(f"input {spec} lies inside {flag} {url}; a job never reads what it writes")
            if place.contains(where):
                raise FolderError(f"{flag} {url} lies inside input {spec}; its files would be read back as input "
                                  "on the next run; choose a folder outside the inputs")


def claim(url: str, fingerprint: str, overwrite: bool, flag: str,
          storage_options: Mapping[str, Any] | None = None) -> Corpus | None:
    """Check that this job may write ``url``; returns its corpus when this very job already committed it.

    Refused (``FolderError``) without ``overwrite``: a committed corpus of another job, an unreadable
    manifest, or files that are not this project's (a crashed run of ours leaves only files of ours).
    """
    fs, root = open_fs(url, storage_options)
    with naming(f"{url.rstrip('/')}/{MANIFEST_NAME}", "read", is_local(fs), "HEAD"):
        committed = fs.exists(root) and has_manifest(fs, root)
    if not committed and not fs.exists(root):
        return None
    hint = f"pass --overwrite to replace it, or choose another {flag} folder"
    if committed:
        try:
            corpus = Corpus.open(url, storage_options)
        except CorpusError as exc:
            if overwrite:
                return None
            raise FolderError(f"{flag} {url} holds a manifest this job cannot read ({exc}); {hint}") from None
        if corpus.manifest.extra.get(JOB_FINGERPRINT_KEY) == fingerprint:
            return corpus
        if overwrite:
            return None
        raise FolderError(f"{flag} {url} holds a committed corpus ({corpus.num_rows:,} rows, created "
                          f"{corpus.manifest.created or 'at an unknown time'}) written by a different job or "
                          f"with other settings; {hint}")
    if not overwrite:
        foreign = next((path for path in fs.find(root) if not is_owned_file(posixpath.relpath(path, root))), None)
        if foreign is not None:
            raise FolderError(f"{flag} {url} is not empty and holds no gristmill corpus (found {foreign}); {hint}")
    return None


def check_work_dir(url: str, record: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Refuse a ``--work-dir`` that holds files but no work ``record`` of ours: the job removes its work
    folder after success, and must never remove what it did not write."""
    fs, root = open_fs(url, storage_options)
    if not fs.exists(root) or fs.exists(posixpath.join(root, record)):
        return
    found = next(iter(fs.find(root)), None)
    if found is not None:
        raise FolderError(f"--work-dir {url} is not empty and is not a gristmill work folder (found {found}); "
                          "the job removes its work folder after success: choose an empty or new folder")
