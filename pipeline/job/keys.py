"""The room in a document key: ``split << KEY_BITS | ordinal`` in an int64, checked instead of overflowing.

A key that overflowed would silently give two documents one key (or a negative one), and every stage
after ``read`` joins on keys. So the plan refuses more splits (``--against`` index files included)
than the high bits can number, and a read task refuses a split with more records than the low bits
can: each with an error that says what to change.
"""

from __future__ import annotations

from gristmill.pipeline.job import inputs
from gristmill.pipeline.job.config import DedupError


def max_splits() -> int:
    """Splits a run can number: a key's split part must keep the int64 key non-negative."""
    return 1 << (63 - inputs.KEY_BITS)


def max_split_rows() -> int:
    """Records one split can number."""
    return 1 << inputs.KEY_BITS


def check_split_count(new_splits: int, index_files: int) -> None:
    """At planning: DedupError when the new input's splits and the ``--against`` index files cannot all be numbered."""
    if new_splits + index_files > max_splits():
        raise DedupError(f"the input makes {new_splits:,} splits and the --against corpora hold {index_files:,} index "
                         f"files: more than the {max_splits():,} a document key can number; use a larger "
                         "--split-bytes (fewer, larger splits)")


def check_split_rows(rows: int, where: str) -> None:
    """In a read task: DedupError when split ``where`` (its files, named for the user) holds more records
    than a key can number."""
    if rows > max_split_rows():
        raise DedupError(f"{where} holds more than {max_split_rows():,} records, the most a document key can number "
                         "in one split; use a smaller --split-bytes")
