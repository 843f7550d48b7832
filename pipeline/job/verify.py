"""Stage ``verify`` (unless ``--no-verify``): each candidate edge joined with its two documents'
signatures; only edges whose estimated Jaccard reaches the threshold enter connected components.

Signatures and edges meet by key partition, never by split: ``sign`` sends every signed document's
signature to the partition of its key (``verify_sigs``), ``buckets`` sends each edge to the partition
of its left key (``verify_in``). Hop 1, per key partition: edges get their left signature and go on
to the partition of their right key (``verify_right``); hop 2: the right signature, the estimate, and
the kept edges to connected components. Hop 2 also keeps every pair whose estimate reaches the pairs
table's floor (``gristmill.pipeline.format.pairs_table``) beside the corpus, streamed a batch at a time, so
``gristmill clusters --what-if`` can recut the clusters at another threshold. Each hop writes one file per task: S + P files per shuffle,
where routing by (left split, right split) made up to S x S. A task holds its partition's signatures
and one sending task's edges at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from gristmill.pipeline.format.pairs_table import (
    PAIRS_SCHEMA,
    min_matches,
    pairs_entry,
    pairs_file,
    pairs_floor,
)
from gristmill.pipeline.format.signature_index import list_matrix
from gristmill.pipeline.job.buckets import EdgeSender
from gristmill.pipeline.job.config import DedupError
from gristmill.pipeline.job.datasets import (
    VERIFY_IN,
    VERIFY_LEFT_DONE,
    VERIFY_RIGHT,
    VERIFY_RIGHT_DONE,
    VERIFY_SIGS,
    edges_from,
    key_signature_schema,
    partition_name,
    split_name,
)
from gristmill.pipeline.job.inputs import KEY_BITS
from gristmill.pipeline.job.tasks import Job, run_once
from gristmill.pipeline.job.workdir import WorkDir, partition_of

PAIRS_BATCH = 1 << 20  # pairs a verify task holds before writing them as one row group (18 MiB)


def shuffle_signatures(job: Job, split_index: int, sigs: pa.Table, partitions: int) -> None:
    """The sending side: a split's (key, signature) rows to the partition of their key."""
    table = sigs.select(["key", "signature"])
    job.work.write_partitioned(VERIFY_SIGS, split_name(split_index), table,
                               partition_of(table["key"].to_numpy(), partitions), partitions)


class _Signatures:
    """The signatures of one key partition, looked up by key: the keys sorted once (8 bytes a row), the
    signatures left in the chunks they arrived in, so a partition is held once, not copied whole."""

    def __init__(self, job: Job, part: int) -> None:
        table = job.work.read_partition(VERIFY_SIGS, part, key_signature_schema(job.params.num_perm))
        keys = table["key"].to_numpy()
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]
        self.signatures = table["signature"]
        self.part = part

    def of(self, keys: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
        wanted = keys.to_numpy()
        where = np.searchsorted(self.keys, wanted)
        if not (where < len(self.keys)).all() or not np.array_equal(self.keys[where], wanted):
            raise DedupError(f"key partition {self.part}: a candidate edge names a document without a signature")
        return self.signatures.take(self.order[where])


def _verify_left(job: Job, part: int, partitions: int) -> dict[str, Any]:
    """Hop 1: edges whose left key is in this partition get its signature, then go to the right key's."""

    def compute() -> dict[str, Any]:
        signatures = _Signatures(job, part)
        candidates = 0
        with job.work.partitioned_writer(VERIFY_RIGHT, partition_name(part), partitions,
                                         job.config.send_bytes) as out:
            for edges in job.work.partition_tables(VERIFY_IN, part):
                edges = edges.append_column("left_signature", signatures.of(edges["left"]))
                out.write(edges, partition_of(edges["right"].to_numpy(), partitions))
                candidates += edges.num_rows
        return {"candidates": candidates}

    return run_once(job.work, VERIFY_LEFT_DONE.partition(part), compute)


def _verify_right(job: Job, part: int, cc_fine: int) -> dict[str, Any]:
    """Hop 2: the right key's signature; edges at or above the threshold are seeded into connected
    components (``cc_fine`` hash ranges); pairs at or above the pairs floor go to the pairs table."""

    def compute() -> dict[str, Any]:
        from gristmill.dedup.lsh import estimated_jaccard

        num_perm = job.params.num_perm
        signatures = _Signatures(job, part)
        sender = EdgeSender(job, edges_from(part), cc_fine)
        candidates, kept, stored = 0, 0, 0
        floor = min_matches(pairs_floor(job.params.threshold), num_perm)
        output = WorkDir(job.config.output, job.config.storage_options, spread_keys=False)
        with output.table_writer(pairs_file(job.fingerprint, part), PAIRS_SCHEMA) as pairs:
            held: list[pa.Table] = []
            held_rows = 0
            for edges in job.work.partition_tables(VERIFY_RIGHT, part):
                similar = estimated_jaccard(list_matrix(edges["left_signature"], num_perm),
                                            list_matrix(signatures.of(edges["right"]), num_perm))
                close = similar >= job.params.threshold  # the test dedup.verify_edges applies
                matches = np.rint(similar * num_perm)  # exact: similar is a count over num_perm
                left, right = edges["left"].to_numpy(), edges["right"].to_numpy()
                sender.add(left[close], right[close])
                candidates, kept = candidates + edges.num_rows, kept + int(np.count_nonzero(close))
                near = matches >= floor
                held.append(pa.table([left[near], right[near], matches[near].astype(np.uint16)], schema=PAIRS_SCHEMA))
                held_rows += int(np.count_nonzero(near))
                if held_rows >= PAIRS_BATCH:
                    pairs.write_table(pa.concat_tables(held))
                    stored, held, held_rows = stored + held_rows, [], 0
            if held_rows:
                pairs.write_table(pa.concat_tables(held))
                stored += held_rows
        return {"candidates": candidates, "edges": kept, "seeded": sender.close(), "pairs": stored}

    return run_once(job.work, VERIFY_RIGHT_DONE.partition(part), compute)


def run_verify(job: Job, partitions: int, cc_fine: int, run_tasks: Callable[..., list[Any]]) -> dict[str, Any]:
    """The stage: both hops over every key partition; the candidate and verified edge counts, the rows
    seeded into connected components, and the pairs table's manifest entry (``pairs``)."""
    indices = range(partitions)
    run_tasks(_verify_left, [(job, p, partitions) for p in indices], receives=[VERIFY_SIGS, VERIFY_IN])
    records = run_tasks(_verify_right, [(job, p, cc_fine) for p in indices], receives=[VERIFY_SIGS, VERIFY_RIGHT])
    totals: dict[str, Any] = {name: sum(r[key] for r in records) for name, key in (
        ("candidates", "candidates"), ("verified", "edges"), ("seeded", "seeded"))}
    totals["pairs"] = pairs_entry([pairs_file(job.fingerprint, p) for p in indices], job.params.threshold,
                                  job.params.num_perm, len(job.index_files), KEY_BITS,
                                  sum(r["pairs"] for r in records))
    return totals
