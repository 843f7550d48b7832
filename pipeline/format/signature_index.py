"""The signature index: what a corpus keeps of every kept document for later dedup runs and the service.

``gristmill dedup`` writes it beside every corpus, ``gristmill dedup --against`` reads it back and
``gristmill serve`` loads it: Parquet files under ``_index/`` with one row per kept document (``id``,
``content_hash``, ``length``, ``signature``, ``bands``; :func:`gristmill.pipeline.format.schemas.index_schema`)
and, in the corpus manifest, ``extra.signature_index = {"files": [...], "band_files": [...],
"params": {num_perm, ngram, bands, rows, seed, threshold, verify}}`` (``verify``: whether the job
checked candidate edges against
the threshold, which also chose recall-leaning bands; indexes written before it existed lack it and
read as ``False``). The service always checks candidates against the threshold, whatever the index
says; ``verify`` only records how the bands were chosen, so an exported index and a later
``gristmill dedup --against`` agree. A corpus written by :func:`write_index` has no shards, only that
index, which is what ``--against`` reads.

Sorted for partial reads (:func:`write_index_files`): an index file's rows are sorted by content hash
in row groups of ``INDEX_GROUP_ROWS``, and beside it a band file (``band_files``, the same position
in its list; ``INDEX_BANDS_SCHEMA``) holds every (band hash, row) sorted by band hash. A later
``--against`` run then reads, through the row groups' min/max statistics, only the groups that can
hold its own documents' content or band hashes and the rows they match, instead of the whole index
(``gristmill.pipeline.format.sorted_parquet``). Indexes written before band files list none and are read whole.
"""

from __future__ import annotations

import dataclasses
import posixpath
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from gristmill.pipeline.format.gc import retire_unlisted
from gristmill.pipeline.format.manifest import (
    MANIFEST_NAME,
    CorpusError,
    has_manifest,
    is_owned_file,
    write_manifest,
)
from gristmill.pipeline.format.reader import Corpus
from gristmill.pipeline.format.schemas import CORPUS_SCHEMA, INDEX_BANDS_SCHEMA, index_schema
from gristmill.pipeline.format.sorted_parquet import write_sorted
from gristmill.pipeline.format.storage import open_fs

__all__ = ["EXPORT_KIND", "INDEX_FOLDER", "IndexFile", "IndexParams", "ParamsError", "SignatureTable", "check_export_folder",
           "fixed_list", "list_matrix", "listed_index_files", "load_index", "params_for", "params_from_dict",
           "params_to_dict", "write_index", "write_index_files"]

INDEX_FOLDER = "_index"
# Row groups are what a later run reads to reach one row: small enough that the documents a run needs
# do not drag whole files in, large enough that a ranged read is worth its round trip and the footer
# (every reader's first read) stays small.
INDEX_GROUP_ROWS = 128  # documents per row group of an index file: ~150 KB at 128 permutations
BAND_GROUP_ROWS = 8192  # (band hash, row) rows per row group of a band file: ~100 KB
MAX_INDEX_ROWS = 1 << 32  # documents of one index file: a band file names a document by a uint32 row
EXPORT_KIND = "service-export"  # ``extra.kind`` of what ``gristmill serve --export`` writes


class ParamsError(ValueError):
    """Hashing parameters that cannot work together (a threshold outside (0, 1), bands x rows > num_perm)."""


@dataclass(frozen=True)
class IndexParams:
    """The hashing parameters a corpus and its signature index were built with."""

    num_perm: int
    ngram: int
    bands: int
    rows: int
    seed: int
    threshold: float
    verify: bool = False  # candidate edges checked against the threshold; absent (False) in older indexes

    def hasher(self) -> Any:
        from gristmill.dedup.minhash import MinHasher

        return MinHasher(num_perm=self.num_perm, ngram=self.ngram, seed=self.seed)


def params_to_dict(params: IndexParams) -> dict[str, Any]:
    return dataclasses.asdict(params)


