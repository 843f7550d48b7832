"""Shuffles with one file per sending task: the partitioned file format and the external sort on their
own, then the job on a real local Ray: files per shuffle bounded by c(S + P) where one file per (task,
partition) would have made S x P, the same corpus for any partition count or spill budget, and a text
copied more often than there are splits reaching its reducer as at most one row per split."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_pipeline_data import documents, write_jsonl

from gristmill.pipeline.commands.options import error_line
from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job import DedupConfig, DedupError, run_dedup
from gristmill.pipeline.job.datasets import EXACT_IN, EXACT_IN_SCHEMA, Shuffled
from gristmill.pipeline.job.exchange import prepare
from gristmill.pipeline.job.spill import ExternalSort
from gristmill.pipeline.job.workdir import WorkDir

pytestmark = pytest.mark.timeout(300)

SPLITS = 12
PARTITIONS = 8
HOT_COPIES = 5  # of one boilerplate text per file: 60 in all, more than there are splits


# -- the format ---------------------------------------------------------------------------------------
def _rows(seed: int, count: int) -> tuple[pa.Table, np.ndarray]:
    rng = np.random.default_rng(seed)
    table = pa.table({"key": pa.array(np.arange(count) + seed * 10_000, pa.int64()),
                      "name": [f"row-{seed}-{i}" for i in range(count)]})
    return table, rng.integers(0, 7, count)


def test_a_partitioned_file_gives_each_destination_exactly_its_rows_in_order_across_runs(tmp_path: Path) -> None:
    work = WorkDir(str(tmp_path / "work"))
    dataset = Shuffled("shuffle")
    batches = [_rows(seed, 300) for seed in range(4)]
    with work.partitioned_writer(dataset, "task", 7, budget_bytes=4_000) as writer:  # a run every batch or so
        for table, destination in batches:
            writer.write(table, destination)
    assert [p.name for p in (tmp_path / "work" / "shuffle").iterdir()] == ["task.part"]  # one file, no temporary
    everything = pa.concat_tables([t for t, _ in batches])
    destinations = np.concatenate([d for _, d in batches])
    segments = 0
    for destination in range(7):
        tables = list(work.partition_tables(dataset, destination))
        segments += len(tables)
        expected = everything.filter(pa.array(destinations == destination))
        assert work.read_partition(dataset, destination, everything.schema).equals(expected)
    assert segments > 7  # several runs: a destination's rows came in more than one segment
    assert work.read_partition(dataset, 7, everything.schema).num_rows == 0  # past the destinations


def test_a_file_routed_to_splits_knows_its_destinations_from_its_rows(tmp_path: Path) -> None:
    work = WorkDir(str(tmp_path / "work"))
    dataset = Shuffled("to-splits")
    table, _ = _rows(1, 50)
    work.write_partitioned(dataset, "p=00000", table, np.full(50, 3))
    work.write_partitioned(dataset, "p=00001", table.slice(0, 0), np.zeros(0, np.int64))  # an empty sender
    assert work.read_partition(dataset, 3, table.schema).equals(table)
    assert sum(t.num_rows for d in (0, 1, 2, 4, 99) for t in work.partition_tables(dataset, d)) == 0
    (tmp_path / "work" / "to-splits" / "p=00000.part").write_bytes(b"not a partitioned file at all")
    with pytest.raises(ValueError, match="not a partitioned work file"):
        work.read_partition(dataset, 3, table.schema)


def test_external_sort_spills_past_its_budget_and_gives_the_in_memory_order() -> None:
    rng = np.random.default_rng(5)
    tables = [pa.table({"hash": pa.array(rng.integers(0, 50, 2_000).astype(np.uint64)),
                        "key": pa.array(rng.integers(0, 1 << 40, 2_000), pa.int64())}) for _ in range(6)]
    expected = pa.concat_tables(tables).sort_by([("hash", "ascending"), ("key", "ascending")])
    in_memory = ExternalSort(["hash", "key"], 1 << 30)
    assert pa.concat_tables(list(in_memory.sorted(iter(tables)))).equals(expected) and in_memory.runs == 0
    spilling = ExternalSort(["hash", "key"], 20_000)  # under one table's 32,000 bytes: a run per table
    out = list(spilling.sorted(iter(tables)))
    assert spilling.runs == len(tables) and len(out) > 1
    assert pa.concat_tables(out).equals(expected)


# -- the job ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SPLITS compressed files (read whole: each is a split of its own with a 1-byte split budget), each
    with HOT_COPIES copies of one boilerplate text."""
    root = tmp_path_factory.mktemp("shuffle-input")
    texts = documents(60)
    hot = "Terms of use. " + texts[0]
    for i in range(SPLITS):
        write_jsonl(root / f"part{i:02d}.jsonl.gz", texts[i::SPLITS] + [hot] * HOT_COPIES, prefix=f"f{i}-")
    return root


