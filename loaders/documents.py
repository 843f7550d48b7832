"""The document path of ``StreamingLoader``: batches of whole documents (lists, Arrow tables, UTF-8
buffers), or runs of them gathered into units. Mixed into ``StreamingLoader`` (loaders/loader.py),
whose configuration and plan it reads; batch building itself is loaders/batches.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from gristmill.loaders.batches import DecodedBlock, arrow_batch, gather_utf8, python_batch, utf8_batch
from gristmill.loaders.plan import EpochOrder, Split, StreamSpec, consumed_by_batches
from gristmill.loaders.prefetch import Window
from gristmill.loaders.units import Unit


class DocumentPath:
    """Document batches of one worker's stream (``seq_len`` unset)."""

    def _document_windows(self, order: EpochOrder, spec: StreamSpec, split: Split) -> Iterator[tuple[Window, int]]:
        """Windows of this worker's stream and the row each starts at (whole batches), resuming after
        ``self._batches`` batches of the rank."""
        start = consumed_by_batches(split, self.num_workers, self.batch_size, self._batches)[self.worker_id]
        if start >= len(spec.positions):
            return
        arrow = self.output == "arrow"

        def prepare(table: pa.Table) -> tuple[Any, int]:
            return (table if arrow else DecodedBlock(table)), table.nbytes

        for window in self._prefetcher(order, spec, start, prepare, 1.0):
            for begin in range(0, len(window.rows), self.batch_size):
                yield window, begin

    def _documents(self, order: EpochOrder, spec: StreamSpec, split: Split) -> Iterator[Any]:
        """Document batches of this worker's stream."""
        build = {"python": python_batch, "utf8": utf8_batch}.get(self.output)
        for window, begin in self._document_windows(order, spec, split):
            blocks = window.blocks[begin:begin + self.batch_size]
            rows = window.rows[begin:begin + self.batch_size]
            batch = build(window, blocks, rows, self.columns) if build else arrow_batch(window, blocks, rows)
            self._count(blocks)
            self._batches += 1
            yield batch

    def _document_units(self, order: EpochOrder, spec: StreamSpec, split: Split, max_batches: int,
                        allocate: Callable[[int, Any], Any]) -> Iterator[Unit]:
        """Runs of consecutive batches within one window gathered into flat buffers (see ``units``)."""
        unit: Unit | None = None
        for window, begin in self._document_windows(order, spec, split):
            if unit is None:
                unit = Unit(self.worker_id, window=window, begin=begin)
            blocks = window.blocks[begin:begin + self.batch_size]
            unit.sizes.append(len(blocks))
            self._count(blocks)
            self._batches += 1
            if len(unit.sizes) == max_batches or begin + self.batch_size >= len(window.rows):
                yield self._gather(unit, allocate)
                unit = None

    def _gather(self, unit: Unit, allocate: Callable[[int, Any], Any]) -> Unit:
        """Fill a document unit: each text column's rows as one UTF-8 buffer plus int64 offsets."""
        window, end = unit.window, unit.begin + sum(unit.sizes)
        assert window is not None
        blocks, rows = window.blocks[unit.begin:end], window.rows[unit.begin:end]
        for name in self.columns:
            buffer = gather_utf8(window, blocks, rows, name, allocate)  # one buffer: each one crosses separately
            unit.columns[name] = buffer if buffer is not None else python_batch(window, blocks, rows, [name])[name]
        unit.window = None
        return unit
