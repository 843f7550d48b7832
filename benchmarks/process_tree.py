"""Measure a command and every process it starts (Ray's daemons and workers, a tool's worker pool).

Shared by the pipeline benchmarks, which compare tools whose work is spread over many processes:
what one process reports about itself misses most of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Ray otherwise swaps 127.0.0.1 for the machine's network address; a one-machine benchmark stays on loopback.
LOOPBACK_RAY = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


class TreeMemory:
    """Peaks of the summed RSS and PSS of a process and all its descendants, each process's own peaks,
    and their CPU seconds.

    RSS counts a shared page (Ray's object store, pages inherited across fork) once per process that
    maps it; PSS splits it among them, so the PSS sum is the tree's real footprint. CPU seconds
    (user + system, the last reading of every process seen) do not depend on how loaded the machine
    is, so they compare the tools' work even when wall times are noisy. Each process's own peak shows
    whether one task grows with the input while the sum stays small.
    """

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.peak = self.peak_pss = 0
        self.breakdown: list[tuple[str, int, int]] = []
        self._cpu: dict[tuple[int, float], float] = {}
        self._read: dict[tuple[int, float], int] = {}  # read_chars: files, pipes and sockets
        self._own: dict[tuple[int, float], dict[str, Any]] = {}
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            rss = pss = 0
            rows = []
            for process in processes:
                try:
                    with process.oneshot():
                        memory = process.memory_full_info()
                        times = process.cpu_times()
                        read_chars = process.io_counters().read_chars
                        name = " ".join(process.cmdline()[:3])[-60:] or process.name()
                        key = (process.pid, process.create_time())
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                self._cpu[key] = times.user + times.system
                self._read[key] = read_chars
                own = self._own.setdefault(key, {"pid": process.pid, "root": process.pid == self.root.pid,
                                                 "name": name, "rss": 0, "pss": 0})
                if memory.pss > own["pss"]:
                    own.update(name=name, pss=memory.pss)  # a Ray worker's name is the task it runs
                own["rss"] = max(own["rss"], memory.rss)
                rss, pss = rss + memory.rss, pss + memory.pss
                rows.append((name, memory.rss, memory.pss))
            self.peak = max(self.peak, rss)
            if pss > self.peak_pss:
                self.peak_pss, self.breakdown = pss, sorted(rows, key=lambda row: -row[2])
            time.sleep(self.interval)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join()
        return {"peak": self.peak, "peak_pss": self.peak_pss, "cpu": sum(self._cpu.values()),
                "read_chars": sum(self._read.values()),
                "breakdown": self.breakdown,
                "processes": sorted(self._own.values(), key=lambda row: -row["pss"])}


def gristmill_command() -> str:
    """The ``gristmill`` console script: as ``pip install 'gristmill[all]'`` installs it (``.venv-plain``), else
    the tested environment's."""
    for venv in (".venv-plain", ".venv"):
        if (REPO / venv / "bin" / "gristmill").exists():
            return str(REPO / venv / "bin" / "gristmill")
    raise SystemExit("no gristmill command: run `make bench-env`")


def measure(command: list[str], log: Path) -> dict[str, Any]:
    """Run ``command`` from the repository root, its output to ``log``; wall, CPU and memory of its tree.

    The process breakdown at the tree's PSS peak and every process's own peaks go beside the log.
    """
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, "PYTHONPATH": str(REPO), **LOOPBACK_RAY})
        memory = TreeMemory(process.pid)
        code = process.wait()
    wall = time.perf_counter() - started
    measured = memory.stop()
    if code != 0:
        raise RuntimeError(f"{command[:4]} failed with {code}; see {log}")
    (log.parent / f"{log.stem}-memory-at-peak.json").write_text(json.dumps(measured["breakdown"], indent=1))
    (log.parent / f"{log.stem}-process-peaks.json").write_text(json.dumps(measured["processes"], indent=1))
    return {"wall": wall, **measured}