def _run(inputs: Path, out: Path, **options: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    stats = run_dedup(DedupConfig(inputs=[str(inputs)], output=str(out), split_bytes=1, keep_work=True, **options))
    counts = stats["documents"]
    assert counts["input"] == counts["kept"] + counts["exact_duplicate"] + counts["near_duplicate"] + counts["rejected"]
    assert counts["input"] == len(documents(60)) + SPLITS * HOT_COPIES and counts["rejected"] == 0
    return [s.to_dict() for s in Corpus.open(str(out)).shards], stats


def _files_per_shuffle(work: Path) -> Counter[str]:
    return Counter(str(path.parent.relative_to(work)) for path in work.rglob("*.part"))


@pytest.fixture(scope="module")
def reference(ray_local: None, inputs: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    out = tmp_path_factory.mktemp("reference") / "corpus"
    shards, _ = _run(inputs, out, num_partitions=PARTITIONS)
    return out, shards


def test_every_shuffle_writes_at_most_c_times_splits_plus_partitions_files(reference: tuple[Path, list]) -> None:
    work = reference[0] / "_work"
    splits = len(list((work / "docs").glob("*.parquet")))
    assert splits == SPLITS
    bound = 2 * (splits + PARTITIONS)
    assert splits * PARTITIONS > bound  # one file per (sending task, partition) could not meet it
    shuffles = _files_per_shuffle(work)
    for folder in ("exact_in", "exact_out", "exact_by_rep", "buckets_in", "verify_sigs", "verify_in",
                   "verify_right", "exact_clusters", "labels"):
        assert folder in shuffles  # the shuffles wrote their files where the test looks
    assert all(count <= bound for count in shuffles.values()), shuffles  # and so did every other one
    # one file per sending task: the split-side shuffles have one per split, the reducers' one per partition
    assert shuffles["exact_in"] == shuffles["buckets_in"] == shuffles["verify_sigs"] == splits
    assert shuffles["exact_out"] == shuffles["verify_right"] == shuffles["exact_clusters"] == PARTITIONS


def test_a_text_copied_more_often_than_there_are_splits_reaches_its_reducer_as_one_row_per_split(
        reference: tuple[Path, list]) -> None:
    work = WorkDir(str(reference[0] / "_work"))
    rows = pa.concat_tables([work.read_partition(EXACT_IN, p, EXACT_IN_SCHEMA) for p in range(PARTITIONS)])
    per_text = rows.group_by("content_hash").aggregate([("count", "sum"), ("count", "count")])
    hot = per_text.filter(pc.equal(per_text["count_sum"], pc.max(per_text["count_sum"])))
    assert hot["count_sum"][0].as_py() >= SPLITS * HOT_COPIES  # the hot text's copies, all counted
    assert hot["count_count"][0].as_py() <= SPLITS  # ... in at most one row per split


def test_partition_counts_budgets_and_a_tiny_spill_budget_give_the_same_corpus(
        ray_local: None, inputs: Path, reference: tuple[Path, list], tmp_path: Path) -> None:
    by_rows, _ = _run(inputs, tmp_path / "by-rows")  # partitions follow the rows: one each at this size
    assert by_rows == reference[1]
    assert _files_per_shuffle(tmp_path / "by-rows" / "_work")["exact_out"] == 1
    small, _ = _run(inputs, tmp_path / "small", partition_bytes=4_096)  # a smaller reducer budget: more of them
    assert small == reference[1]
    assert _files_per_shuffle(tmp_path / "small" / "_work")["exact_out"] > 1
    spilled, _ = _run(inputs, tmp_path / "spilled", num_partitions=3, spill_bytes=2_048)
    assert spilled == reference[1]
    buckets = json.loads((tmp_path / "spilled" / "_work" / "stage-buckets.json").read_text())["result"]
    assert sum(r["spilled_runs"] for r in buckets) > len(buckets)  # the reducers sorted by spilling runs
    files = _files_per_shuffle(tmp_path / "spilled" / "_work")
    assert files["exact_in"] == SPLITS and files["exact_out"] == 3
    # without verification the buckets reducers seed connected components a budget of edges at a time
    linked, _ = _run(inputs, tmp_path / "linked", verify=False, num_partitions=PARTITIONS)
    linked_spilled, _ = _run(inputs, tmp_path / "linked-spilled", verify=False, num_partitions=3, spill_bytes=256)
    assert linked_spilled == linked
    assert _files_per_shuffle(tmp_path / "linked-spilled" / "_work")["cc/r001/work"] > 3  # batches of edges


@pytest.mark.parametrize("option", ["partition_bytes", "spill_bytes", "split_bytes", "cc_rows_per_task"])
def test_a_budget_that_is_not_positive_is_refused_before_any_work(option: str, inputs: Path, tmp_path: Path) -> None:
    with pytest.raises(DedupError, match="must be positive"):
        run_dedup(DedupConfig([str(inputs)], str(tmp_path / "out"), **{option: 0}))
    assert not (tmp_path / "out").exists()


class _RemoveOnBegin:
    """A progress display that removes ``path`` as ``stage`` begins: a work file gone under the job."""

    def __init__(self, stage: str, remove: Any) -> None:
        self.stage, self.remove = stage, remove

    def begin(self, stage: str, total_bytes: int | None = None) -> None:
        if stage == self.stage:
            self.remove()

    def task_done(self, result: dict[str, Any]) -> None:
        pass

    def end(self, stage: str, resumed: bool = False) -> None:
        pass


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_sender_file_missing_under_the_job_is_an_error_naming_it_not_a_smaller_dedup(
        where: str, ray_local: None, inputs: Path, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A bucket sender's file goes after the sign stage wrote it: a receiver that read the folder's listing
    found fewer candidate pairs and finished with exit 0; the senders are named by their records."""
    source, out, storage = str(inputs), str(tmp_path / "out"), {}
    if where == "s3":  # through the exchange: the broker's load task finds the file missing
        import s3fs

        bucket, server = request.getfixturevalue("s3_bucket"), request.getfixturevalue("s3_server")
        # this module's Ray workers started before the server set the credentials in the environment
        storage = {"key": "testing", "secret": "testing",
                   "client_kwargs": {"endpoint_url": server["endpoint_url"], "region_name": "us-east-1"}}
        s3fs.S3FileSystem(**storage).put(str(inputs), f"{bucket}/in", recursive=True)
        source, out = f"{bucket}/in", f"{bucket}/out"
    work = WorkDir(f"{out}/_work", storage)
    gone = work.path("buckets_in/s=00003.part")  # written by sign, read by buckets (under a hashed prefix on s3)
    config = DedupConfig(inputs=[source], output=out, split_bytes=1, num_partitions=PARTITIONS, storage_options=storage)
    with pytest.raises(FileNotFoundError) as raised:
        run_dedup(config, progress=_RemoveOnBegin("buckets", lambda: work.fs.rm(gone)))
    line = error_line(raised.value)
    assert gone.removeprefix("s3://") in line and "a shuffle's work file is missing (" in line and "\n" not in line
    assert not work.fs.exists(f"{out}/_manifest.json")  # nothing committed


def test_a_receiver_reads_the_senders_the_records_name_and_refuses_another_size(tmp_path: Path) -> None:
    work = WorkDir(str(tmp_path / "work"))
    dataset = Shuffled("named")
    table, destination = _rows(2, 40)
    work.write_partitioned(dataset, "s=00000", table, destination, 7)
    work.write_partitioned(dataset, "s=00001", table.slice(0, 5), destination[:5], 7)
    named = dict(work.sent)  # what the senders' completion records say (tasks.run_once)
    work.write_partitioned(dataset, "s=00002", table, destination, 7)  # a file no record names: not read
    prepare(work, [dataset], {dataset.folder: named})
    assert sum(t.num_rows for d in range(7) for t in work.partition_tables(dataset, d)) == 45
    (tmp_path / "work" / "named" / "s=00001.part").write_bytes((tmp_path / "work" / "named" / "s=00000.part").read_bytes())
    with pytest.raises(ValueError, match=r"s=00001.part: its index describes \d+ bytes where its sender's completion"):
        list(work.partition_tables(dataset, 0))
