"""The candidate pairs table beside a dedup corpus (``_pairs/``): what ``gristmill clusters --what-if``
recuts the clusters from, without re-running the job.

Why a table: verification estimates the Jaccard similarity of every candidate pair the LSH bands
propose and, before this table, threw the figure away after comparing it with the threshold; so
trying another threshold meant re-running the whole job. The job now keeps every verified candidate
pair whose estimate reaches ``floor`` (the job's threshold minus :data:`FLOOR_BELOW`), one file per
verification partition, streamed a batch at a time: ``left`` and ``right`` are the job's document
keys (``split << key_bits | ordinal``; keys of splits below ``earlier_splits`` are documents of an
``--against`` corpus) and ``matches`` how many of the ``num_perm`` MinHash values agree (the estimate
is ``matches / num_perm``, the very figure the job compared with its threshold). A pair proposed by
several bands may appear more than once. The manifest's ``extra.pairs`` names the files and records
the figures above.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.pipeline.format.errors import CorpusError
from gristmill.pipeline.format.manifest import PAIRS_KEY
from gristmill.pipeline.format.reader import Corpus

PAIRS_FOLDER = "_pairs"
FLOOR_BELOW = 0.2  # pairs this far below the job's threshold are kept: room to try a lower one
PAIRS_SCHEMA = pa.schema([("left", pa.int64()), ("right", pa.int64()), ("matches", pa.uint16())])


def pairs_file(fingerprint: str, part: int) -> str:
    """One verification partition's pairs file, relative to the corpus folder."""
    return f"{PAIRS_FOLDER}/pairs-{fingerprint[:12]}-{part:05d}.parquet"


def pairs_floor(threshold: float) -> float:
    """The lowest estimate a job at ``threshold`` keeps in its pairs table."""
    return max(0.0, round(threshold - FLOOR_BELOW, 6))


def min_matches(similarity: float, num_perm: int) -> int:
    """The fewest agreeing MinHash values whose estimate ``matches / num_perm`` reaches ``similarity``
    (computed as the job computes its test, so a stored pair passes exactly when the job's would)."""
    matches = np.arange(num_perm + 1)
    return int(np.flatnonzero(matches / num_perm >= similarity)[0]) if similarity <= 1 else num_perm + 1


@dataclass(frozen=True)
class PairsInfo:
    """What a manifest records of its pairs table (validated: it is untrusted input)."""

    files: list[str]
    threshold: float
    floor: float
    num_perm: int
    earlier_splits: int
    key_bits: int
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def of(cls, corpus: Corpus) -> PairsInfo:
        """The pairs table of ``corpus``; CorpusError naming the manifest when it has none or a bad entry."""
        entry = corpus.manifest.extra.get(PAIRS_KEY)
        if entry is None:
            raise CorpusError(f"{corpus.url}: the manifest lists no candidate pairs table (written by an older "
                              "gristmill, or by a job run with --no-verify); rerun gristmill dedup to try other "
                              "thresholds")
        try:
            info = cls(files=list(entry["files"]), threshold=float(entry["threshold"]), floor=float(entry["floor"]),
                       num_perm=int(entry["num_perm"]), earlier_splits=int(entry["earlier_splits"]),
                       key_bits=int(entry["key_bits"]), rows=int(entry["rows"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorpusError(f"{corpus.url}: the manifest's {PAIRS_KEY} entry is malformed ({exc!r})") from None
        if (not all(isinstance(name, str) for name in info.files) or not 0 <= info.floor <= info.threshold <= 1
                or not 0 < info.num_perm < 2**16 or not 0 <= info.earlier_splits or not 0 < info.key_bits < 63):
            raise CorpusError(f"{corpus.url}: the manifest's {PAIRS_KEY} entry is out of range")
        return info


def iter_pairs(corpus: Corpus, info: PairsInfo, at_least: int = 0) -> Iterator[pa.Table]:
    """The stored pairs with at least ``at_least`` agreeing values, a row group at a time (bounded
    memory); each file named by the manifest is checked to lie inside the corpus, and one that cannot be
    read is a CorpusError naming it."""
    for name in info.files:
        path = corpus.member_path(name, "pairs file")
        try:
            with corpus.fs.open(path, "rb") as handle:
                parquet = pq.ParquetFile(handle, page_checksum_verification=True)
                if not parquet.schema_arrow.equals(PAIRS_SCHEMA):
                    raise CorpusError(f"{corpus.url}/{name}: not a pairs file (schema {parquet.schema_arrow})")
                for group in range(parquet.num_row_groups):
                    table = parquet.read_row_group(group, use_threads=False)
                    if at_least:
                        matches = table["matches"].to_numpy()
                        table = table.filter(pa.array(matches >= at_least))
                    yield table
        except (OSError, pa.ArrowException) as exc:
            raise CorpusError(f"{corpus.url}/{name}: cannot read pairs file ({exc})") from None


def pairs_entry(files: list[str], threshold: float, num_perm: int, earlier_splits: int, key_bits: int,
                rows: int) -> Mapping[str, Any]:
    """The manifest's ``extra.pairs`` for a job's pairs table."""
    return PairsInfo(files, threshold, pairs_floor(threshold), num_perm, earlier_splits, key_bits, rows).to_dict()
