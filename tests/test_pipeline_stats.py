"""Statistics out of the driver and the manifest: the breakdowns as a Parquet table beside the corpus,
summed by reduce tasks on a real local Ray; the manifest keeps the totals and the top keys."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gristmill.pipeline.cli import main
from gristmill.pipeline.format import Corpus, CorpusError
from gristmill.pipeline.format.schemas import STATS_SCHEMA
from gristmill.pipeline.format.stats_table import TOP_KEYS, full_stats
from gristmill.pipeline.job import DedupConfig, run_dedup

pytestmark = pytest.mark.timeout(240)

DOMAINS = 50_000


def _many_domains(root: Path) -> dict[str, int]:
    """Four JSONL files, one document per domain plus exact copies in the domains of some, and bad lines."""
    root.mkdir()
    expected = {"input": 0, "rejected": 0}
    for part in range(4):
        with open(root / f"part{part}.jsonl", "w") as out:
            for i in range(part, DOMAINS, 4):
                text = f"page {i} of site {i} says {i * 7919 % 10007} and {i * 104729 % 99991} things"
                out.write(json.dumps({"id": f"d{i}", "text": text, "url": f"https://d{i}.example/"}) + "\n")
                expected["input"] += 1
                if i % 50 == 0:  # an exact copy in the same domain
                    out.write(json.dumps({"id": f"c{i}", "text": text, "url": f"https://d{i}.example/copy"}) + "\n")
                    expected["input"] += 1
            out.write("{not json\n")
            expected["input"] += 1
            expected["rejected"] += 1
    return expected


def test_fifty_thousand_domains_keep_the_manifest_small_and_stats_whole(
        ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from gristmill.pipeline.job import stats as job_stats

    expected = _many_domains(tmp_path / "raw")
    monkeypatch.setattr(job_stats, "STATS_ROWS_PER_TASK", 40_000)  # several reduce tasks, each a file
    out = str(tmp_path / "corpus")
    stats = run_dedup(DedupConfig(inputs=[str(tmp_path / "raw")], output=out, split_bytes=1_000_000,
                                  num_partitions=3))
    docs = stats["documents"]
    assert docs["input"] == expected["input"] and docs["rejected"] == expected["rejected"]
    assert docs["exact_duplicate"] == DOMAINS // 50
    # the manifest: totals, the top keys and how many keys there are; not 50,000 domains
    assert (tmp_path / "corpus" / "_manifest.json").stat().st_size < 64 * 1024
    assert len(stats["by_domain"]) == TOP_KEYS and stats["breakdown_keys"]["by_domain"] == DOMAINS
    corpus = Corpus.open(out)
    files = corpus.manifest.extra["stats_table"]["files"]
    assert len(files) > 1 and all(name.startswith("_stats/stats-") for name in files)
    # the copies' domains have 2 documents in; they lead the top keys, then by name
    top = list(stats["by_domain"])
    assert top == sorted(top, key=lambda d: (-stats["by_domain"][d]["input"], d))
    assert all(stats["by_domain"][d]["input"] == 2 and stats["by_domain"][d]["exact_duplicate"] == 1 for d in top)

    assert main(["stats", out, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    by_domain = shown["by_domain"]
    assert len(by_domain) == DOMAINS
    assert shown["documents"] == docs
    for outcome in ("input", "kept", "exact_duplicate", "near_duplicate"):
        assert sum(row[outcome] for row in by_domain.values()) == docs[outcome] - (
            docs["rejected"] if outcome == "input" else 0)
    assert sum(row["input"] for row in shown["by_source"].values()) == docs["input"]
    assert sum(row["rejected"] for row in shown["by_source"].values()) == docs["rejected"]
    assert sum(row["kept_bytes"] for row in by_domain.values()) == stats["bytes"]["kept"]
    # every domain's kept count is what the corpus holds
    kept = Counter(corpus.to_table(["domain"])["domain"].to_pylist())
    assert {d: row["kept"] for d, row in by_domain.items()} == dict(kept)
    assert shown["cluster_sizes"] == {"2": DOMAINS // 50}

    assert main(["stats", out]) == 0
    assert f"... and {DOMAINS - 10:,} more" in capsys.readouterr().out


def test_an_older_corpus_without_a_table_reads_its_breakdowns_from_the_manifest(tmp_path: Path) -> None:
    from gristmill.pipeline.format import CORPUS_SCHEMA, write_manifest

    stats = {"documents": {"input": 3, "kept": 3}, "by_domain": {"a": {"input": 2}, "b": {"input": 1}}}
    (tmp_path / "old").mkdir()
    write_manifest(str(tmp_path / "old"), [], CORPUS_SCHEMA, stats=stats)
    assert full_stats(Corpus.open(str(tmp_path / "old"))) == stats


def test_a_stats_table_path_outside_the_corpus_is_refused(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from gristmill.pipeline.format import CORPUS_SCHEMA, write_manifest

    pq.write_table(STATS_SCHEMA.empty_table(), tmp_path / "elsewhere.parquet")
    (tmp_path / "c").mkdir()
    write_manifest(str(tmp_path / "c"), [], CORPUS_SCHEMA, stats={"documents": {}},
                   extra={"stats_table": {"files": ["../elsewhere.parquet"]}})
    with pytest.raises(CorpusError, match="climbs out"):
        full_stats(Corpus.open(str(tmp_path / "c")))
