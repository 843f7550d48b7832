"""Weighted mixing of several corpora with a deterministic, checkpointable order.

Each step draws one whole batch from one source; which source is a pure function of (seed, epoch,
step), the same on every rank, so every rank draws the same number of batches from each source and
their equal batch counts carry over. A source that reaches the end of its own epoch starts its next
one (small corpora are up-sampled, as mixing weights intend). The state is the step plus each
source's own state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from loaders.loader import StreamingLoader

_CHUNK = 4096


class MixedLoader:
    """Batches from ``sources`` in proportion to ``weights``; ``steps_per_epoch`` defaults to their sum of lengths."""

    def __init__(self, sources: Sequence[StreamingLoader], weights: Sequence[float], *, seed: int = 0,
                 steps_per_epoch: int | None = None) -> None:
        if len(sources) != len(weights) or not sources:
            raise ValueError("give one weight per source, and at least one source")
        if any(w < 0 for w in weights) or sum(weights) <= 0:
            raise ValueError(f"weights must be >= 0 with a positive sum, got {list(weights)}")
        self.sources = list(sources)
        self.weights = np.asarray(weights, dtype=np.float64) / float(sum(weights))
        self.seed = seed
        self.steps_per_epoch = steps_per_epoch or sum(len(s) for s in self.sources)
        self.epoch = 0
        self.step = 0
        self._iterators: list[Iterator[Any] | None] = [None] * len(self.sources)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def choice(self, step: int) -> int:
        """Which source feeds ``step`` of the current epoch (deterministic, computed in chunks)."""
        rng = np.random.default_rng([self.seed, self.epoch, step // _CHUNK])
        return int(rng.choice(len(self.sources), size=_CHUNK, p=self.weights)[step % _CHUNK])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.step = 0

    def _next(self, index: int) -> Any:
        for _ in range(2):  # a source whose epoch just ended starts its next epoch once
            if self._iterators[index] is None:
                self._iterators[index] = iter(self.sources[index])
            try:
                return next(self._iterators[index])  # type: ignore[arg-type]
            except StopIteration:
                self._iterators[index] = None
        raise ValueError(f"mixing source {index} ({self.sources[index].url}) yields no batches")

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        """Yields ``(source index, batch)``."""
        while self.step < self.steps_per_epoch:
            index = self.choice(self.step)
            batch = self._next(index)
            self.step += 1
            yield index, batch
        self.set_epoch(self.epoch + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "step": self.step,
                "sources": [s.state_dict() for s in self.sources]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["seed"] != self.seed or len(state["sources"]) != len(self.sources):
            raise ValueError("mixing state was saved with another seed or another number of sources")
        self.epoch, self.step = int(state["epoch"]), int(state["step"])
        for source, saved in zip(self.sources, state["sources"]):
            source.load_state_dict(saved)
        self._iterators = [None] * len(self.sources)
