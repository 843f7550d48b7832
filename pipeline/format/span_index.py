"""The span index beside a corpus that ``gristmill dedup --spans`` wrote: the hash of every span its
documents kept (``_spans/index-*.parquet``, sorted by hash, in small row groups), so that a later
``--spans --against CORPUS`` job cuts from new documents the spans this corpus already holds, reading
only the row groups that can hold its own hashes. The manifest's ``extra.span_index`` names the files
and the settings the spans were cut with (a later job must split the same way)."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gristmill.pipeline.format.errors import CorpusError
from gristmill.pipeline.format.reader import Corpus
from gristmill.pipeline.format.sorted_parquet import groups_holding, open_counted, write_sorted
from gristmill.pipeline.format.storage import open_fs

SPAN_INDEX_KEY = "span_index"  # in a manifest's ``extra``: {"spans", "span_min_chars", "span_hash", "files"}
SPAN_INDEX_FOLDER = "_spans"
SPAN_INDEX_SCHEMA = pa.schema([("hash", pa.uint64()), ("id", pa.string())])  # id: the document keeping it
SPAN_GROUP_ROWS = 16384


def write_span_index(url: str, name: str, table: pa.Table, storage_options: Mapping[str, Any] | None = None) -> None:
    """One span index file (``SPAN_INDEX_SCHEMA`` rows, one per hash) sorted by hash, relative to ``url``."""
    fs, root = open_fs(url, storage_options)
    fs.makedirs(posixpath.join(root, SPAN_INDEX_FOLDER), exist_ok=True)
    with fs.open(posixpath.join(root, name), "wb") as handle:
        write_sorted(handle, table.sort_by([("hash", "ascending")]).cast(SPAN_INDEX_SCHEMA), SPAN_GROUP_ROWS)


def span_index_urls(corpus: Corpus, settings: Mapping[str, Any]) -> list[str]:
    """The span index files of an earlier corpus, each path checked to stay inside it; CorpusError when it
    has none or was cut with other ``settings`` (``spans``, ``span_min_chars``)."""
    entry = corpus.manifest.extra.get(SPAN_INDEX_KEY)
    if not isinstance(entry, Mapping) or not isinstance(entry.get("files"), list):
        raise CorpusError(f"{corpus.url}: no span index (it was not written by gristmill dedup --spans)")
    for name, value in settings.items():
        if entry.get(name) != value:
            raise CorpusError(f"{corpus.url}: its spans were cut with {name}={entry.get(name)}, this job uses "
                              f"{name}={value}; use the same settings")
    protocol = corpus.url.split("://", 1)[0] + "://" if "://" in corpus.url else ""
    paths = [corpus.member_path(name, "span index") for name in entry["files"]]
    return [path if not protocol or path.startswith(protocol) else protocol + path for path in paths]


def spans_held(url: str, wanted: np.ndarray, storage_options: Mapping[str, Any] | None = None) -> pa.Table:
    """The rows of one span index file whose hash is one of the sorted uint64 ``wanted``."""
    with open_counted(url, storage_options) as (parquet, _):
        groups = groups_holding(parquet.metadata, "hash", wanted)
        if not groups:
            return SPAN_INDEX_SCHEMA.empty_table()
        table = parquet.read_row_groups(groups, columns=SPAN_INDEX_SCHEMA.names)
    return table.filter(pc.is_in(table["hash"], value_set=pa.array(wanted, pa.uint64())))
