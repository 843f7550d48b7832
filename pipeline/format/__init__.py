"""The gristmill corpus format: the contract between every writer and every reader (docs/FORMAT.md).

One module per job: ``schemas`` (every Arrow schema), ``storage`` (fsspec URLs), ``manifest`` (the
commit point and every rule about the paths it names), ``writer`` (shards), ``reader`` (:class:`Corpus`)
``lease`` (one writer per folder), ``gc`` (files of replaced manifests kept for their readers, then
reclaimed), ``signature_index`` (the index a dedup run keeps for later runs and the service), ``blocks``
(every row group as flat arrays: the block table a version 2 manifest keeps beside it) and ``existing``
(a manifest over Parquet files another tool wrote, ``gristmill index``). Floor 1 of the
layering in DESIGN.md: it imports nothing of ours but ``dedup``, and neither Ray nor aiohttp, so the
loader and the crawler can use it cheaply. The names below are the contract most callers need.
"""

from gristmill.pipeline.format.blocks import BlockTable, RowGroupInfo, RowGroups
from gristmill.pipeline.format.gc import retire_unlisted
from gristmill.pipeline.format.lease import Lease, LeaseHeld, acquire_leases, release_leases
from gristmill.pipeline.format.manifest import (
    FORMAT_VERSION,
    JOB_FINGERPRINT_KEY,
    LEGACY_MANIFEST_NAME,
    MANIFEST_NAME,
    MANIFEST_NAMES,
    STATS_TABLE_KEY,
    CorpusError,
    Manifest,
    ShardInfo,
    has_manifest,
    is_owned_file,
    member_path,
    write_manifest,
)
from gristmill.pipeline.format.reader import Corpus, VerifyResult
from gristmill.pipeline.format.schemas import (
    CORPUS_SCHEMA,
    RAW_CRAWL_SCHEMA,
    REJECT_KINDS,
    REJECT_SCHEMA,
    REMOVED_SCHEMA,
    RESERVED_COLUMNS,
    SOURCE_COLUMN,
    index_schema,
    passes_through,
)
from gristmill.pipeline.format.storage import open_fs
from gristmill.pipeline.format.writer import ShardWriter, write_corpus

__all__ = [
    "CORPUS_SCHEMA", "FORMAT_VERSION", "JOB_FINGERPRINT_KEY", "LEGACY_MANIFEST_NAME", "MANIFEST_NAME", "MANIFEST_NAMES",
    "RAW_CRAWL_SCHEMA", "REJECT_KINDS", "REJECT_SCHEMA", "REMOVED_SCHEMA", "RESERVED_COLUMNS", "SOURCE_COLUMN",
    "STATS_TABLE_KEY", "BlockTable", "Corpus", "CorpusError", "Lease", "LeaseHeld", "Manifest", "RowGroupInfo",
    "RowGroups", "ShardInfo", "ShardWriter", "VerifyResult", "acquire_leases", "has_manifest", "index_schema",
    "is_owned_file", "member_path", "open_fs", "passes_through", "release_leases", "retire_unlisted", "write_corpus",
    "write_manifest",
]
