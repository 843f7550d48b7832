"""Where a corpus lives: any fsspec URL (local path, ``memory://``, ``s3://``) as a filesystem and a root."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

import fsspec


def open_fs(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve any fsspec URL (local path, memory://, s3://) to a filesystem and a root path."""
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    return fs, root.rstrip("/") or root


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """True for the local disk, where renames are atomic and symbolic links can point elsewhere."""
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def write_whole(fs: fsspec.AbstractFileSystem, path: str, payload: bytes) -> None:
    """Write a small file that readers see whole or not at all: a temporary name, fsync and
    ``os.replace`` on a local disk; one PUT (atomic by itself) on an object store."""
    if is_local(fs):
        temporary = f"{path}.tmp-{uuid.uuid4().hex}"
        with open(temporary, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    else:
        fs.pipe_file(path, payload)
