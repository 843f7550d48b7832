"""Readers keep what they opened: files an earlier manifest listed are retired, not removed, at a commit.

A loader plans its epoch from the manifest it opened and reads those shards until the epoch ends; an
``--overwrite`` that removed them right after committing killed it mid-epoch. Now, after a commit, every
file of ours the new manifest does not list is *retired*: written into the folder's ledger
``_retired.json`` (relative path -> when it was first found unlisted) and removed only when it has been
unlisted for ``GRACE_SECONDS``, at a later commit or by ``gristmill gc`` (``grace=0``: ``--now``). A
temporary name (``*.tmp-*``, a crashed writer's) was never listed, so no reader holds it: it goes at once.

The ledger is untrusted input like the manifest: an unreadable ledger, or a time in it that is not a
finite number or lies in the future, counts as "unlisted now" (the file is kept the full grace period);
a name in it that is not an unlisted file of ours is dropped. See docs/FORMAT.md.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gristmill.pipeline.format.lease import LEASE_NAME, as_seconds
from gristmill.pipeline.format.manifest import (
    MANIFEST_NAMES,
    Manifest,
    is_owned_file,
    manifest_extra_files,
)
from gristmill.pipeline.format.storage import is_local, naming, open_fs, write_whole

RETIRED_NAME = "_retired.json"
GRACE_SECONDS = 24 * 3600.0  # a reader may hold a replaced manifest's files this long after the commit
_NEVER_RETIRED = (*MANIFEST_NAMES, RETIRED_NAME)


@dataclass
class Reclaimed:
    """What one pass removed (relative paths and their bytes) and what it keeps retired (path -> since)."""

    removed: dict[str, int] = field(default_factory=dict)
    retired: dict[str, float] = field(default_factory=dict)

    @property
    def bytes_freed(self) -> int:
        return sum(self.removed.values())


def retire_unlisted(url: str, manifest: Manifest, storage_options: Mapping[str, Any] | None = None,
                    grace: float = GRACE_SECONDS) -> Reclaimed:
    """After ``manifest`` committed at ``url`` (with its lease held): retire the files of ours it does not
    list, and remove those retired at least ``grace`` seconds ago and temporary names. ``_work``, the
    lease and anything not of ours are left alone."""
    fs, root = open_fs(url, storage_options)
    listed = {shard.path for shard in manifest.shards} | set(manifest_extra_files(manifest))
    listed |= {manifest.blocks_file["path"]} if manifest.blocks_file else set()
    unlisted: dict[str, int] = {}
    with naming(url, "list", is_local(fs)):
        found = fs.find(root, detail=True)
    for path, info in found.items():
        relative = posixpath.relpath(path, root)
        if relative in _NEVER_RETIRED or relative in listed or relative.startswith(("_work/", LEASE_NAME)) \
                or not is_owned_file(relative):
            continue
        unlisted[relative] = int(info.get("size") or 0)
    ledger_path = posixpath.join(root, RETIRED_NAME)
    try:
        ledger_bytes: bytes | None = fs.cat_file(ledger_path)
    except FileNotFoundError:
        ledger_bytes = None
    ledger = _parse_ledger(ledger_bytes)
    now = time.time()
    result = Reclaimed()
    for relative, size in sorted(unlisted.items()):
        since = ledger.get(relative, now)
        if fnmatch.fnmatchcase(posixpath.basename(relative), "*.tmp-*") or now - since >= grace:
            try:
                fs.rm_file(posixpath.join(root, relative))
            except FileNotFoundError:
                pass
            result.removed[relative] = size
        else:
            result.retired[relative] = since
    # compared as bytes, so junk the ledger held (names not ours, bad times) is rewritten away too
    new_bytes = json.dumps({"retired": result.retired}, indent=1, sort_keys=True).encode() if result.retired else None
    if new_bytes != ledger_bytes:
        if new_bytes is not None:
            write_whole(fs, ledger_path, new_bytes)
        else:
            fs.rm_file(ledger_path)
    return result


def _parse_ledger(raw: bytes | None) -> dict[str, float]:
    """The ledger's entries (path -> when retired); a time that is not a finite number, or lies in the
    future, reads as now, and a ledger that cannot be read as nothing retired yet: both only keep
    files longer, never remove one early."""
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: JSON nested too deep
        return {}
    entries = data.get("retired") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        return {}
    now = time.time()
    times = {name: as_seconds(since) for name, since in entries.items() if isinstance(name, str)}
    return {name: min(since, now) for name, since in times.items() if since is not None}
