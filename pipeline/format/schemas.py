"""Every Arrow schema a gristmill folder holds: the corpus, the removed documents, the rejects, the
statistics table, the raw crawl and the signature index (docs/FORMAT.md explains each column).

Why one module: a schema is the contract between a writer and its readers (the job, the crawler, the
loader, the service and the commands); kept together, a change to one is seen next to the others.
"""

from __future__ import annotations

import pyarrow as pa

# gristmill's own provenance column for where a document came from (its URL, else the input file). It
# is not called ``source``: many datasets have a ``source`` column of their own (a subset's name), which
# now passes through unchanged (format version 3; versions 1 and 2 called this column ``source``).
SOURCE_COLUMN = "gristmill_source"
LEGACY_SOURCE_COLUMN = "source"

# The columns of a deduplicated corpus; docs/FORMAT.md explains each one. A corpus may have more: the
# input's own columns that gristmill does not consume, after these (see ``passes_through``).
CORPUS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field(SOURCE_COLUMN, pa.string()),
        pa.field("domain", pa.string()),
        pa.field("language", pa.string()),
        pa.field("fetch_time", pa.timestamp("ms", tz="UTC")),
        pa.field("content_hash", pa.string()),
        pa.field("cluster_id", pa.string()),
        pa.field("cluster_size", pa.int32()),
        pa.field("is_representative", pa.bool_()),
    ]
)
REQUIRED_COLUMNS = ("text",)  # every schema a ShardWriter writes has it (a loader streams it)

# The removed documents of a dedup run (``gristmill dedup --removed``): corpus rows plus why each went.
REMOVED_SCHEMA = CORPUS_SCHEMA.append(pa.field("removed_as", pa.string())).append(
    pa.field("duplicate_of", pa.string())).append(pa.field("similarity", pa.float64()))

# Names gristmill writes in a corpus or a removed corpus. An input column of such a name is gristmill's
# own, consumed rather than carried: ``domain``, ``language`` and ``fetch_time`` are read as the
# document's, the others (an earlier gristmill output being deduplicated again) are recomputed.
RESERVED_COLUMNS = frozenset(REMOVED_SCHEMA.names)


def passes_through(name: str, text_column: str = "text", id_column: str = "id") -> bool:
    """Whether an input column reaches the corpus under its own name, type and values: every column
    but the text and id columns the run reads and the names gristmill writes itself."""
    return name not in RESERVED_COLUMNS and name != text_column and name != id_column


def with_columns(schema: pa.Schema, extra: pa.Schema) -> pa.Schema:
    """A corpus (or removed) schema followed by the input's pass-through columns."""
    return pa.schema([*schema, *extra])


def source_column(schema: pa.Schema) -> str:
    """The name of gristmill's source column in a corpus of any format version."""
    return SOURCE_COLUMN if SOURCE_COLUMN in schema.names else LEGACY_SOURCE_COLUMN

# The input records a dedup run could not turn into documents (the rejects file beside a corpus).
REJECT_KINDS = ("invalid_utf8", "empty", "over_size_cap", "unparseable", "corrupt", "unsupported")
REJECT_SCHEMA = pa.schema([
    ("source", pa.string()), ("position", pa.string()), ("kind", pa.string()), ("reason", pa.string()),
    ("bytes", pa.int64()), ("count", pa.int64()), ("origin", pa.string()),
])

# Beside a removed corpus (``_spans/``, listed in its manifest's ``extra.spans_cut.files``): one row per
# span ``gristmill dedup --spans`` cut from a document it kept: where (code point offsets and UTF-8
# bytes), the span's hash (16 hex digits) and the document that kept the span.
SPANS_CUT_SCHEMA = pa.schema([("id", pa.string()), ("start", pa.int64()), ("end", pa.int64()),
                              ("bytes", pa.int64()), ("span_hash", pa.string()), ("kept_by", pa.string())])

# The statistics table beside a dedup corpus (``_stats/``): one row per (breakdown, key) with what
# became of its documents; the manifest keeps only the totals and each breakdown's top keys.
STATS_BREAKDOWNS = ("by_source", "by_domain", "by_language", "cluster_sizes")
STATS_SCHEMA = pa.schema([
    ("breakdown", pa.string()), ("key", pa.string()), ("input", pa.int64()), ("kept", pa.int64()),
    ("exact_duplicate", pa.int64()), ("near_duplicate", pa.int64()), ("rejected", pa.int64()),
    ("input_bytes", pa.int64()), ("kept_bytes", pa.int64()), ("rejected_bytes", pa.int64()),
])

# Columns of a raw crawl shard; docs/FORMAT.md, "Raw crawl shards", explains each.
RAW_CRAWL_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("url", pa.string()),
        pa.field("final_url", pa.string()),
        pa.field("status", pa.int32()),
        pa.field("fetch_time", pa.timestamp("ms", tz="UTC")),
        pa.field("domain", pa.string()),
        pa.field("language", pa.string()),
        pa.field("content_hash", pa.string()),
        pa.field("depth", pa.int32()),
        pa.field("encoding", pa.string()),
    ]
)


# A signature index file's band file: every (band hash, row of its document in the index file),
# sorted by band hash, so a later run reads only the row groups that can hold its own band hashes.
INDEX_BANDS_SCHEMA = pa.schema([("hash", pa.uint64()), ("row", pa.uint32())])


def index_schema(num_perm: int, bands: int) -> pa.Schema:
    """A signature index file: one row per kept document, its MinHash signature and band hashes."""
    return pa.schema([
        ("id", pa.string()), ("content_hash", pa.string()), ("length", pa.int64()),
        ("signature", pa.list_(pa.uint64(), num_perm)), ("bands", pa.list_(pa.uint64(), bands)),
    ])
