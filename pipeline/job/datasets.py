"""Every dataset the dedup job writes, named once: the work folder's files and the corpus's side files.

Why one module: a stage writes what a later stage reads; with both naming the file here, a renamed
folder cannot leave a reader looking in the old place, and the whole layout of ``OUTPUT/_work`` reads
in one page. Three layouts carry every hand-over between stages:

- :class:`PerSplit`: one Parquet file per split (``docs/s=00003.parquet``).
- :class:`Shuffled`: every task on the sending side of a shuffle writes one partitioned file
  (:mod:`gristmill.pipeline.job.partfile`: its rows sorted by destination, with an index), named after the task
  (``exact_in/s=00003.part``, with ``WorkDir.write_partitioned``); a receiving task reads its
  destination's bytes of every file in the folder (``WorkDir.read_partition``). A shuffle writes as
  many files as it has sending tasks, whatever the number of destinations.
- :class:`BySplit`: the same, with splits as the destinations: a reducer's rows routed back to the
  split their key belongs to (``exact_out/p=00001.part``, with ``tasks.route_by_split``).

A :class:`Records` folder holds the completion record of every task of a step (``read/done/s=00003.json``);
a rerun skips a task whose record exists. The work schemas sit beside the datasets that hold them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gristmill.pipeline.format.signature_index import INDEX_FOLDER
from gristmill.pipeline.format.stats_table import STATS_FOLDER

WORK_FOLDER = "_work"  # inside the output corpus; removed after success unless keep_work
REJECTS_FOLDER = "_rejects"
SPANS_CUT_FOLDER = "_spans"


def split_name(split: int) -> str:
    """How a split is named in every path: ``s=00003``."""
    return f"s={split:05d}"


def partition_name(part: int) -> str:
    """How a hash partition is named in every path: ``p=00001``."""
    return f"p={part:05d}"


@dataclass(frozen=True)
class PerSplit:
    """One Parquet file per split: ``folder/s=SSSSS.parquet``."""

    folder: str

    def file(self, split: int) -> str:
        return f"{self.folder}/{split_name(split)}.parquet"


@dataclass(frozen=True)
class PerBatch:
    """One Parquet file per read batch of a split: ``folder/s=SSSSS/b=BBBBB.parquet``."""

    folder: str

    def folder_of(self, split: int) -> str:
        return f"{self.folder}/{split_name(split)}"

    def file(self, split: int, batch: int) -> str:
        return f"{self.folder_of(split)}/b={batch:05d}.parquet"

    def types_file(self, split: int) -> str:
        """What the split's batches hold, as JSON (``gristmill.pipeline.job.extras.ColumnTypes``)."""
        return f"{self.folder_of(split)}/types.json"


@dataclass(frozen=True)
class Shuffled:
    """A shuffle: sending task ``name`` writes the partitioned file ``folder/name.part`` (rows sorted by
    destination partition); a receiving task reads its partition of every file in the folder."""

    folder: str

    def file(self, name: str) -> str:
        return f"{self.folder}/{name}.part"

    def senders_file(self) -> str:
        """On a local disk, the senders' files a step's receivers read and their sizes, as the driver
        named them from the senders' completion records (``exchange.prepare``)."""
        return f"{self.folder}/senders.json"


@dataclass(frozen=True)
class BySplit(Shuffled):
    """A shuffle to splits: reducer ``p`` writes ``folder/p=PPPPP.part`` (rows sorted by the split of
    their key); a per-split task reads its split of every file."""


@dataclass(frozen=True)
class Records:
    """Completion records of one step's tasks: ``folder/s=SSSSS.json`` or ``folder/p=PPPPP.json``."""

    folder: str

    def split(self, split: int) -> str:
        return f"{self.folder}/{split_name(split)}.json"

    def partition(self, part: int) -> str:
        return f"{self.folder}/{partition_name(part)}.json"


# -- the work folder, in stage order ---------------------------------------------------------------
JOB_RECORD = "job.json"  # the fingerprint and partitions the work folder belongs to
TIMINGS = "timings.json"  # seconds per finished stage


def stage_record(stage: str) -> str:
    """A finished stage's result: the driver skips the stage when it exists."""
    return f"stage-{stage}.json"


