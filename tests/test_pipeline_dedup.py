"""The Ray dedup job on a real local Ray (one ``ray.init`` for the module): accounting, agreement with
the in-memory ``gristmill.dedup.deduplicate``, incremental dedup, statistics, the command line and job file."""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_pipeline_data import MAX_DOC_BYTES, documents, mixed_input, near_copy, write_jsonl

from gristmill.dedup import deduplicate
from gristmill.pipeline.cli import main
from gristmill.pipeline.format import SOURCE_COLUMN, Corpus
from gristmill.pipeline.job import STAGES, DedupConfig, DedupError, job_stages, run_dedup

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("mixed")
    return root, mixed_input(root)


def _rows(url: str) -> list[dict]:
    return Corpus.open(url).to_table().to_pylist()


def _oracle(rows: list[dict], priority: list[int] | None = None, verify: bool = True) -> list[dict]:
    return deduplicate([r["text"] for r in rows], [r["id"] for r in rows], threshold=0.8, num_perm=128, ngram=5,
                       verify=verify, priority=priority).table.to_pylist()


def _oracle_kept(rows: list[dict], priority: list[int] | None = None, verify: bool = True) -> set[str]:
    return {r["id"] for r in _oracle(rows, priority, verify) if r["status"] == "kept"}


def test_mixed_input_accounting_adds_up_and_agrees_with_the_in_memory_oracle(
        ray_local: None, mixed: tuple[Path, dict], tmp_path: Path) -> None:
    root, info = mixed
    out, removed = str(tmp_path / "corpus"), str(tmp_path / "removed")
    stats = run_dedup(DedupConfig(inputs=[str(root)], output=out, removed=removed, max_doc_bytes=MAX_DOC_BYTES,
                                  split_bytes=40_000, num_partitions=4))
    docs = stats["documents"]
    assert docs["input"] == docs["kept"] + docs["exact_duplicate"] + docs["near_duplicate"] + docs["rejected"]
    assert {k: v for k, v in stats["rejected"].items() if v} == info["bad"]
    assert docs["exact_duplicate"] > 0 and docs["near_duplicate"] > 0
    kept, gone = _rows(out), _rows(removed)
    assert len(kept) == docs["kept"] and len(gone) == docs["exact_duplicate"] + docs["near_duplicate"]
    assert Corpus.open(out).stats == stats
    # every parsed document is in exactly one of the two corpora, and the kept set is the oracle's
    assert len({r["id"] for r in kept + gone}) == len(kept) + len(gone)
    oracle = _oracle(kept + gone)
    assert {r["id"] for r in kept} == {r["id"] for r in oracle if r["status"] == "kept"}
    # every row, exact copies of near duplicates included, names its final cluster and that cluster's size
    assert {r["id"]: (r["cluster_id"], r["cluster_size"]) for r in kept + gone} == {
        r["id"]: (r["cluster_id"], r["cluster_size"]) for r in oracle}
    removed_near = {r["id"] for r in gone if r["removed_as"] == "near_duplicate"}
    assert any(r["duplicate_of"] in removed_near for r in gone)  # the data has such copies
    # provenance: kept rows are their cluster's representative; removed rows name a kept or exact twin
    kept_ids = {r["id"] for r in kept}
    assert all(r["is_representative"] and r["cluster_id"] == r["id"] for r in kept)
    for row in gone:
        assert not row["is_representative"] and row["duplicate_of"] in kept_ids | {g["id"] for g in gone}
        if row["removed_as"] == "near_duplicate":
            assert row["duplicate_of"] in kept_ids and 0.5 <= row["similarity"] < 1.0 + 1e-9
        else:
            assert row["similarity"] == 1.0
    # per-source and per-domain breakdowns add up to the totals
    assert sum(v["input"] for v in stats["by_source"].values()) == docs["input"]
    assert sum(v["kept"] for v in stats["by_domain"].values()) == docs["kept"]
    assert sum(v["near_duplicate"] for v in stats["by_language"].values()) == docs["near_duplicate"]
    assert sum(int(size) * count for size, count in stats["cluster_sizes"].items()) <= docs["input"]
    assert stats["bytes"]["kept"] < stats["bytes"]["input_documents"]
    assert set(stats["stage_seconds"]) == set(STAGES) - {"against", "spans"}  # each only with its flag
    assert stats["params"]["verify"] and (stats["params"]["bands"], stats["params"]["rows"]) == (14, 9)
    assert stats["components"]["candidates"] >= stats["components"]["verified"] > 0
    index = Corpus.open(out).manifest.extra["signature_index"]["params"]
    assert index["verify"] is True and index["bands"] == 14
    # the rejects file names every bad record's file and position
    rejects = pq.read_table(tmp_path / "corpus" / Corpus.open(out).manifest.extra["rejects"]).to_pylist()
    assert sum(r["count"] for r in rejects) == docs["rejected"]
    assert any(r["source"].endswith("a.jsonl") and r["position"] == "line 22" for r in rejects)
    assert not (tmp_path / "corpus" / "_work").exists()  # removed after success unless --keep-work


