"""Process clean-up shared by tests that run the command line in its own session."""

from __future__ import annotations

import os
import signal
import subprocess


def kill_session(session_id: int) -> None:
    """SIGKILL every process still in session ``session_id`` (a driver's Ray daemons and workers)."""
    listing = subprocess.run(["ps", "-eo", "pid=,sid="], capture_output=True, text=True).stdout
    for line in listing.splitlines():
        pid, sid = (int(x) for x in line.split())
        if sid == session_id:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
