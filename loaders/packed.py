"""The packed-token path of ``StreamingLoader``: documents tokenized per block and packed into
``[batch_size, seq_len]`` rows (loaders/packing.py), the step count every rank agrees on, and units of
packed batches. Mixed into ``StreamingLoader`` (loaders/loader.py), whose configuration and plan it reads."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from gristmill.loaders.packing import Packed, Packer
from gristmill.loaders.plan import EpochOrder, StreamSpec
from gristmill.loaders.units import Unit


class PackedPath:
    """Packed-token batches of one worker's stream (``seq_len`` set)."""

    def _steps(self) -> int | None:
        """Batches per rank per epoch in token mode: given, or estimated so that every rank agrees."""
        if self.seq_len is None:
            return None
        if self.steps_per_epoch is not None or self.world_size == 1:
            return self.steps_per_epoch
        if self._tokens_per_row is None:
            first = self.source.read(0)
            flat, offsets = self.tokenizer.encode_block(first.column("text"))  # type: ignore[union-attr]
            extra = 1 if self.tokenizer.eos_id is not None else 0  # type: ignore[union-attr]
            self._tokens_per_row = (len(flat) + extra * first.num_rows) / max(1, first.num_rows)
        _, _, split = self._plan()
        return int(split.per_rank * self._tokens_per_row // (self.batch_size * self.seq_len))

    def _packed(self, order: EpochOrder, spec: StreamSpec,
                alloc: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None) -> Iterator[dict[str, Any]]:
        """Packed batches of this worker's stream; every rank yields ``_steps()`` of them when set.

        ``alloc(rows)`` gives the (tokens, segment_ids) arrays each batch is written into.
        """
        assert self.tokenizer is not None and self.seq_len is not None
        tokenizer, seq_len, size = self.tokenizer, self.seq_len, self.batch_size
        steps = self._steps()
        quota = None if steps is None else len(range(self.worker_id, steps, self.num_workers))
        streams = self._streams or [(0, 0)] * self.num_workers
        docs, skip = streams[self.worker_id]
        # Batches of the rank already yielded (resume) count against this worker's share of the steps.
        done = 0 if steps is None else len(range(self.worker_id, min(self._batches, steps), self.num_workers))

        def prepare(table: pa.Table) -> tuple[Any, int]:
            flat, offsets = tokenizer.encode_block(table.column("text"))
            return (flat, offsets), flat.nbytes + offsets.nbytes

        packer = Packer(seq_len, size, tokenizer.eos_id, self.pad_id, docs, skip, alloc)
        windows = self._prefetcher(order, spec, docs, prepare, 1.0) if docs < len(spec.positions) else iter(())
        yielded = done

        def batches() -> Iterator[Packed]:
            for window in windows:
                for block, row in zip(window.blocks.tolist(), window.rows.tolist()):
                    flat, offsets = window.data[block]
                    packer.add(flat[offsets[row]: offsets[row + 1]], block)
                    while packer.full():
                        yield packer.take()
            yield from packer.flush(pad_rows=quota is not None)

        for batch in batches():
            if quota is not None and yielded >= quota:
                break  # this rank has more tokens than the agreed step count: the rest are not used
            yielded += 1
            yield self._emit(batch)
        while quota is not None and yielded < quota:  # this rank ran short: pad so all ranks agree
            yielded += 1
            yield self._emit(packer.padding())

    def _packed_units(self, order: EpochOrder, spec: StreamSpec, max_batches: int,
                      allocate: Callable[[int, Any], Any]) -> Iterator[Unit]:
        """Packed batches written straight into each unit's buffers (see ``units``)."""
        assert self.seq_len is not None
        length, size = self.seq_len, self.batch_size
        units = 0
        unit: Unit | None = None
        arrays: tuple[np.ndarray, np.ndarray] = (np.empty((0, length), np.int32),) * 2
        used = 0

        def alloc(rows: int) -> tuple[np.ndarray, np.ndarray]:
            nonlocal unit, arrays, used, units
            if unit is None:
                capacity = min(max_batches, 2 ** min(units, 30)) * size
                units += 1
                buffer = allocate(2 * capacity * length, np.int32)
                unit = Unit(self.worker_id, columns={"packed": buffer.reshape(2, capacity, length)})
                arrays = tuple(np.asarray(buffer).reshape(2, capacity, length))  # type: ignore[assignment]
                used = 0
            used += rows
            return arrays[0][used - rows:used], arrays[1][used - rows:used]

        def finish() -> Unit:
            nonlocal unit
            done, unit = unit, None
            assert done is not None
            done.columns["packed"] = done.columns["packed"][:, :sum(done.sizes)]
            return done

        for batch in self._packed(order, spec, alloc):
            assert unit is not None
            unit.sizes.append(len(batch["tokens"]))
            unit.positions.append(batch["position"])
            if used == len(arrays[0]):
                yield finish()
        if unit is not None and unit.sizes:  # (a batch taken past the step quota is not part of it)
            yield finish()

    def _emit(self, batch: Packed) -> dict[str, Any]:
        tokens, segments, position, blocks = batch
        self._count(blocks)
        self._batches += 1
        streams = list(self._streams or [(0, 0)] * self.num_workers)
        streams[self.worker_id] = position
        self._streams = streams
        return {"tokens": tokens, "segment_ids": segments, "position": position, "worker": self.worker_id}
