"""Where a corpus lives: any fsspec URL (local path, ``memory://``, ``s3://``) as a filesystem and a root."""

from __future__ import annotations

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
