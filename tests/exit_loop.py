"""Run one ``gristmill`` command many times as the program, cheaply: this process imports what the
command imports once (the modules a first, discarded run loaded, without doing any of its work here),
then forks a child per run that does exactly what the console script does
(``sys.exit(main())`` with ``sys.argv`` set), interpreter teardown included, so a crash at exit shows as
the child's status. Prints ``{"statuses": {status: runs}, "stderr": [first lines of failures]}``.

    python tests/exit_loop.py RUNS PARALLEL COMMAND ARGS...
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import tempfile

import gristmill.pipeline.cli as cli


def main() -> None:
    runs, parallel, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    preload(argv)
    statuses: dict[int, int] = {}
    errors: list[str] = []
    running: dict[int, str] = {}

    def reap() -> None:
        pid, status = os.wait()
        code = os.waitstatus_to_exitcode(status)  # -6: killed by SIGABRT
        statuses[code] = statuses.get(code, 0) + 1
        path = running.pop(pid)
        if code:
            with open(path, encoding="utf-8", errors="replace") as handle:
                errors.append(f"{code}: {handle.read()[-300:]}")
        os.unlink(path)

    for _ in range(runs):
        if len(running) >= parallel:
            reap()
        handle, path = tempfile.mkstemp(prefix="exit-loop-", suffix=".err")
        pid = os.fork()
        if pid == 0:  # the child: the console script, with stdout discarded and stderr kept
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            os.dup2(handle, 2)
            sys.argv = ["gristmill", *argv]
            sys.exit(cli.main())
        os.close(handle)
        running[pid] = path
    while running:
        reap()
    print(json.dumps({"statuses": statuses, "stderr": errors[:5]}))


def preload(argv: list[str]) -> None:
    """Import here every module one run of the command imports (learnt from a child), so each forked
    run pays for the command and its exit, not for imports. Nothing runs here: no pool is started."""
    with tempfile.NamedTemporaryFile("r", suffix=".modules") as listing:
        pid = os.fork()
        if pid == 0:
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            with contextlib.suppress(BaseException):
                cli.main(argv)
            with open(listing.name, "w") as out:
                out.write("\n".join(sorted(sys.modules)))
            os._exit(0)
        os.waitpid(pid, 0)
        for name in listing.read().split():
            with contextlib.suppress(Exception):
                importlib.import_module(name)


if __name__ == "__main__":
    main()
