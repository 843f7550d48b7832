"""A giant cluster through the Ray job (real local Ray, real Parquet and JSONL): one boilerplate page in
20,000 near copies and 2,000 exact copies. Every connected-components task reads at most twice its row
budget and no clusters reducer holds the cluster's members (the completion records say what each
task read); the accounting adds up and every row's cluster equals the in-memory oracle's.
benchmarks/hot_cluster.py runs the same check on a 220,000-document cluster."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_pipeline_data import documents

from gristmill.dedup import deduplicate
from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job import DedupConfig, run_dedup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from hot_cluster import check, hot_texts, task_rows, write_jsonl  # noqa: E402

pytestmark = pytest.mark.timeout(300)
MEMBERS, BUDGET = 20_000, 2_048


def test_a_20k_member_cluster_keeps_every_task_within_its_budget(ray_local: None, tmp_path: Path) -> None:
    texts = documents(40) + hot_texts(MEMBERS)  # a few ordinary clusters beside the hot one
    write_jsonl(tmp_path / "in", texts, 6)
    out, removed = tmp_path / "out", tmp_path / "removed"
    stats = run_dedup(DedupConfig(inputs=[str(tmp_path / "in")], output=str(out), removed=str(removed),
                                  keep_work=True, split_bytes=4 * 1024 * 1024, cc_rows_per_task=BUDGET))
    check(stats, task_rows(out / "_work"), BUDGET)
    assert stats["components"]["partitions"] >= 10 and stats["components"]["rounds"] >= 3  # it was spread
    assert int(max(stats["cluster_sizes"], key=int)) == MEMBERS + MEMBERS // 10
    rows = Corpus.open(str(out)).to_table().to_pylist() + Corpus.open(str(removed)).to_table().to_pylist()
    assert len(rows) == stats["documents"]["input"] == len(texts)
    oracle = deduplicate([r["text"] for r in rows], [r["id"] for r in rows], threshold=0.8, num_perm=128,
                         ngram=5).table.to_pylist()
    assert {r["id"]: (r["cluster_id"], r["cluster_size"]) for r in rows} == {
        r["id"]: (r["cluster_id"], r["cluster_size"]) for r in oracle}