# read: per split (and per --against index file); first, the newlines of cut JSONL files
LINES_DONE = Records("read/lines")  # {"split", "newlines"}: inputs.number_lines numbers the later pieces
READ_DONE = Records("read/done")
DOCS = PerSplit("docs")  # DOC_SCHEMA, one row group per read batch
HASH_SIGNATURES = PerSplit("hash_sigs")  # hash_signature_schema: one signature per distinct content hash
REJECTS = PerSplit("rejects")  # pipeline.format.REJECT_SCHEMA
EXTRAS = PerBatch("extras")  # a batch's input columns that pass through (pipeline.job.extras), when it has any
# exact: per split (index files included), then per content-hash partition
EXACT_MAP_DONE = Records("exact/map")
EXACT_IN = Shuffled("exact_in")  # EXACT_IN_SCHEMA: a split's best row and row count per content hash, by hash
EXACT_DONE = Records("exact/done")
EXACT_OUT = BySplit("exact_out")  # EXACT_OUT_SCHEMA: per duplicated text and split holding it, by split
EXACT_BY_REP = Shuffled("exact_by_rep")  # EXACT_BY_REP_SCHEMA: splits holding copies, by survivor key
# sign: per split (read writes the --against pseudo-splits' signatures)
SIGN_DONE = Records("sign/done")
SIGNATURES = PerSplit("sigs")  # signed_schema (an --against pseudo-split: sig_schema)
BUCKETS_IN = Shuffled("buckets_in")  # BUCKET_SCHEMA, by band hash
VERIFY_SIGS = Shuffled("verify_sigs")  # key_signature_schema, by key (with verification)
# buckets: per band-hash partition
BUCKETS_DONE = Records("buckets/done")
VERIFY_IN = Shuffled("verify_in")  # CANDIDATE_SCHEMA, by the left key
# verify: per key partition, two hops
VERIFY_LEFT_DONE = Records("verify/left")
VERIFY_RIGHT = Shuffled("verify_right")  # verify_right_schema, by the right key
VERIFY_RIGHT_DONE = Records("verify/right")


# cc: rounds of contract and resolve tasks, then settle (pipeline.job.components); labels by split
def cc_work(round_number: int) -> Shuffled:
    """Round ``round_number``'s edges and notes, by node; the producers of the edges send round 1's."""
    return Shuffled(f"cc/r{round_number:03d}/work")


def cc_resolve(round_number: int) -> Shuffled:
    """The fates decided in the round before and the requests waiting on them, by node."""
    return Shuffled(f"cc/r{round_number:03d}/resolve")


def cc_done(round_number: int, kind: str) -> Records:
    """Completion records of one round's ``contract`` or ``resolve`` tasks."""
    return Records(f"cc/done/r{round_number:03d}-{kind}")


def edges_from(source: int) -> str:
    """The sending-side name of the edges one partition's task sends to round 1."""
    return f"from-{source:05d}"


CC_SETTLE = Shuffled("cc/settle")  # components.SETTLE_SCHEMA: moves and the replies to them, by slot
CC_FINAL = "cc/final.parquet"  # components.FINAL_SCHEMA: the labels of the round that finished the rest
CC_SETTLE_DONE = Records("cc/done/settle")
LABELS = BySplit("labels")  # components.LABEL_SCHEMA: every clustered key's label, by split
# clusters: per split, per label partition, per split, then per survivor-key partition (exact.exact_clusters)
CLUSTER_MAP_DONE = Records("clusters/map")
REPS_IN = Shuffled("reps_in")  # reps_schema: a split's best member of each cluster, by label
CLUSTERS_DONE = Records("clusters/done")
CLUSTER_REPS = BySplit("cluster_reps")  # cluster_reps_schema: each cluster's survivor, to every split holding it
CLUSTER_MEMBERS_DONE = Records("clusters/members")
CLUSTERS_OUT = PerSplit("clusters_out")  # CLUSTER_OUT_SCHEMA: the split's clustered documents
CLUSTERED_SURVIVORS = Shuffled("clustered_survivors")  # CLUSTER_OF_SCHEMA: members with exact copies, by key
EXACT_CLUSTERS_DONE = Records("clusters/exact")
EXACT_CLUSTERS = BySplit("exact_clusters")  # EXACT_CLUSTER_SCHEMA: exact groups' final clusters, by split
# against (--against with sorted index files; pipeline.job.earlier): per band partition, per index file
EARLIER_PROBE_DONE = Records("against/probe")
EARLIER_KEYS = Shuffled("against/keys")  # earlier.KEY_SCHEMA: earlier documents a probe found, by pseudo-split
EARLIER_FETCH_DONE = Records("against/fetch")  # then sigs/ of the pseudo-split: those documents' rows
# spans (--spans): per split, then per span-hash partition (pipeline.job.spans)
SPANS_MAP_DONE = Records("spans/map")
SPAN_ROWS = PerSplit("spans/rows")  # spans.SPAN_ROWS_SCHEMA: every span of the split's kept documents
SPANS_IN = Shuffled("spans_in")  # spans.SPANS_IN_SCHEMA: one row per (document, span hash), by hash
SPANS_DONE = Records("spans/done")
SPANS_OUT = BySplit("spans_out")  # spans.SPANS_OUT_SCHEMA: the spans each document loses, by split
# write: per split
WRITE_DONE = Records("write/done")
STATS_IN = Shuffled("stats_in")  # STATS_SCHEMA: each split's rows per (breakdown, key), by key-hash range
# stats: per key-hash range, into stats_file()
STATS_DONE = Records("stats/done")


