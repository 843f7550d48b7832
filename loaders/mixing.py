"""Weighted mixing of several corpora with a deterministic, checkpointable order.

Each step draws one whole batch from one source; which source is a pure function of (seed, epoch,
step), the same on every rank, so every rank draws the same number of batches from each source and
their equal batch counts carry over. A source that reaches the end of its own epoch starts its next
one (small corpora are up-sampled, as mixing weights intend). The state is the step, the mix's seed
and weights (a state of another mix is refused) and each source's own state.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gristmill.loaders.checks import integer, optional_integer, positive_finite, shown
from gristmill.loaders.loader import StreamingLoader
from gristmill.loaders.state import check_keys, field

_CHUNK = 4096


class MixedLoader:
    """Batches from ``sources`` in proportion to ``weights``; ``steps_per_epoch`` defaults to their sum of lengths."""

    def __init__(self, sources: Sequence[StreamingLoader], weights: Sequence[float], *, seed: int = 0,
                 steps_per_epoch: int | None = None) -> None:
        sources, weights = list(sources), list(weights)
        if len(sources) != len(weights) or not sources:
            raise ValueError(f"give one weight per source, and at least one source (got {len(sources)} sources, "
                             f"{len(weights)} weights)")
        for index, source in enumerate(sources):
            if not isinstance(source, StreamingLoader):
                raise TypeError(f"sources[{index}] must be a StreamingLoader, got {type(source).__name__}")
            if any(source is other for other in sources[:index]):
                raise ValueError(f"sources[{index}] is the same loader object as an earlier source; make one "
                                 "loader per source, or add their weights")
            if (source.rank, source.world_size) != (sources[0].rank, sources[0].world_size):
                raise ValueError(f"sources[{index}] is rank {source.rank} of {source.world_size}, sources[0] rank "
                                 f"{sources[0].rank} of {sources[0].world_size}: every source must be read as this rank")
        shares = [positive_finite(w, f"weights[{index}]") for index, w in enumerate(weights)]
        self.sources = sources
        self.weights = np.asarray(shares, dtype=np.float64) / sum(shares)
        self.seed = integer(seed, "seed", minimum=0)
        steps = optional_integer(steps_per_epoch, "steps_per_epoch", minimum=1)
        self.steps_per_epoch = steps or sum(len(s) for s in self.sources)
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
        self.epoch = integer(epoch, "epoch", minimum=0)
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
        """The step, the mix it was taken under (seed, weights) and each source's own state."""
        return {"seed": self.seed, "weights": self.weights.tolist(), "epoch": self.epoch, "step": self.step,
                "sources": [s.state_dict() for s in self.sources]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved state; every field and every source's state is checked before any is applied."""
        state = check_keys(state, {"seed", "weights", "epoch", "step", "sources"}, "mixing")
        if type(state["seed"]) is not int or state["seed"] != self.seed:
            raise ValueError(f"{field('seed')} is {shown(state['seed'])}, but this mix has seed={self.seed}")
        weights = state["weights"]
        if not isinstance(weights, Sequence) or len(weights) != len(self.sources) or \
                not np.allclose([positive_finite(w, field("weights"), error=ValueError) for w in weights],
                                self.weights, rtol=1e-9, atol=0):
            raise ValueError(f"{field('weights')} is {shown(weights)}, but this mix has weights {self.weights.tolist()} "
                             "(as shares): a state resumes only the mix it was saved from")
        epoch = integer(state["epoch"], field("epoch"), minimum=0, error=ValueError)
        step = integer(state["step"], field("step"), minimum=0, maximum=self.steps_per_epoch, error=ValueError)
        saved = state["sources"]
        if not isinstance(saved, Sequence) or len(saved) != len(self.sources):
            raise ValueError(f"{field('sources')} must hold one state per source ({len(self.sources)})")
        resumes = []
        for index, (source, source_state) in enumerate(zip(self.sources, saved)):
            try:
                resumes.append(source.checked_resume(source_state))
            except ValueError as exc:
                raise ValueError(f"{field(f'sources[{index}]')} ({source.url}): {exc}") from None
        for source, resume in zip(self.sources, resumes):
            source.resume(resume)
        self.epoch, self.step = epoch, step
        self._iterators = [None] * len(self.sources)