def params_for(threshold: float, num_perm: int, ngram: int, *, bands: int | None = None, rows: int | None = None,
               seed: int | None = None, verify: bool = True) -> IndexParams:
    """The parameters ``gristmill dedup`` picks for these settings: the given ``bands`` x ``rows`` or, by
    default, the best for the threshold (recall-leaning when ``verify``: the service checks every
    candidate against the threshold). :class:`ParamsError` when they cannot work together."""
    from gristmill.dedup.lsh import choose_bands
    from gristmill.dedup.minhash import DEFAULT_SEED

    if not 0.0 < threshold < 1.0:
        raise ParamsError(f"threshold must be between 0 and 1, not {threshold}")
    if (bands is None) != (rows is None):
        raise ParamsError("give both bands and rows, or neither")
    if bands is not None and rows is not None:
        if bands * rows > num_perm:
            raise ParamsError(f"{bands} bands x {rows} rows exceed num_perm {num_perm}")
    else:
        bands, rows = choose_bands(threshold, num_perm, verify=verify)
    return IndexParams(num_perm, ngram, int(bands), int(rows), int(DEFAULT_SEED if seed is None else seed),
                       threshold, bool(verify))


def params_from_dict(values: Mapping[str, Any], where: str) -> IndexParams:
    """Parameters from a manifest, with an error naming the manifest when one is missing or wrong."""
    try:
        return IndexParams(
            num_perm=int(values["num_perm"]),
            ngram=int(values["ngram"]),
            bands=int(values["bands"]),
            rows=int(values["rows"]),
            seed=int(values["seed"]),
            threshold=float(values["threshold"]),
            verify=bool(values.get("verify", False)),
        )
    except KeyError as exc:
        raise CorpusError(f"{where}: signature index parameters lack {exc}") from None
    except (TypeError, ValueError) as exc:
        raise CorpusError(f"{where}: signature index parameters are malformed ({exc})") from None


@dataclass
class SignatureTable:
    """Index rows as arrays: ids, exact hashes, text lengths (characters), signatures and band hashes."""

    ids: list[str]
    content_hashes: list[str]
    lengths: np.ndarray
    signatures: np.ndarray
    bands: np.ndarray

    def to_arrow(self, params: IndexParams) -> pa.Table:
        return pa.table(
            {
                "id": pa.array(self.ids, pa.string()),
                "content_hash": pa.array(self.content_hashes, pa.string()),
                "length": pa.array(self.lengths, pa.int64()),
                "signature": fixed_list(self.signatures),
                "bands": fixed_list(self.bands),
            },
            schema=index_schema(params.num_perm, params.bands),
        )


@dataclass(frozen=True)
class IndexFile:
    """One index file of a corpus (a URL) and its band file (None: an index written before band files)."""

    url: str
    bands_url: str | None = None


def listed_index_files(corpus: Corpus) -> list[IndexFile]:
    """The index files a corpus's manifest lists, with their band files, each path checked to stay
    inside the corpus folder; CorpusError when there is no index or the lists do not pair up."""
    index = corpus.manifest.extra.get("signature_index")
    files = index.get("files") if isinstance(index, Mapping) else None
    if not isinstance(files, list):
        raise CorpusError(f"{corpus.url}: the manifest's signature index lists no files")
    paths = [corpus.member_path(name, "signature index file") for name in files]
    bands = index.get("band_files")
    if bands is None:
        return [IndexFile(path) for path in paths]
    if not isinstance(bands, list) or len(bands) != len(files):
        raise CorpusError(f"{corpus.url}: the manifest's signature index lists {len(files)} files but "
                          f"{len(bands) if isinstance(bands, list) else 'no list of'} band files")
    return [IndexFile(path, corpus.member_path(name, "signature index band file")) for path, name in zip(
        paths, bands, strict=True)]


def write_index_files(url: str, name: str, bands_name: str, table: pa.Table,
                      storage_options: Mapping[str, Any] | None = None) -> None:
    """Index rows (``index_schema``) sorted by content hash into ``name`` and their (band hash, row)
    pairs sorted by band hash into ``bands_name``, both relative to the corpus at ``url``."""
    if table.num_rows > MAX_INDEX_ROWS:
        raise CorpusError(f"{url}/{name}: {table.num_rows:,} documents in one index file; at most "
                          f"{MAX_INDEX_ROWS:,} (a band file names a document by a 32-bit row)")
    table = table.sort_by([("content_hash", "ascending"), ("id", "ascending")])
    width = table.schema.field("bands").type.list_size
    hashes = list_matrix(table["bands"], width).reshape(-1)
    rows = np.repeat(np.arange(table.num_rows, dtype=np.uint32), width)
    order = np.lexsort((rows, hashes))
    bands = pa.table({"hash": pa.array(hashes[order], pa.uint64()), "row": pa.array(rows[order], pa.uint32())},
                     schema=INDEX_BANDS_SCHEMA)
    fs, root = open_fs(url, storage_options)
    fs.makedirs(posixpath.join(root, INDEX_FOLDER), exist_ok=True)
    for relative, rows_table, group_rows in ((name, table, INDEX_GROUP_ROWS), (bands_name, bands, BAND_GROUP_ROWS)):
        with fs.open(posixpath.join(root, relative), "wb") as handle:
            write_sorted(handle, rows_table, group_rows)