# -- beside the corpus: listed in its manifest ------------------------------------------------------
def index_file(split: int, fingerprint: str) -> str:
    """A split's signature index file, relative to the corpus folder."""
    return f"{INDEX_FOLDER}/index-{split:05d}-{fingerprint[:12]}.parquet"


def band_file(split: int, fingerprint: str) -> str:
    """The band file beside a split's signature index file, relative to the corpus folder."""
    return f"{INDEX_FOLDER}/bands-{split:05d}-{fingerprint[:12]}.parquet"


def spans_cut_file(split: int, fingerprint: str) -> str:
    """A split's record of the spans it cut (``--spans`` with ``--removed``), relative to the removed corpus."""
    return f"{SPANS_CUT_FOLDER}/cut-{split:05d}-{fingerprint[:12]}.parquet"


def span_index_file(split: int, fingerprint: str) -> str:
    """A split's span index file (``--spans``: the spans its kept documents hold), relative to the corpus."""
    return f"{SPANS_CUT_FOLDER}/index-{split:05d}-{fingerprint[:12]}.parquet"


def rejects_file(fingerprint: str) -> str:
    """The run's rejects file, relative to the corpus folder."""
    return f"{REJECTS_FOLDER}/rejects-{fingerprint[:12]}.parquet"


def stats_file(fingerprint: str, part: int) -> str:
    """One key-hash range of the run's statistics table, relative to the corpus folder."""
    return f"{STATS_FOLDER}/stats-{fingerprint[:12]}-{part:05d}.parquet"


# -- work schemas ------------------------------------------------------------------------------------
DOC_SCHEMA = pa.schema([
    ("key", pa.int64()), ("id", pa.string()), ("text", pa.string()), ("source", pa.string()),
    ("domain", pa.string()), ("language", pa.string()), ("fetch_time", pa.timestamp("ms", tz="UTC")),
    ("content_hash", pa.string()), ("length", pa.int64()), ("origin", pa.string()),
    ("prefer", pa.int64()),  # the survivor policy's key (pipeline.job.prefer), higher wins
])
# What the survivor choice carries besides ``length``: the policy's key, and the domain, so that each
# removed document learns its survivor's domain (the statistics' ``lost_to``). An earlier corpus's
# rows (--against) have neither: see with_survivor_columns.
SURVIVOR_FIELDS = [pa.field("prefer", pa.int64()), pa.field("domain", pa.string())]
EXACT_SCHEMA = pa.schema([
    ("content_hash", pa.string()), ("key", pa.int64()), ("id", pa.string()), ("length", pa.int64()),
    ("existing", pa.bool_()), ("count", pa.int64()),
])
EXACT_IN_SCHEMA = pa.schema([*EXACT_SCHEMA, *SURVIVOR_FIELDS])  # EXACT_SCHEMA: an earlier corpus's rows
EXACT_OUT_SCHEMA = pa.schema([
    ("content_hash", pa.string()), ("key", pa.int64()), ("rep_key", pa.int64()), ("rep_id", pa.string()),
    ("copies", pa.int64()), ("rep_domain", pa.string()),
])
BUCKET_SCHEMA = pa.schema([("hash", pa.uint64()), ("key", pa.int64())])
CANDIDATE_SCHEMA = pa.schema([("left", pa.int64()), ("right", pa.int64())])
CLUSTER_OUT_SCHEMA = pa.schema([
    ("key", pa.int64()), ("cluster_id", pa.string()), ("cluster_size", pa.int64()), ("rep_key", pa.int64()),
    ("rep_id", pa.string()), ("similarity", pa.float64()), ("rep_domain", pa.string()),
])
EXACT_BY_REP_SCHEMA = pa.schema([("key", pa.int64()), ("rep_key", pa.int64())])
CLUSTER_OF_SCHEMA = pa.schema([("key", pa.int64()), ("cluster_id", pa.string()), ("cluster_size", pa.int64()),
                               ("rep_domain", pa.string())])