def test_without_verification_every_candidate_pair_links_as_in_the_unverified_oracle(
        ray_local: None, mixed: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = mixed
    out, removed = str(tmp_path / "corpus"), str(tmp_path / "removed")
    config = DedupConfig(inputs=[str(root)], output=out, removed=removed, max_doc_bytes=MAX_DOC_BYTES,
                         split_bytes=40_000, num_partitions=3, verify=False)
    finished: list[str] = []  # what a progress bar is told
    stats = run_dedup(config, on_stage=finished.append)
    assert finished == list(job_stages(config)) == [s for s in STAGES if s not in ("verify", "against", "spans")]
    kept, gone = _rows(out), _rows(removed)
    assert {r["id"] for r in kept} == _oracle_kept(kept + gone, verify=False)
    assert not stats["params"]["verify"] and (stats["params"]["bands"], stats["params"]["rows"]) == (9, 13)
    assert "verify" not in stats["stage_seconds"] and "verified" not in stats["components"]


def test_partition_count_does_not_change_a_byte(
        ray_local: None, mixed: tuple[Path, dict], tmp_path: Path) -> None:
    root, _ = mixed
    manifests = []
    for partitions in (1, 7):
        out = str(tmp_path / f"p{partitions}")
        finished: list[str] = []  # what a progress bar is told
        run_dedup(DedupConfig(inputs=[str(root)], output=out, max_doc_bytes=MAX_DOC_BYTES, split_bytes=40_000,
                              num_partitions=partitions), on_stage=finished.append)
        assert finished == [s for s in STAGES if s not in ("against", "spans")]
        manifests.append(Corpus.open(out).manifest)
    assert [s.to_dict() for s in manifests[0].shards] == [s.to_dict() for s in manifests[1].shards]


def test_incremental_dedup_against_an_earlier_corpus_names_the_existing_match(
        ray_local: None, tmp_path: Path) -> None:
    rng = random.Random(3)
    texts = documents(40)
    old_texts, new_texts = texts[:60], texts[60:]
    write_jsonl(tmp_path / "old.jsonl", old_texts, prefix="old")
    exact_of_old = [old_texts[i].upper() for i in (0, 5, 9)]
    near_of_old = [near_copy(old_texts[i], rng) for i in (1, 7, 11)]
    write_jsonl(tmp_path / "new.jsonl", new_texts + exact_of_old + near_of_old, prefix="new")
    first = str(tmp_path / "first")
    run_dedup(DedupConfig(inputs=[str(tmp_path / "old.jsonl")], output=first))
    second, removed = str(tmp_path / "second"), str(tmp_path / "removed")
    stats = run_dedup(DedupConfig(inputs=[str(tmp_path / "new.jsonl")], output=second, against=first,
                                  removed=removed))
    old_rows = _rows(first)
    old_ids = {r["id"] for r in old_rows}
    kept, gone = _rows(second), _rows(removed)
    assert all(r["id"].startswith("new") for r in kept + gone)
    assert stats["documents"]["input"] == len(new_texts) + 6
    new_ids = {f"new{len(new_texts) + i}" for i in range(6)}
    assert new_ids <= {r["id"] for r in gone}
    assert all(r["duplicate_of"] in old_ids for r in gone if r["id"] in new_ids)
    # the same answer as deduplicating old and new together with the old documents preferred
    together = old_rows + kept + gone
    expected = _oracle_kept(together, priority=[1] * len(old_rows) + [0] * (len(kept) + len(gone)))
    assert {r["id"] for r in kept} == expected - old_ids
    with pytest.raises(DedupError, match="built with edge verification: pass --bands 14 --rows 9"):
        run_dedup(DedupConfig(inputs=[str(tmp_path / "new.jsonl")], output=str(tmp_path / "third"), against=first,
                              verify=False))
    with pytest.raises(DedupError, match="num_perm"):
        run_dedup(DedupConfig(inputs=[str(tmp_path / "new.jsonl")], output=str(tmp_path / "third"), against=first,
                              num_perm=64))


def test_a_crawler_corpus_folder_is_an_input_and_its_provenance_is_kept(ray_local: None, tmp_path: Path) -> None:
    import datetime as dt

    import pyarrow as pa

    from gristmill.pipeline.format import ShardWriter

    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("url", pa.string()), ("final_url", pa.string()),
                        ("status", pa.int32()), ("fetch_time", pa.timestamp("ms", tz="UTC")), ("domain", pa.string()),
                        ("language", pa.string()), ("content_hash", pa.string())])
    texts = documents(10)
    when = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.timezone.utc)
    rows = [{"id": f"c{i}", "text": t, "url": f"http://a.example/{i}", "final_url": f"https://b.example/{i}",
             "status": 200, "fetch_time": when, "domain": "b.example", "language": "en", "content_hash": "x"}
            for i, t in enumerate(texts)]
    crawl = str(tmp_path / "crawl")
    writer = ShardWriter(crawl, schema, row_group_bytes=20_000, shard_bytes=40_000)
    writer.write(rows)
    writer.commit()
    out = str(tmp_path / "out")
    stats = run_dedup(DedupConfig(inputs=[crawl], output=out))
    kept = _rows(out)
    assert stats["documents"]["input"] == len(texts) and len(kept) == stats["documents"]["kept"] < len(texts)
    assert all(r[SOURCE_COLUMN].startswith("https://b.example/") and r["domain"] == "b.example" for r in kept)
    assert all(r["language"] == "en" and r["fetch_time"] == when for r in kept)
    assert stats["by_domain"]["b.example"]["input"] == len(texts)


