"""The removed documents of a dedup run, regrouped into clusters around the document each one lost to.

``gristmill dedup --removed CORPUS2`` writes every removed row with ``removed_as`` (exact or near),
``duplicate_of`` (the id it lost to), ``similarity`` (estimated Jaccard to it; 1.0 for exact copies)
and ``cluster_id`` (its cluster's representative, the kept row, also for an exact copy of a document
removed as a near duplicate). Used by ``gristmill clusters`` and the HTML report. Every function
streams a row group at a time: listing the largest clusters holds ``top`` clusters' figures and 8
bytes per cluster id, showing one holds that cluster's members; texts are read only from the row
groups holding a member (at 90 k removed documents the whole-table version held 233 MB).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash

from gristmill.pipeline.format import JOB_FINGERPRINT_KEY, Corpus, CorpusError
from gristmill.pipeline.format.schemas import source_column
from gristmill.pipeline.report.progress import Progress

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

    def figures(self) -> ClusterFigures:
        """The cluster as the list shows it."""
        near = [m.similarity for m in self.members if m.removed_as == "near_duplicate" and m.similarity is not None]
        return ClusterFigures(self.id, self.size, self.exact, self.near, min(near) if near else None,
                              self.representative.source if self.representative else None,
                              {m.domain for m in self.everyone() if m.domain})


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


def row_groups(corpus: Corpus, columns: list[str], stride: int = 1) -> Iterator[pa.Table]:
    """Every ``stride``-th row group of ``corpus`` (``columns`` only; every one by default), one at a time:
    what a pass holds is one row group. ``"source"`` is gristmill's source column, whatever the
    corpus's format version calls it (a version 3 corpus's ``source`` is the input's own)."""
    name = source_column(corpus.schema)
    read = [name if column == "source" else column for column in columns]
    seen = 0
    for shard in corpus.shards:
        chosen = [g for g in range(len(shard.row_groups)) if (seen + g) % stride == 0]
        seen += len(shard.row_groups)
        if not chosen:
            continue
        with corpus.fs.open(corpus.shard_path(shard), "rb") as handle:
            parquet = pq.ParquetFile(handle, page_checksum_verification=True)
            for group in chosen:
                yield parquet.read_row_group(group, columns=read, use_threads=False).rename_columns(columns)


SIMILARITY_BIN = 0.02  # width of a similarity histogram bin


def similarity_grid(similarity: np.ndarray, width: float = SIMILARITY_BIN) -> np.ndarray:
    """How many of ``similarity`` (NaN skipped) fall in each bin of ``width`` over [0, 1] (1.0 in the last)."""
    bins = int(round(1 / width))
    finite = similarity[~np.isnan(similarity)]
    return np.bincount(np.clip((finite / width + 1e-9).astype(np.int64), 0, bins - 1), minlength=bins)