EXACT_CLUSTER_SCHEMA = pa.schema([*EXACT_BY_REP_SCHEMA, *CLUSTER_OF_SCHEMA.remove(0)])


def with_survivor_columns(table: pa.Table) -> pa.Table:
    """``table`` with the SURVIVOR_FIELDS it lacks: an earlier corpus's rows (``gristmill.pipeline.job.earlier``)
    get preference 0 and no domain; they win their group by ``existing`` whatever the policy."""
    missing = {"prefer": lambda n: pa.array(np.zeros(n, np.int64)), "domain": lambda n: pa.nulls(n, pa.string())}
    for spec in SURVIVOR_FIELDS:
        if spec.name not in table.column_names:
            table = table.append_column(spec, missing[spec.name](table.num_rows))
    return table


def key_signature_schema(num_perm: int) -> pa.Schema:
    """Signed documents' signatures on their way to verification, by key."""
    return pa.schema([("key", pa.int64()), ("signature", pa.list_(pa.uint64(), num_perm))])


def verify_right_schema(num_perm: int) -> pa.Schema:
    """Candidate edges on their way to the right key's partition, carrying the left key's signature."""
    return CANDIDATE_SCHEMA.append(pa.field("left_signature", pa.list_(pa.uint64(), num_perm)))


def reps_schema(num_perm: int) -> pa.Schema:
    """A split's best member of a cluster, with the documents (exact copies included) the split holds
    of it in ``copies``, shuffled by label for the survivor choice."""
    return pa.schema([("key", pa.int64()), ("id", pa.string()), ("length", pa.int64()),
                      ("copies", pa.int64()), ("existing", pa.bool_()), *SURVIVOR_FIELDS,
                      ("signature", pa.list_(pa.uint64(), num_perm)), ("label", pa.int64())])


def cluster_reps_schema(num_perm: int) -> pa.Schema:
    """A cluster's survivor and size, on its way back to a split that holds members (``key``: the
    split's best member)."""
    return pa.schema([("key", pa.int64()), ("label", pa.int64()), ("rep_key", pa.int64()), ("rep_id", pa.string()),
                      ("cluster_size", pa.int64()), ("rep_signature", pa.list_(pa.uint64(), num_perm)),
                      ("rep_domain", pa.string())])


def sig_schema(num_perm: int, bands: int) -> pa.Schema:
    """A split's signed documents: the exact survivors (and --against index rows) with signatures and bands."""
    return pa.schema([
        ("key", pa.int64()), ("id", pa.string()), ("content_hash", pa.string()), ("length", pa.int64()),
        ("copies", pa.int64()), ("existing", pa.bool_()),
        ("signature", pa.list_(pa.uint64(), num_perm)), ("bands", pa.list_(pa.uint64(), bands)),
    ])


def signed_schema(num_perm: int, bands: int) -> pa.Schema:
    """A new-input split's signed documents: ``sig_schema`` with the SURVIVOR_FIELDS."""
    return pa.schema([*sig_schema(num_perm, bands), *SURVIVOR_FIELDS])


def hash_signature_schema(num_perm: int) -> pa.Schema:
    """One MinHash signature per distinct content hash of a split (the read stage signs as it reads)."""
    return pa.schema([("content_hash", pa.string()), ("signature", pa.list_(pa.uint64(), num_perm))])
