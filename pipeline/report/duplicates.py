"""The removed documents of a dedup run, regrouped into clusters around the document each one lost to.

``gristmill dedup --removed CORPUS2`` writes every removed row with ``removed_as`` (exact or near),
``duplicate_of`` (the id it lost to) and ``similarity`` (estimated Jaccard to it; 1.0 for exact
copies). An exact copy of a document that was itself removed as a near duplicate points at that
document, so a cluster is found by following ``duplicate_of`` until it reaches a kept row: the
cluster's representative. Used by ``gristmill clusters`` and the HTML report. Holds the removed rows'
metadata (not their text) in memory; texts are read only for the clusters asked for.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.format import JOB_FINGERPRINT_KEY, Corpus, CorpusError

REMOVED_COLUMNS = ("removed_as", "duplicate_of", "similarity")
_META = ["id", "source", "domain", "language"]


@dataclass
class Member:
    """One document of a cluster; ``removed_as`` is None for the representative (the kept row)."""

    id: str
    source: str | None
    domain: str | None
    language: str | None
    removed_as: str | None = None
    duplicate_of: str | None = None
    similarity: float | None = None
    text: str | None = None


@dataclass
class Cluster:
    """A kept representative and every removed document that leads to it.

    ``representative`` is None when the kept row is not in this corpus (a run with ``--against``
    removed documents as copies of an earlier corpus).
    """

    id: str
    representative: Member | None
    members: list[Member] = field(default_factory=list)

    @property
    def size(self) -> int:
        return len(self.members) + (1 if self.representative is not None else 0)

    @property
    def exact(self) -> int:
        return sum(m.removed_as == "exact_duplicate" for m in self.members)

    @property
    def near(self) -> int:
        return sum(m.removed_as == "near_duplicate" for m in self.members)

    def everyone(self) -> list[Member]:
        return ([self.representative] if self.representative else []) + self.members


def open_removed(corpus: Corpus, removed_url: str | None = None) -> Corpus:
    """The removed-documents corpus of ``corpus``: ``removed_url`` if given, else the one its job wrote.

    Raises :class:`CorpusError` naming what is missing, e.g. a job run without ``--removed``.
    """
    named_by_manifest = removed_url is None
    if removed_url is None:
        if all(name in corpus.schema.names for name in REMOVED_COLUMNS):
            return corpus  # we were handed the removed corpus itself
        job = corpus.manifest.extra.get("job")
        removed_url = job.get("removed") if isinstance(job, dict) else None
        if not isinstance(removed_url, str) or not removed_url:
            raise CorpusError(f"{corpus.url}: its dedup job kept no removed documents; rerun "
                              "`gristmill dedup ... --removed CORPUS2` or pass --removed CORPUS2")
    try:
        removed = Corpus.open(removed_url)
    except CorpusError as exc:
        raise CorpusError(f"{exc} (the removed documents of {corpus.url}; pass --removed CORPUS2 if they moved)") from None
    missing = [name for name in REMOVED_COLUMNS if name not in removed.schema.names]
    if missing:
        raise CorpusError(f"{removed_url}: not a removed-documents corpus (no {', '.join(missing)} column)")
    # a manifest is untrusted: the folder it names is followed only if that corpus names the same job back
    if named_by_manifest and removed.manifest.extra.get(JOB_FINGERPRINT_KEY) != corpus.manifest.extra.get(
            JOB_FINGERPRINT_KEY):
        raise CorpusError(f"{removed_url}: the removed corpus {corpus.url}'s manifest names was written by another "
                          "job; pass --removed CORPUS2 to use it anyway")
    return removed


def removed_similarities(removed: Corpus) -> tuple[list[float], list[str]]:
    """(similarity, removed_as) of every removed document: the distribution the report plots."""
    table = removed.to_table(["similarity", "removed_as"])
    return ([float("nan") if v is None else float(v) for v in table["similarity"].to_pylist()],
            [str(v) for v in table["removed_as"].to_pylist()])


def _root(start: str, parent: dict[str, str]) -> str:
    node, seen = start, set()
    while node in parent and node not in seen:
        seen.add(node)
        node = parent[node]
    return node


def _members(table: pa.Table) -> Iterable[Member]:
    columns = {name: table[name].to_pylist() for name in table.column_names}
    for index in range(table.num_rows):
        yield Member(**{name: values[index] for name, values in columns.items()})


def find_clusters(corpus: Corpus, removed: Corpus) -> list[Cluster]:
    """Every cluster with at least one removed member, largest first (ties by representative id)."""
    table = removed.to_table([*_META, *REMOVED_COLUMNS])
    parent = {i: d for i, d in zip(table["id"].to_pylist(), table["duplicate_of"].to_pylist(), strict=True) if d}
    groups: dict[str, list[Member]] = defaultdict(list)
    for member in _members(table):
        groups[_root(member.id, parent)].append(member)
    kept = corpus.to_table(_META) if corpus is not removed else pa.table({c: pa.array([], pa.string()) for c in _META})
    kept = kept.filter(pc.is_in(kept["id"], value_set=pa.array(list(groups), pa.string())))
    representatives = {m.id: m for m in _members(kept)}
    clusters = [Cluster(root, representatives.get(root), sorted(members, key=lambda m: (-(m.similarity or 0), m.id)))
                for root, members in groups.items()]
    clusters.sort(key=lambda c: (-c.size, c.id))
    return clusters


def find_cluster(clusters: list[Cluster], wanted: str) -> Cluster:
    """The cluster whose id, or one of whose members' ids, is ``wanted`` or starts with it."""
    exact = [c for c in clusters if wanted in {m.id for m in c.everyone()} | {c.id}]
    if exact:
        return exact[0]
    matches = [c for c in clusters if c.id.startswith(wanted) or any(m.id.startswith(wanted) for m in c.everyone())]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise LookupError(f"no cluster has a document whose id is or starts with {wanted!r}")
    raise LookupError(f"{wanted!r} is a prefix of ids in {len(matches)} clusters; give more of it")


def load_texts(cluster: Cluster, corpus: Corpus, removed: Corpus) -> None:
    """Fill in ``text`` for every member of ``cluster`` (reads only the text of those rows)."""
    wanted = pa.array([m.id for m in cluster.everyone()], pa.string())
    texts: dict[str, str] = {}
    for source in {id(corpus): corpus, id(removed): removed}.values():
        for table in source.iter_tables(["id", "text"]):
            hits = table.filter(pc.is_in(table["id"], value_set=wanted))
            texts.update(zip(hits["id"].to_pylist(), hits["text"].to_pylist(), strict=True))
    for member in cluster.everyone():
        member.text = texts.get(member.id)
