"""Where a corpus lives: any fsspec URL (local path, ``memory://``, ``s3://``) as a filesystem and a root."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import fsspec


def open_fs(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve any fsspec URL (local path, memory://, s3://) to a filesystem and a root path; a store
    whose package is missing is a ModuleNotFoundError naming it (and ``gristmill[s3]`` for S3), as the
    command line names an extra, not fsspec's bare "Install s3fs to access S3"."""
    try:
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    except ImportError:
        protocol = url.split("://", 1)[0] if "://" in url else "file"
        package = _STORE_PACKAGES.get(protocol)
        if package is None:
            raise
        install = "'gristmill[s3]'" if package == "s3fs" else package
        raise ModuleNotFoundError(f"{url}: {protocol}:// needs {package}, which is not installed: pip install "
                                  f"{install}", name=package) from None
    return fs, root.rstrip("/") or root


# the packages fsspec loads for the object stores gristmill documents (docs/DEPLOY.md)
_STORE_PACKAGES = {"s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
                   "abfss": "adlfs"}


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


class StorageError(OSError):
    """A read or write of the store failed; the message names the object and the operation, on one line.

    s3fs reports a failed request as ``[Errno 16] Service Unavailable``, naming neither; users saw that
    (or a Ray traceback around it) with no idea which object failed.
    """


# what each verb is on an object store, for the message: "cannot write s3://b/k (PUT): SlowDown"
_REQUESTS = {"read": "GET", "write": "PUT", "list": "LIST", "delete": "DELETE"}


@contextlib.contextmanager
def naming(location: str, verb: str, local: bool = False, request: str | None = None) -> Iterator[None]:
    """Re-raise an ``OSError`` that names no file as a :class:`StorageError` naming ``location`` and
    ``verb`` (and on an object store the request: ``request``, else the verb's usual one). Missing and
    existing files stay what they are (callers act on them), and so does an error that already names
    its file."""
    try:
        yield
    except (FileNotFoundError, FileExistsError, StorageError):
        raise
    except OSError as exc:
        if exc.filename:
            raise
        request = request or _REQUESTS.get(verb)
        shown = "" if local or not request else f" ({request})"
        error = StorageError(f"cannot {verb} {location}{shown}: {exc.strerror or exc}")
        error.errno = exc.errno
        raise error from exc