def test_input_and_output_on_s3(ray_local: None, s3_bucket: str, s3_server: dict, tmp_path: Path) -> None:
    """fsspec URLs end to end: JSONL on a loopback S3 server in, corpus and work folder on S3 out."""
    import fsspec

    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": s3_server["endpoint_url"], "region_name": "us-east-1"}}
    texts = documents(12)
    write_jsonl(tmp_path / "a.jsonl.gz", texts, prefix="s")
    fs = fsspec.filesystem("s3", **options)
    fs.put(str(tmp_path / "a.jsonl.gz"), f"{s3_bucket}/raw/a.jsonl.gz")
    out = f"{s3_bucket}/corpus"
    stats = run_dedup(DedupConfig(inputs=[f"{s3_bucket}/raw/*.jsonl.gz"], output=out, storage_options=options))
    corpus = Corpus.open(out, options)
    assert corpus.num_rows == stats["documents"]["kept"] and stats["documents"]["input"] == len(texts)
    local = str(tmp_path / "local")
    run_dedup(DedupConfig(inputs=[str(tmp_path / "a.jsonl.gz")], output=local))
    assert set(corpus.to_table(["id"])["id"].to_pylist()) == set(Corpus.open(local).to_table(["id"])["id"].to_pylist())
    assert not fs.exists(f"{s3_bucket}/corpus/_work")


