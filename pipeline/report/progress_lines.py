"""Progress for the report commands (``clusters``, ``stats --html``): a tqdm bar on a terminal, a
plain line about every 10 s when stderr is not one (logs, CI), nothing with ``--quiet``.

Why not :func:`pipeline.report.progress.progress_bar` alone: it is silent off a terminal, and issue 19
asks for periodic lines there, done/total with a rate and an ETA.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

LINE_SECONDS = 10.0


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
