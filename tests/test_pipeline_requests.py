"""Requests to the store per stage of the dedup job on S3 stay within the documented model.

The job runs on moto's S3 server behind the counting proxy (benchmarks/shaped_store.py) with more
partitions than splits, so a shuffle whose receivers read every sender (S x P) cannot meet a bound
that grows as S + P (``stage_requests`` in benchmarks/pipeline_requests.py, docs/BENCHMARKS.md).
The statistics stage gets as many reducers as the other shuffles (``STATS_ROWS_PER_TASK`` lowered),
so its reducers reading every split's table (S x P_stats) cannot fit either. Counts, not times; and
the bytes the read stage downloads of a cut input file.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
import s3fs

from gristmill.pipeline.format import Corpus
from gristmill.pipeline.format.stats_table import BREAKDOWNS
from gristmill.pipeline.job import DedupConfig, run_dedup, workdir
from gristmill.pipeline.job import stats as job_stats
from gristmill.pipeline.job.inputs.streams import TAIL_BYTES
from tests.test_pipeline_data import documents

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from pipeline_requests import KINDS, StageMarks, stage_requests  # noqa: E402
from shaped_store import ShapedStore  # noqa: E402

pytestmark = pytest.mark.timeout(600)
SPLITS, PARTITIONS = 8, 12


def _run(store: ShapedStore, bucket: str, inputs: Path, split_bytes: int) -> tuple[dict[str, Counter], dict]:
    # s3fs's default client cache (one client per process, what a user's job gets): the same requests per
    # stage as a new client per open (skip_instance_cache, 0.13-0.3 CPU s a client), one LIST fewer in
    # `plan`, and the S3 run took 19 s where it took 138 s (most of this test's time)
    storage = {"client_kwargs": {"endpoint_url": store.endpoint}}
    fs = s3fs.S3FileSystem(**storage)
    for path in sorted(inputs.iterdir()):
        fs.put_file(str(path), f"{bucket}/in/{path.name}".removeprefix("s3://"))
    store.reset_stats()
    marks = StageMarks(store)
    stats = run_dedup(DedupConfig(inputs=[f"{bucket}/in"], output=f"{bucket}/out", storage_options=storage,
                                  split_bytes=split_bytes, num_partitions=PARTITIONS), progress=marks)
    return marks.per_stage(), stats


def test_requests_per_stage_grow_as_splits_plus_partitions_not_their_product(
        ray_local: None, store: ShapedStore, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = documents(96)
    # at most one row per breakdown per document: PARTITIONS statistics reducers, and one domain per
    # document, so that reducers reading every split's table (S x P_stats) would have several too
    monkeypatch.setattr(job_stats, "STATS_ROWS_PER_TASK", -(-len(texts) * len(BREAKDOWNS) // PARTITIONS))
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "docs.jsonl").write_text("".join(json.dumps({"id": str(i), "text": text, "domain": f"d{i}.example"})
                                               + "\n" for i, text in enumerate(texts)))
    split_bytes = (inputs / "docs.jsonl").stat().st_size // SPLITS + 1  # the file cut into SPLITS pieces
    per_stage, stats = _run(store, s3_bucket, inputs, split_bytes)
    splits = stats["splits"]
    assert splits == SPLITS and splits * PARTITIONS > 4 * (splits + PARTITIONS)  # a product could not fit
    remote = Corpus.open(f"{s3_bucket}/out", {"client_kwargs": {"endpoint_url": store.endpoint}})
    partitions = {"stats": len(remote.manifest.extra["stats_table"]["files"])}  # one file per reducer
    assert partitions["stats"] > 1
    bound = {stage: stage_requests(stage, splits, partitions.get(stage, PARTITIONS)) for stage in per_stage}
    over = {stage: (sum(counts.values()), bound[stage]) for stage, counts in per_stage.items()
            if sum(counts.values()) > bound[stage]}
    assert not over, over  # stage: (measured, model)
    kinds = sum(per_stage.values(), Counter())
    assert set(kinds) <= set(KINDS) and kinds["COPY"] == 0  # final names written directly: no rename
    # the cut file is downloaded once: its newline count fetches the bytes its read parses (it was
    # counted, then read: 2x), plus the record crossing each cut, which the piece it starts in reads on
    # in ranges doubling from TAIL_BYTES (here lines of up to 100 KB against pieces of 174 KB; at the
    # default 64 MiB splits that is under 0.1 %: docs/BENCHMARKS.md)
    data = (inputs / "docs.jsonl").read_bytes()
    crossing = [data.index(b"\n", cut - 1) + 1 - cut for cut in range(split_bytes, len(data), split_bytes)]
    downloaded = sum(n for path, n in store.stats()["sent_by_path"].items() if "/in/" in path)
    assert len(data) <= downloaded <= len(data) + sum(TAIL_BYTES + 2 * n for n in crossing)
    # and the corpus is the one a local run gives
    local = tmp_path / "local"
    run_dedup(DedupConfig(inputs=[str(inputs)], output=str(local), split_bytes=split_bytes, num_partitions=PARTITIONS))
    kept = remote.to_table(columns=["id"])["id"].to_pylist()
    assert kept == Corpus.open(str(local)).to_table(columns=["id"])["id"].to_pylist()
    assert len(kept) < 96  # near and exact copies were removed


def test_a_throttled_work_folder_read_is_retried_and_a_missing_record_is_not(
        store: ShapedStore, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)  # s3fs's own retries off: the work folder's are seen
    monkeypatch.setattr(workdir, "RETRY_BASE_S", 0.01)
    options = {"client_kwargs": {"endpoint_url": store.endpoint},
               "config_kwargs": {"retries": {"total_max_attempts": 1}}, "skip_instance_cache": True}
    work = workdir.WorkDir(f"{s3_bucket}/work", options)
    work.write_json("read/done/s=00000.json", {"docs": 3})
    key = work.path("read/done/s=00000.json").split("/", 1)[1]
    assert work.path("read/done/s=00000.json") != f"{s3_bucket.removeprefix('s3://')}/work/read/done/s=00000.json"
    store.fail(f"*/{key}", count=3)  # three 503 SlowDown in a row, then the object
    assert work.read_json("read/done/s=00000.json") == {"docs": 3}
    store.fail(f"*/{key}", count=None)  # a store that never stops throttling: the key named, not a wrong answer
    with pytest.raises(OSError, match="s=00000.json: still failing"):
        work.read_json("read/done/s=00000.json")
    store.clear_faults()
    before = len(store.log)
    assert work.read_json("read/done/s=00001.json") is None  # never completed: one GET, no retry
    assert [kind for kind, _ in store.log[before:]] == ["GET"]
