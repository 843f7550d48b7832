"""``Unit``: consecutive batches of one worker's stream in a few flat buffers, for moving them between
processes in one piece (``StreamingLoader.units``, the PyTorch adapter)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gristmill.loaders.prefetch import Window


@dataclass
class Unit:
    """Consecutive batches of one worker's stream in a few flat buffers, to cross processes in one piece.

    ``sizes`` are the rows of each batch. Documents: ``columns`` maps a string column to one uint8
    buffer, ``rows + 1`` int64 offsets then the UTF-8 bytes, and any other column to a list. Packed
    tokens: ``columns["packed"]`` is int32 ``[2, rows, seq_len]``, tokens then segment ids, and
    ``positions`` each batch's stream position. ``last`` marks the empty unit that ends a worker's
    stream. One buffer per column, since moving each buffer between processes has a fixed cost.
    """

    worker: int
    sizes: list[int] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)
    positions: list[tuple[int, int]] = field(default_factory=list)
    last: bool = False
    window: Window | None = None  # documents, while gathering: the window the rows come from
    begin: int = 0
