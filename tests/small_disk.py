"""A real small file system for full-disk tests: a tmpfs mounted for one test (CI runs as root).

``ulimit -f`` makes a write fail cleanly with EFBIG; only a file system that really runs out of
blocks shows what a store through a memory mapping onto a hole does then (SIGBUS).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def small_disk(path: Path, size: str = "2m") -> Iterator[Path]:
    """``path`` as a tmpfs of ``size``, unmounted (lazily, should a process still hold a file) on exit."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def free_bytes(disk: Path) -> int:
    stat = os.statvfs(disk)
    return stat.f_bavail * stat.f_frsize


def fill(disk: Path, name: str, leave: int = 0) -> Path:
    """A file taking the free space of ``disk`` but ``leave`` bytes; with 0, to the last block."""
    path = disk / name
    with open(path, "wb", buffering=0) as handle:
        if leave:
            os.posix_fallocate(handle.fileno(), 0, max(0, free_bytes(disk) - leave))
            return path
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return path
