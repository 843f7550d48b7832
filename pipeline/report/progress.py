"""Progress for long commands: a tqdm bar on a terminal, plain periodic lines in logs and CI, nothing
with ``--quiet``. ``Progress`` counts one kind of work (row groups, shards); ``StageProgress`` follows
a job's stages as its Ray tasks end; ``progress_bar`` is a bar only, silent off a terminal."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from gristmill.pipeline.report.stats_text import human_bytes

LINE_SECONDS = 10.0  # how often a log (stderr not a terminal) gets a progress line


def progress_bar(**kwargs: Any) -> Any:
    """A tqdm bar on stderr, disabled unless stderr is a terminal (so piped output stays clean)."""
    from tqdm import tqdm

    return tqdm(disable=not sys.stderr.isatty(), dynamic_ncols=True, file=sys.stderr, **kwargs)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else \
        f"{seconds // 60}:{seconds % 60:02d}"


class StageProgress:
    """Progress inside each stage of a job: tasks, documents and input bytes done (as each Ray task
    finishes, its result says what it did), with a rate, and an ETA where the stage's bytes are known
    (``read``: the sum of its splits' sizes). A stage's progress moves only when a task ends: what a
    running task has done is not known before it ends.

    On a terminal: one tqdm bar per stage. Otherwise (logs, CI): a line at most every ``interval``
    seconds while a stage runs and one when it ends. ``quiet``: nothing.
    """

    def __init__(self, desc: str, stages: tuple[str, ...], quiet: bool = False, stream: TextIO | None = None,
                 interval: float = LINE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.desc, self.stages, self.interval, self.clock = desc, stages, interval, clock
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = not quiet and self.stream.isatty()
        self.lines = not quiet and not self.terminal
        self._bar: Any = None
        self._stage = ""
        self._total_bytes: int | None = None
        self._tasks = self._docs = self._bytes = 0
        self._started = self._printed = 0.0

    def begin(self, stage: str, total_bytes: int | None = None) -> None:
        """A stage starts (``total_bytes``: its input, when known)."""
        self._stage, self._total_bytes = stage, total_bytes
        self._tasks = self._docs = self._bytes = 0
        self._started = self._printed = self.clock()
        if self.terminal:
            from tqdm import tqdm

            known = total_bytes is not None
            self._bar = tqdm(total=total_bytes, unit="B" if known else " tasks", unit_scale=known,
                             unit_divisor=1024, desc=f"{self.desc} {self._number()}{stage}", file=self.stream,
                             dynamic_ncols=True, leave=False)

    def task_done(self, result: Mapping[str, Any]) -> None:
        """One task of the stage finished: ``docs`` and ``bytes`` in its result count when present."""
        self._tasks += 1
        docs, size = int(result.get("docs", 0) or 0), int(result.get("bytes", 0) or 0)
        self._docs += docs
        self._bytes += size
        if self._bar is not None:
            self._bar.update(size if self._total_bytes is not None else 1)
            self._bar.set_postfix_str(f"{self._tasks} tasks, {self._docs:,} docs", refresh=False)
        elif self.lines and self.clock() - self._printed >= self.interval:
            self._printed = self.clock()
            self._say(self._line())

    def end(self, stage: str, resumed: bool = False) -> None:
        """A stage ended (or was found finished by an earlier run: ``resumed``)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self.terminal or self.lines:
            if resumed or stage != self._stage:
                self._say(f"{self.desc} {self._number(stage)}{stage}: finished by an earlier run")
            else:
                seconds = self.clock() - self._started
                docs = f", {self._docs:,} docs" if self._docs else ""
                size = f", {human_bytes(self._bytes)}" if self._bytes else ""
                self._say(f"{self.desc} {self._number()}{stage}: done in {_duration(seconds)} "
                          f"({self._tasks} tasks{docs}{size})")
        self._stage = ""

    def _number(self, stage: str | None = None) -> str:
        name = self._stage if stage is None else stage
        return f"[{self.stages.index(name) + 1}/{len(self.stages)}] " if name in self.stages else ""

    def _line(self) -> str:
        """``dedup [1/9] read: 120.0 MiB of 400.0 MiB (30%), 3 tasks, 1,234 docs, 12.0 MiB/s, ETA 0:23``."""
        seconds = max(self.clock() - self._started, 1e-9)
        parts = [f"{self._tasks} tasks", f"{self._docs:,} docs"]
        if self._total_bytes:
            rate = self._bytes / seconds
            eta = (self._total_bytes - self._bytes) / rate if rate else None
            parts = [f"{human_bytes(self._bytes)} of {human_bytes(self._total_bytes)} "
                     f"({100 * self._bytes / self._total_bytes:.0f}%)", *parts, f"{human_bytes(rate)}/s",
                     f"ETA {_duration(eta)}" if eta is not None else "ETA unknown"]
        else:
            parts.append(f"{self._tasks / seconds:.1f} tasks/s")
        return f"{self.desc} {self._number()}{self._stage}: " + ", ".join(parts)

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)


class Progress:
    """Counts work done out of ``total`` (None: unknown) in ``unit``; ``update(n)`` as it goes, ``close()`` at the end."""

    def __init__(self, desc: str, total: int | None, unit: str, quiet: bool = False,
                 stream: TextIO | None = None, every: float = LINE_SECONDS) -> None:
        self.desc, self.total, self.unit, self.every = desc, total, unit, every
        self.stream = stream or sys.stderr
        self.done, self.started = 0, time.monotonic()
        self.last = self.started
        self.bar: Any = None
        self.plain = not quiet and not self.stream.isatty()
        if not quiet and not self.plain:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit=unit, desc=desc, file=self.stream, dynamic_ncols=True, leave=False)

    def update(self, count: int = 1) -> None:
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.plain and time.monotonic() - self.last >= self.every:
            self.last = time.monotonic()
            print(self.line(), file=self.stream, flush=True)

    def line(self) -> str:
        """``desc: done/total unit (pct), rate/s, ETA s``: the plain line."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.done / elapsed
        if self.total:
            left = (self.total - self.done) / rate if rate else float("inf")
            return (f"{self.desc}: {self.done:,}/{self.total:,} {self.unit} ({100 * self.done / self.total:.0f}%), "
                    f"{rate:,.0f} {self.unit}/s, ETA {left:,.0f} s")
        return f"{self.desc}: {self.done:,} {self.unit}, {rate:,.0f} {self.unit}/s"

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