def test_cli_dedup_with_job_file_then_stats(ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_jsonl(tmp_path / "in.jsonl", documents(12), prefix="x")
    job = tmp_path / "job.toml"
    job.write_text(f'[dedup]\ninputs = ["{tmp_path / "in.jsonl"}"]\nthreshold = 0.5\nnum-partitions = 3\n')
    out = str(tmp_path / "out")
    assert main(["dedup", "--job", str(job), "-o", out, "--threshold", "0.8"]) == 0
    assert "kept" in capsys.readouterr().out
    assert Corpus.open(out).stats["params"]["threshold"] == 0.8  # the command line wins over the job file
    assert main(["stats", out, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["documents"]["input"] == len(documents(12))
    assert main(["stats", out]) == 0
    assert "exact_duplicate" in capsys.readouterr().out


def test_cli_reports_bad_options_clearly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    job = tmp_path / "job.toml"
    job.write_text('inputs = ["x.jsonl"]\noutput = "out"\nthreshhold = 0.7\n')
    assert main(["dedup", "--job", str(job)]) == 2
    assert "threshhold" in capsys.readouterr().err
    assert main(["dedup", str(tmp_path / "none-*.jsonl"), "-o", str(tmp_path / "o")]) == 2
    assert "matches no" in capsys.readouterr().err
    assert main(["stats", str(tmp_path)]) == 2


def test_cli_parser_accepts_every_documented_option() -> None:
    from gristmill.pipeline.commands import dedup as dedup_cmd

    parser = argparse.ArgumentParser()
    dedup_cmd.add_arguments(parser)
    args = parser.parse_args(["in.jsonl", "-o", "out", "--bands", "16", "--rows", "8", "--num-perm", "128",
                              "--text-column", "body", "--id-column", "uid", "--removed", "rm", "--keep-work", "--no-verify"])
    config = dedup_cmd.config_from_args(args)
    assert (config.bands, config.rows, config.text_column, config.id_column, config.removed, config.keep_work,
            config.verify) == (16, 8, "body", "uid", os.path.abspath("rm"), True, False)  # folders made absolute
    assert dedup_cmd.config_from_args(parser.parse_args(["in.jsonl", "-o", "out"])).verify is True


def test_sizes_take_units_on_the_command_line_and_in_the_job_file(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from gristmill.pipeline.commands import dedup as dedup_cmd

    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    parser = argparse.ArgumentParser()
    dedup_cmd.add_arguments(parser)
    args = parser.parse_args(["in.jsonl", "-o", "out", "--split-bytes", "64MiB", "--shard-bytes", "1.5GB",
                              "--max-doc-bytes", "4096", "--spill-bytes", "2gib"])
    assert args.ray_address == "ray://head:10001"  # --ray-address defaults to $RAY_ADDRESS
    config = dedup_cmd.config_from_args(args)
    assert (config.split_bytes, config.shard_bytes, config.max_doc_bytes, config.spill_bytes) == (
        64 * 2**20, 1_500_000_000, 4096, 2 * 2**30)
    job = tmp_path / "job.toml"
    job.write_text('[dedup]\ninputs = ["in.jsonl"]\noutput = "out"\nsplit_bytes = "32MiB"\n'
                   'row-group-bytes = "512KiB"\npartition_bytes = 1048576\n')
    argv = ["--job", str(job), "--row-group-bytes", "1MiB"]
    args = parser.parse_args(argv)
    args._parser, args._argv = parser, argv  # as pipeline.cli records them
    config = dedup_cmd.config_from_args(args)
    assert (config.split_bytes, config.row_group_bytes, config.partition_bytes) == (32 * 2**20, 2**20, 2**20)
    job.write_text('inputs = ["in.jsonl"]\noutput = "out"\nshard_bytes = "lots"\n')
    assert main(["dedup", "--job", str(job)]) == 2
    err = capsys.readouterr().err
    assert str(job) in err and "shard-bytes" in err and "'lots' is not a size" in err
    with pytest.raises(SystemExit):
        parser.parse_args(["in.jsonl", "-o", "out", "--split-bytes", "64XB"])
    assert "not a size" in capsys.readouterr().err
