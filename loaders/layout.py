"""Where every block of a corpus is: shard, row group, rows and byte range, as flat arrays.

Built once per process from the manifest; everything that plans an epoch or fetches a block reads these
arrays rather than the manifest's per-shard objects, so how the manifest stores them can change alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipeline.format import ShardInfo


@dataclass(frozen=True)
class Layout:
    """Every block of a corpus in manifest order (so ``shard`` is non-decreasing)."""

    shard: np.ndarray
    group: np.ndarray
    rows: np.ndarray
    offset: np.ndarray
    length: np.ndarray

    @classmethod
    def of(cls, shards: list[ShardInfo]) -> Layout:
        columns: tuple[list[int], ...] = ([], [], [], [], [])
        for index, info in enumerate(shards):
            for number, rg in enumerate(info.row_groups):
                for column, value in zip(columns, (index, number, rg.rows, rg.offset, rg.length)):
                    column.append(value)
        return cls(*(np.asarray(column, dtype=np.int64) for column in columns))

    def byte_range(self, block: int) -> tuple[int, int]:
        """``[start, end)`` of the block's bytes in its shard."""
        start = int(self.offset[block])
        return start, start + int(self.length[block])

    def blocks_of(self, shard: int) -> slice:
        """The blocks of one shard, as a slice of these arrays."""
        first, last = np.searchsorted(self.shard, [shard, shard + 1])
        return slice(int(first), int(last))