def removed_similarities(removed: Corpus, progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Per ``removed_as``: :func:`similarity_grid` of the removed documents, counted a row group at a time."""
    counts: dict[str, np.ndarray] = {}
    for table in row_groups(removed, ["similarity", "removed_as"]):
        similarity = table["similarity"].to_numpy(zero_copy_only=False).astype(float)
        kinds = table["removed_as"].to_numpy(zero_copy_only=False)
        for kind in {str(k) for k in kinds}:
            grid = similarity_grid(similarity[kinds == kind])
            counts[kind] = counts[kind] + grid if kind in counts else grid
        if progress is not None:
            progress.update(table.num_rows)
    return counts


def _id_hashes(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """64-bit hashes of distinct ids: 8 bytes a cluster for counting them (a collision needs ~4 G clusters)."""
    distinct = pc.unique(ids).drop_null().to_pylist()
    return np.fromiter((xxhash.xxh3_64_intdigest(value.encode()) for value in distinct), np.uint64, len(distinct))


@dataclass
class ClusterFigures:
    """One cluster as the list shows it, from aggregates: no member is held."""

    id: str
    size: int  # documents, the representative and exact copies included (the job's cluster_size)
    exact: int = 0
    near: int = 0
    min_similarity: float | None = None
    representative: str | None = None  # its source; None when it is not in this corpus (--against)
    domains: set[str] = field(default_factory=set)


class Listing(list):  # type: ignore[type-arg]
    """The largest clusters, plus ``count`` (clusters with removed members in all) and ``held``
    (documents those clusters hold in this corpus and its removed corpus)."""

    count: int = 0
    held: int = 0


def find_clusters(corpus: Corpus, removed: Corpus, top: int | None = None,
                  progress: Progress | None = None) -> Listing:
    """The ``top`` largest clusters with a removed member (every one with None), largest first (ties by
    id), streamed: pass 1 keeps the ``top`` sizes and a hash per cluster id, pass 2 adds up the chosen
    clusters' members, a pass over the kept corpus finds their representatives. Memory: ``top``
    clusters, one row group, 8 bytes per cluster id."""
    best: dict[str, int] = {}
    hashes: list[np.ndarray] = []
    for table in row_groups(removed, ["cluster_id", "cluster_size"]):
        sizes = table.group_by("cluster_id").aggregate([("cluster_size", "max")])
        if top is not None:  # only this row group's top clusters become Python objects
            sizes = sizes.sort_by([("cluster_size_max", "descending"), ("cluster_id", "ascending")]).slice(0, top)
        best.update(zip(sizes["cluster_id"].to_pylist(), sizes["cluster_size_max"].to_pylist(), strict=True))
        if top is not None and len(best) > top:
            best = dict(sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:top])
        hashes.append(_id_hashes(table["cluster_id"]))
        if sum(h.size for h in hashes) > 2 * hashes[0].size:
            hashes = [np.unique(np.concatenate(hashes))]
        if progress is not None:
            progress.update(table.num_rows)
    chosen = {key: ClusterFigures(key, int(size)) for key, size in best.items()}
    wanted = pa.array(list(chosen), pa.string())
    for table in _matching(removed, ["cluster_id", "removed_as", "similarity", "domain"], "cluster_id", wanted):
        groups = table.group_by(["cluster_id", "removed_as"]).aggregate(
            [("similarity", "min"), ("domain", "distinct"), ([], "count_all")])
        for row in groups.to_pylist():  # a row per (chosen cluster, kind) in this row group
            figures = chosen[row["cluster_id"]]
            figures.domains.update(domain for domain in row["domain_distinct"] if domain)
            if row["removed_as"] == "exact_duplicate":
                figures.exact += row["count_all"]
            elif row["removed_as"] == "near_duplicate":
                figures.near += row["count_all"]
                lowest = row["similarity_min"]
                if lowest is not None and (figures.min_similarity is None or lowest < figures.min_similarity):
                    figures.min_similarity = lowest
    listing = Listing(sorted(chosen.values(), key=lambda c: (-c.size, c.id)))
    listing.count = int(np.unique(np.concatenate(hashes)).size) if hashes else 0
    listing.held = removed.num_rows
    if corpus is not removed:
        for table in row_groups(corpus, ["id", "source", "domain", "cluster_size", "is_representative"]):
            representatives = table.filter(pc.and_(pc.greater(table["cluster_size"], 1),
                                                   pc.fill_null(table["is_representative"], False)))
            listing.held += representatives.num_rows
            for row in representatives.filter(pc.is_in(representatives["id"], value_set=wanted)).to_pylist():
                chosen[row["id"]].representative = row["source"]
                chosen[row["id"]].domains.update([row["domain"]] if row["domain"] else [])
    return listing


def _matching(source: Corpus, columns: list[str], column: str, wanted: pa.Array) -> Iterator[pa.Table]:
    """``columns`` of the rows of ``source`` whose ``column`` is in ``wanted``, a row group at a time."""
    for table in row_groups(source, list(dict.fromkeys([*columns, column]))):
        yield table.filter(pc.is_in(table[column], value_set=wanted)).select(columns)


def find_cluster(corpus: Corpus, removed: Corpus, wanted: str) -> Cluster:
    """The cluster whose id, or one of whose members' ids, is ``wanted`` or starts with it, with its members
    (texts not read): a pass over the removed corpus's ids, then its rows of that cluster."""
    exact: str | None = None
    prefixed: set[str] = set()
    for table in row_groups(removed, ["id", "cluster_id"]):
        for column in ("cluster_id", "id"):
            hits = table.filter(pc.equal(table[column], wanted))
            if hits.num_rows:
                exact = hits["cluster_id"][0].as_py()
                break
            if len(prefixed) < 2:
                prefixed.update(table.filter(pc.starts_with(table[column], wanted))["cluster_id"].to_pylist())
        if exact is not None:
            break
    if exact is None and len(prefixed) != 1:
        if not prefixed:
            raise LookupError(f"no cluster has a document whose id is or starts with {wanted!r}")
        raise LookupError(f"{wanted!r} is a prefix of ids in more than one cluster; give more of it")
    cluster_id = exact if exact is not None else prefixed.pop()
    key = pa.array([cluster_id], pa.string())
    members = [Member(**row) for table in _matching(removed, [*_META, *REMOVED_COLUMNS], "cluster_id", key)
               for row in table.to_pylist()]
    representative = None
    if corpus is not removed:
        found = [Member(**row) for table in _matching(corpus, _META, "id", key) for row in table.to_pylist()]
        representative = found[0] if found else None
    members.sort(key=lambda m: (-(m.similarity or 0), m.id))
    return Cluster(cluster_id, representative, members)


def load_texts(cluster: Cluster, corpus: Corpus, removed: Corpus) -> None:
    """Fill in ``text`` for every member of ``cluster``: ids are read a row group at a time, and text
    only from the row groups holding a member."""
    wanted = pa.array([m.id for m in cluster.everyone()], pa.string())
    texts: dict[str, str] = {}
    for source in {id(corpus): corpus, id(removed): removed}.values():
        for shard in source.shards:
            with source.fs.open(source.shard_path(shard), "rb") as handle:
                parquet = pq.ParquetFile(handle, page_checksum_verification=True)
                for group in range(parquet.num_row_groups):
                    ids = parquet.read_row_group(group, columns=["id"], use_threads=False)["id"]
                    if pc.any(pc.is_in(ids, value_set=wanted)).as_py():
                        table = parquet.read_row_group(group, columns=["id", "text"], use_threads=False)
                        hits = table.filter(pc.is_in(table["id"], value_set=wanted))
                        texts.update(zip(hits["id"].to_pylist(), hits["text"].to_pylist(), strict=True))
    for member in cluster.everyone():
        member.text = texts.get(member.id)
