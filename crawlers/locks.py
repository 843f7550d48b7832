"""One owner per piece of crawl state: an ``flock`` on a file beside it, which names its holder.

Why: two crawlers on one frontier fetch and store the same pages (after ``kill -9`` of a partitioned
crawl's coordinator, a rerun beside its still running partitions stored about a third of the pages
twice). The kernel releases an ``flock`` when the last process holding it ends (SIGKILL included),
so a crashed owner never blocks the next run; a holder that is going (partitions stopping after
their coordinator died) is waited for, a live one named in the refusal.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from typing import IO

LOCK_WAIT_S = 15.0  # longer than an orphaned partition takes to stop (crawlers.partitioned.ORPHAN_GRACE_S)
POLL_S = 0.1


class StateInUse(ValueError):
    """Another process holds this crawl state; the message names the lock file and its holder."""


def hold(path: str, wait_s: float = LOCK_WAIT_S) -> IO[bytes]:
    """An exclusive lock on ``path`` (created if needed), held until the returned file is closed (or
    the process ends); waits up to ``wait_s`` for a holder to let go, then :class:`StateInUse`."""
    handle = open(path, "a+b")  # noqa: SIM115 - the lock lives as long as the file stays open
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                holder = _holder(handle)
                handle.close()
                raise StateInUse(f"{path}: in use by {holder}; stop that crawl or wait for it to end") from None
            time.sleep(POLL_S)
    with contextlib.suppress(OSError):  # who holds it, for the next one's refusal; a full disk leaves it out
        handle.truncate(0)
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode())
        handle.flush()
    return handle


def _holder(handle: IO[bytes]) -> str:
    """The holder as its lock file records it: process, host and since when."""
    handle.seek(0)
    try:
        found = json.loads(handle.read(4096))
        pid, host, since = int(found["pid"]), str(found["host"]), str(found["since"])
    except (ValueError, KeyError, TypeError):
        return "another process (unnamed)"
    return f"process {pid} on {host} since {since}"
