"""``gristmill clusters CORPUS --what-if T``: the near-duplicate clusters recut at threshold ``T`` from the
job's stored candidate pairs (``gristmill.pipeline.format.pairs_table``), without re-running the job.

Why it can be trusted above the job's threshold: the job linked exactly the candidate pairs whose
estimate reached its threshold; a job at a higher ``T`` with the same LSH bands proposes the same
pairs and links those reaching ``T``, which are all in the table. Below the job's threshold (down to
the table's floor) the answer is a lower bound: the job's bands were tuned for its own threshold, and
a rerun with bands tuned for ``T`` would propose pairs this job never estimated.

The components are recut by :class:`gristmill.dedup.cluster.UnionFind` over the pairs reaching ``T``, read a
row group at a time: what is held between batches is one ``member -> smallest key`` row per document
in a cluster (16 bytes), never a pair; batches grow with what is held, so the work stays
O(pairs + clustered documents x log).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gristmill.pipeline.format import Corpus, CorpusError
from gristmill.pipeline.format.pairs_table import PairsInfo, iter_pairs, min_matches
from gristmill.pipeline.report.progress import Progress

FOLD_PAIRS = 1 << 22  # pairs gathered before they are folded into the components held


@dataclass(frozen=True)
class Cut:
    """What the components at one threshold remove: near duplicates, clusters and the largest one
    (counted in distinct texts: exact copies are counted apart, and do not change with the threshold)."""

    threshold: float
    near_duplicates: int
    clusters: int
    largest: int


class _Components:
    """Connected components over int64 keys, fed a batch of edges at a time; holds one row per
    non-root member (``member -> root``, the root being its component's smallest key)."""

    def __init__(self) -> None:
        self.member = np.zeros(0, np.int64)
        self.root = np.zeros(0, np.int64)
        self.left: list[np.ndarray] = []
        self.right: list[np.ndarray] = []
        self.pending = 0

    def add(self, left: np.ndarray, right: np.ndarray) -> None:
        self.left.append(left)
        self.right.append(right)
        self.pending += left.size
        if self.pending >= max(FOLD_PAIRS, self.member.size):
            self.fold()

    def fold(self) -> None:
        from gristmill.dedup.cluster import connected_components, distinct

        left = np.concatenate([self.member, *self.left])
        right = np.concatenate([self.root, *self.right])
        keys = distinct(np.concatenate([left, right]))
        labels = connected_components(keys, left, right)
        moved = labels != keys
        self.member, self.root = keys[moved], labels[moved]
        self.left, self.right, self.pending = [], [], 0


def recut(corpus: Corpus, info: PairsInfo, threshold: float, progress: Progress | None = None) -> Cut:
    """The components over the stored pairs whose estimate reaches ``threshold`` (not below the floor)."""
    if threshold < info.floor or threshold > 1:
        raise CorpusError(f"{corpus.url}: its pairs table holds pairs down to {info.floor:g}; "
                          f"a threshold of {threshold:g} needs a rerun of gristmill dedup")
    components = _Components()
    for table in iter_pairs(corpus, info, min_matches(threshold, info.num_perm)):
        components.add(table["left"].to_numpy(), table["right"].to_numpy())
        if progress is not None:
            progress.update(1)
    components.fold()
    roots = np.unique(components.root)
    nodes = np.concatenate([components.member, roots])
    label = np.concatenate([components.root, roots])
    earlier = (nodes >> info.key_bits) < info.earlier_splits  # an --against corpus's documents are never removed
    _, which = np.unique(label, return_inverse=True)
    new = np.bincount(which, weights=~earlier, minlength=roots.size).astype(np.int64)
    held_earlier = np.bincount(which, weights=earlier, minlength=roots.size) > 0
    near = int(new.sum() - np.count_nonzero(~held_earlier))  # one survivor per cluster of new documents only
    sizes = np.bincount(which, minlength=roots.size)
    return Cut(threshold, near, int(roots.size), int(sizes.max()) if sizes.size else 0)


def what_if(corpus: Corpus, threshold: float, quiet: bool = True) -> dict[str, Any]:
    """The funnel now and at ``threshold``, as ``clusters --what-if`` prints it (``--json`` as is)."""
    info = PairsInfo.of(corpus)
    with Progress("what-if: pair row groups read (two passes)", None, "row groups", quiet=quiet) as progress:
        now = recut(corpus, info, info.threshold, progress)
        then = recut(corpus, info, threshold, progress)
    documents = corpus.stats.get("documents") or {}
    kept = int(documents.get("kept", 0))
    notes = []
    if int(documents.get("near_duplicate", now.near_duplicates)) != now.near_duplicates:
        notes.append(f"the pairs give {now.near_duplicates:,} near duplicates at the job's threshold where the "
                     f"statistics say {int(documents['near_duplicate']):,}: the table and the corpus disagree")
    if threshold < info.threshold:
        notes.append(f"{threshold:g} is below the job's threshold {info.threshold:g}: these figures count only the "
                     "pairs the job's LSH bands proposed (tuned for its own threshold), so a rerun at "
                     f"{threshold:g} may remove more; they are a lower bound")
    return {
        "threshold": threshold, "job_threshold": info.threshold, "pairs_floor": info.floor,
        "exact": threshold >= info.threshold, "stored_pairs": info.rows,
        "documents_input": int(documents.get("input", 0)),
        "exact_duplicates": int(documents.get("exact_duplicate", 0)),
        "now": {**asdict(now), "kept": kept},
        "what_if": {**asdict(then), "kept": kept + now.near_duplicates - then.near_duplicates},
        "notes": notes,
    }


def render_what_if(result: dict[str, Any]) -> str:
    """The two funnels side by side, with the change, for people."""
    now, then = result["now"], result["what_if"]
    head = f"now ({result['job_threshold']:g})"
    at = f"at {result['threshold']:g}"
    rows = [("documents kept", "kept"), ("removed as near duplicates", "near_duplicates"),
            ("clusters (of distinct texts)", "clusters"), ("largest cluster (distinct texts)", "largest")]
    lines = [f"What if the threshold were {result['threshold']:g}? (recut from {result['stored_pairs']:,} stored "
             f"candidate pairs, estimates down to {result['pairs_floor']:g}; nothing re-run)",
             f"{'':<34}{head:>14}{at:>14}{'change':>12}"]
    for label, key in rows:
        change = then[key] - now[key]
        lines.append(f"{label:<34}{now[key]:>14,}{then[key]:>14,}{change:>+12,}")
    lines.append(f"{'removed as exact duplicates':<34}{result['exact_duplicates']:>14,}"
                 f"{result['exact_duplicates']:>14,}{'unchanged':>12}")
    lines.append("exact: a job at this threshold with the same LSH bands links exactly these pairs"
                 if result["exact"] else "")
    lines.extend(f"note: {note}" for note in result["notes"])
    return "\n".join(line for line in lines if line)
