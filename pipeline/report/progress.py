"""Progress bars for long commands: shown on a terminal, silent in logs, CI and tests."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(**kwargs: Any) -> Any:
    """A tqdm bar on stderr, disabled unless stderr is a terminal (so piped output stays clean)."""
    from tqdm import tqdm

    return tqdm(disable=not sys.stderr.isatty(), dynamic_ncols=True, file=sys.stderr, **kwargs)


def stage_bar(stages: tuple[str, ...], desc: str) -> tuple[Any, Any]:
    """A bar over named stages and the ``on_stage(name)`` callback that advances it."""
    bar = progress_bar(total=len(stages), unit="stage", desc=desc)

    def on_stage(name: str) -> None:
        bar.update(1)
        bar.set_postfix_str(name)

    return bar, on_stage
