"""Sorting more rows than a task may hold: sorted runs spilled to local disk, then merged in slices.

Why: a reducer's partition is sized by the rows a shuffle carries, but a hot key (one band bucket
shared by a boilerplate page's 10^5 near copies) puts its rows all in one partition. Under its byte
budget a reducer sorts in memory as before; past it, it writes sorted runs (Arrow IPC on the task's
local disk, memory-mapped to read back) and merges them, and its consumer sees the same sorted rows
as a sequence of tables, each at most about the budget. Keys are integer columns.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

MIN_SLICE_ROWS = 1024  # a run's slice in the merge never shrinks below this, however many runs


class ExternalSort:
    """Sorts by the integer columns ``by`` (ascending, stable) in about ``budget_bytes`` of memory;
    ``runs`` says how many sorted runs the last :meth:`sorted` spilled (0: it sorted in memory)."""

    def __init__(self, by: Sequence[str], budget_bytes: int) -> None:
        self.by = list(by)
        self.budget = budget_bytes
        self.runs = 0

    def sorted(self, tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
        """The rows of ``tables`` in order, as tables of about the budget at most (plus one input table)."""
        buffered: list[pa.Table] = []
        size, runs = 0, []
        with tempfile.TemporaryDirectory(prefix="gristmill-spill-") as scratch:
            for table in tables:
                buffered.append(table)
                size += table.nbytes
                if size >= self.budget:
                    runs.append(_write_run(f"{scratch}/run-{len(runs):06d}.arrow", _sort(buffered, self.by)))
                    buffered, size = [], 0
            if runs and buffered:
                runs.append(_write_run(f"{scratch}/run-{len(runs):06d}.arrow", _sort(buffered, self.by)))
            self.runs = len(runs)
            if runs:
                yield from _merge(runs, self.by, self.budget)
            elif buffered:
                yield _sort(buffered, self.by)


def _sort(tables: list[pa.Table], by: Sequence[str]) -> pa.Table:
    return pa.concat_tables(tables).sort_by([(column, "ascending") for column in by])


def _write_run(path: str, table: pa.Table) -> str:
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return path


class _Run:
    """A sorted run read back through a memory map, a slice at a time."""

    def __init__(self, path: str, by: Sequence[str]) -> None:
        self.table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        self.by = by
        self.position = 0

    def window(self, rows: int) -> tuple[pa.Table, list[np.ndarray]]:
        window = self.table.slice(self.position, rows)
        return window, [window[column].to_numpy() for column in self.by]


def _merge(paths: list[str], by: Sequence[str], budget_bytes: int) -> Iterator[pa.Table]:
    """k-way merge, vectorised: each step takes from every run's slice the rows up to the smallest last
    key among the slices (so whatever is left is greater), and emits them sorted."""
    runs = [_Run(path, by) for path in paths]
    row_bytes = max(1, sum(r.table.nbytes for r in runs) // max(1, sum(r.table.num_rows for r in runs)))
    rows = max(MIN_SLICE_ROWS, budget_bytes // row_bytes // len(runs))
    while runs:
        windows = [run.window(rows) for run in runs]
        cut = min(tuple(column[-1] for column in keys) for _, keys in windows)
        pieces = []
        for run, (window, keys) in zip(runs, windows, strict=True):
            upto = _rows_upto(keys, cut)
            pieces.append(window.slice(0, upto))
            run.position += upto
        yield _sort(pieces, by)
        runs = [run for run in runs if run.position < run.table.num_rows]


def _rows_upto(keys: list[np.ndarray], cut: tuple[np.generic, ...]) -> int:
    """How many leading rows of lexicographically sorted key columns are <= ``cut``."""
    low, high = 0, len(keys[0])
    for column, value in zip(keys, cut, strict=True):
        part = column[low:high]
        low, high = low + int(np.searchsorted(part, value, "left")), low + int(np.searchsorted(part, value, "right"))
    return high