def fixed_list(matrix: np.ndarray) -> pa.FixedSizeListArray:
    """An (n, width) uint64 matrix as a fixed-size-list column (signatures, band hashes) without a copy per row."""
    return pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1), pa.uint64()), matrix.shape[1])


def list_matrix(column: pa.ChunkedArray | pa.Array, width: int) -> np.ndarray:
    """A fixed-size-list column as an (n, width) uint64 matrix without a Python loop."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(array) == 0:
        return np.zeros((0, width), np.uint64)
    return array.flatten().to_numpy(zero_copy_only=False).reshape(-1, width).astype(np.uint64, copy=False)


def load_index(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[IndexParams, SignatureTable]:
    """Every index file a corpus's manifest lists, as one table, plus its parameters."""
    corpus = Corpus.open(url, storage_options)
    index = corpus.manifest.extra.get("signature_index")
    if not isinstance(index, Mapping) or not isinstance(index.get("files"), list):
        raise CorpusError(f"{url}: the corpus has no signature index (not built by gristmill dedup)")
    params = params_from_dict(index.get("params") or {}, f"{url}/{MANIFEST_NAME}")
    schema = index_schema(params.num_perm, params.bands)
    table = corpus.read_members(index["files"], schema, "signature index file")
    return params, SignatureTable(
        ids=table["id"].to_pylist(),
        content_hashes=table["content_hash"].to_pylist(),
        lengths=table["length"].to_numpy(),
        signatures=list_matrix(table["signature"], params.num_perm),
        bands=list_matrix(table["bands"], params.bands),
    )


def write_index(
    url: str,
    params: IndexParams,
    table: SignatureTable | Iterable[SignatureTable],
    *,
    stats: Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> str:
    """Publish ``table`` (or tables, one index file each) as a shard-less corpus whose signature index
    ``gristmill dedup --against`` reads.

    Index files (sorted, with their band files: :func:`write_index_files`) are written first under
    unique names, the manifest last (the commit point), so a crash leaves any earlier export intact.
    Returns the first index file's relative name. Several tables keep the writer's memory at one
    table, whatever the index's size.
    """
    check_export_folder(url, storage_options)
    run = uuid.uuid4().hex[:12]
    files: list[str] = []
    band_files: list[str] = []
    for part in [table] if isinstance(table, SignatureTable) else table:
        name = f"{INDEX_FOLDER}/index-service-{run}-{len(files):05d}.parquet"
        bands_name = f"{INDEX_FOLDER}/bands-service-{run}-{len(files):05d}.parquet"
        write_index_files(url, name, bands_name, part.to_arrow(params), storage_options)
        files.append(name)
        band_files.append(bands_name)
    if not files:  # an empty index is one empty file, so every reader finds the schema
        return write_index(url, params, SignatureTable([], [], np.zeros(0, np.int64), np.zeros((0, params.num_perm),
                           np.uint64), np.zeros((0, params.bands), np.uint64)), stats=stats,
                           storage_options=storage_options)
    extra = {"kind": EXPORT_KIND,
             "signature_index": {"files": files, "band_files": band_files, "params": params_to_dict(params)}}
    manifest = write_manifest(url, [], CORPUS_SCHEMA, stats=dict(stats or {}), extra=extra,
                              storage_options=storage_options)
    retire_unlisted(url, manifest, storage_options)  # the earlier export's index files, after the commit
    return files[0]


def check_export_folder(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Refuse (CorpusError) to export into a folder holding anything but an earlier export: the
    export's manifest would replace a corpus's, and its cleanup would take that corpus's files."""
    fs, root = open_fs(url, storage_options)
    if not fs.exists(root):
        return
    if has_manifest(fs, root):
        kind = Corpus.open(url, storage_options).manifest.extra.get("kind")
        if kind != EXPORT_KIND:
            raise CorpusError(f"{url} holds a corpus that is not a service export; export into a new folder")
        return
    foreign = next((path for path in fs.find(root) if not is_owned_file(posixpath.relpath(path, root))), None)
    if foreign is not None:
        raise CorpusError(f"{url} is not empty and holds no gristmill corpus (found {foreign}); "
                          "export into a new folder")
