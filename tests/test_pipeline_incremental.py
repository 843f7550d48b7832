"""Incremental runs at scale on a real local Ray: several ``--against`` corpora, and a document key
space that refuses to overflow."""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from test_pipeline_data import near_copy, real_texts, write_jsonl

from gristmill.dedup import deduplicate
from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job import DedupConfig, DedupError, run_dedup

pytestmark = pytest.mark.timeout(240)


def _rows(url: str) -> list[dict]:
    return Corpus.open(url).to_table().to_pylist()


def test_a_chain_of_corpora_each_against_all_before_it(ray_local: None, tmp_path: Path) -> None:
    """A; B against A; C against A and B: nothing in C that is in A or B survives, and C keeps what
    deduplicating A, B and C together (A and B preferred) keeps of C."""
    rng = random.Random(5)
    texts = real_texts(75)
    a_texts, b_texts, c_texts = texts[:30], texts[30:55], texts[55:]
    write_jsonl(tmp_path / "a.jsonl", a_texts, prefix="a")
    b_copies = [a_texts[0].upper(), near_copy(a_texts[3], rng)]
    write_jsonl(tmp_path / "b.jsonl", b_texts + b_copies, prefix="b")
    a, b, c = (str(tmp_path / name) for name in ("A", "B", "C"))
    run_dedup(DedupConfig(inputs=[str(tmp_path / "a.jsonl")], output=a, split_bytes=30_000))
    run_dedup(DedupConfig(inputs=[str(tmp_path / "b.jsonl")], output=b, against=a))
    earlier = _rows(a) + _rows(b)
    assert {r["id"] for r in _rows(b)} == {f"b{i}" for i in range(len(b_texts))}  # its copies of A went
    # C: fresh texts, exact and near copies of A's and of B's documents, and one copy within C
    c_copies = [a_texts[1], near_copy(a_texts[7], rng), b_texts[2].upper(), near_copy(b_texts[4], rng),
                near_copy(b_texts[9], rng)]
    c_all = c_texts + c_copies + [c_texts[0].upper()]
    write_jsonl(tmp_path / "c.jsonl", c_all, prefix="c")
    removed = str(tmp_path / "C-removed")
    stats = run_dedup(DedupConfig(inputs=[str(tmp_path / "c.jsonl")], output=c, against=[a, b], removed=removed,
                                  num_partitions=3))
    docs = stats["documents"]
    assert docs["input"] == len(c_all) == docs["kept"] + docs["exact_duplicate"] + docs["near_duplicate"] + docs[
        "rejected"]
    kept, gone = _rows(c), _rows(removed)
    copies = {f"c{len(c_texts) + i}" for i in range(len(c_copies))}
    assert copies <= {r["id"] for r in gone}  # every copy of A or B is gone
    earlier_ids = {r["id"] for r in earlier}
    assert {r["duplicate_of"] for r in gone if r["id"] in copies} <= earlier_ids
    assert any(r["duplicate_of"].startswith("a") for r in gone) and any(r["duplicate_of"].startswith("b") for r in gone)
    assert len(kept) + len(gone) == len(c_all)
    # the same as deduplicating everything at once with the earlier corpora preferred
    together = earlier + kept + gone
    oracle = deduplicate([r["text"] for r in together], [r["id"] for r in together], threshold=0.8, num_perm=128,
                         ngram=5, verify=True, priority=[1] * len(earlier) + [0] * (len(kept) + len(gone)))
    assert {r["id"] for r in kept} == {r["id"] for r in oracle.table.to_pylist() if r["status"] == "kept"} - earlier_ids
    assert stats["params"]["against"] == [a, b]


def test_against_is_repeatable_on_the_command_line_and_a_string_in_the_job_file(tmp_path: Path) -> None:
    from gristmill.pipeline.commands import dedup as dedup_cmd

    def local(*names: str) -> list[str]:  # folders are made absolute (Ray's workers may run elsewhere)
        return [os.path.abspath(name) for name in names]

    parser = argparse.ArgumentParser()
    dedup_cmd.add_arguments(parser)
    args = parser.parse_args(["in.jsonl", "-o", "out", "--against", "A", "--against", "B", "--against", "A"])
    assert dedup_cmd.config_from_args(args).against == local("A", "B")  # a corpus given twice counts once
    job = tmp_path / "job.toml"
    job.write_text('inputs = ["in.jsonl"]\noutput = "out"\nagainst = "A"\n')

    def parsed(*argv: str) -> argparse.Namespace:
        args = parser.parse_args(list(argv))
        args._parser, args._argv = parser, list(argv)  # as pipeline.cli records them
        return args

    assert dedup_cmd.config_from_args(parsed("--job", str(job))).against == local("A")
    job.write_text('inputs = ["in.jsonl"]\noutput = "out"\nagainst = ["A", "B"]\n')
    assert dedup_cmd.config_from_args(parsed("--job", str(job))).against == local("A", "B")
    assert dedup_cmd.config_from_args(parsed("--job", str(job), "--against", "C")).against == local("C")
    assert DedupConfig(inputs=[], output="o").against == []


def test_the_key_space_refuses_to_overflow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gristmill.pipeline.job import inputs, keys

    assert keys.max_splits() == 2**31 and keys.max_split_rows() == 2**32
    keys.check_split_count(2**31 - 5, 5)
    with pytest.raises(DedupError, match=r"2,147,483,646 splits .* 3 index files.*larger --split-bytes"):
        keys.check_split_count(2**31 - 2, 3)
    keys.check_split_rows(2**32, "split 3 (a.jsonl, ...)")
    with pytest.raises(DedupError, match=r"split 3 \(a.jsonl, ...\) holds more than 4,294,967,296 records.*smaller "
                                         r"--split-bytes"):
        keys.check_split_rows(2**32 + 1, "split 3 (a.jsonl, ...)")
    # the plan checks before any work: with 61 bits of ordinal a run can number only 4 splits
    monkeypatch.setattr(inputs, "KEY_BITS", 61)
    assert keys.max_splits() == 4 and keys.max_split_rows() == 2**61
    (tmp_path / "in").mkdir()
    for i in range(5):
        write_jsonl(tmp_path / "in" / f"{i}.jsonl", [f"document {i} " * 50], prefix=f"d{i}-")
    with pytest.raises(DedupError, match="makes 5 splits.*more than the 4"):
        run_dedup(DedupConfig(inputs=[str(tmp_path / "in")], output=str(tmp_path / "out"), split_bytes=600))
    assert not (tmp_path / "out").exists()


def _earlier_index(url: str, texts: list[str], params: Any, sorted_files: bool) -> None:
    """An earlier corpus holding only a signature index of ``texts`` (as ``gristmill serve --export``
    writes one): sorted with band files, or as indexes were written before band files."""
    from gristmill.dedup import band_hashes, content_hashes
    from gristmill.pipeline.format import CORPUS_SCHEMA, write_manifest
    from gristmill.pipeline.format.signature_index import SignatureTable, params_to_dict, write_index

    signatures = params.hasher().signatures(texts)
    table = SignatureTable([f"old{i}" for i in range(len(texts))], content_hashes(texts),
                           np.array([len(t) for t in texts]), signatures,
                           band_hashes(signatures, params.bands, params.rows))
    if sorted_files:
        write_index(url, params, table)
        return
    Path(url, "_index").mkdir(parents=True)
    pq.write_table(table.to_arrow(params), Path(url, "_index", "index-old.parquet"))
    write_manifest(url, [], CORPUS_SCHEMA, extra={"signature_index": {
        "files": ["_index/index-old.parquet"], "params": params_to_dict(params)}})


def test_an_incremental_run_reads_only_what_its_documents_can_match(
        ray_local: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small input against a large sorted earlier index reads a small part of it, and decides exactly
    what reading the whole index (an index written before band files) decides."""
    from gristmill.pipeline.format import signature_index
    from gristmill.pipeline.job.config import index_params

    rng = random.Random(11)
    words = [f"w{i}" for i in range(4000)]
    old = [" ".join(rng.choices(words, k=80)) for _ in range(3000)]
    fresh = [" ".join(rng.choices(words, k=80)) for _ in range(8)]
    new = fresh + [old[5], old[17].upper(), near_copy(old[40], rng), near_copy(old[2999], rng), fresh[3]]
    write_jsonl(tmp_path / "new.jsonl", new, prefix="new")
    params = index_params(DedupConfig(inputs=[], output=""))
    monkeypatch.setattr(signature_index, "INDEX_GROUP_ROWS", 64)  # this process writes the earlier index
    monkeypatch.setattr(signature_index, "BAND_GROUP_ROWS", 128)
    for name, sorted_files in (("sorted", True), ("whole", False)):
        _earlier_index(str(tmp_path / name), old, params, sorted_files)
    runs = {}
    for name in ("sorted", "whole"):
        out, removed = str(tmp_path / f"{name}-out"), str(tmp_path / f"{name}-removed")
        stats = run_dedup(DedupConfig(inputs=[str(tmp_path / "new.jsonl")], output=out, removed=removed,
                                      against=str(tmp_path / name), num_partitions=2, keep_work=True))
        kept = {r["id"] for r in _rows(out)}
        gone = {r["id"]: (r["removed_as"], r["duplicate_of"]) for r in _rows(removed)}
        # the earlier documents that went through the shuffles, as the pseudo-split's signed documents
        passed = pq.read_metadata(Path(out, "_work", "sigs", "s=00000.parquet")).num_rows
        runs[name] = (kept, gone, stats, passed)
    (kept, gone, stats, passed), (whole_kept, whole_gone, whole_stats, whole_passed) = runs["sorted"], runs["whole"]
    assert kept == whole_kept and gone == whole_gone
    assert gone == {"new8": ("exact_duplicate", "old5"), "new9": ("exact_duplicate", "old17"),
                    "new10": ("near_duplicate", "old40"), "new11": ("near_duplicate", "old2999"),
                    "new3": ("exact_duplicate", "new12")}  # equal texts: the smaller id stays
    docs = stats["documents"]
    assert docs["input"] == len(new) == docs["kept"] + docs["exact_duplicate"] + docs["near_duplicate"]
    # what it read of the earlier index: the row groups that could hold its hashes, and the handful of
    # documents sharing a bucket with one of its own; only those went through the shuffles
    [index_file] = (tmp_path / "sorted" / "_index").glob("index-*.parquet")  # what a whole read reads
    read = stats["against"]
    assert read["index_files"] == 1 and read["index_files_read_whole"] == 0
    assert 0 < 3 * read["bytes_read"] < index_file.stat().st_size, read
    assert 2 <= read["documents_fetched"] == passed < 20 and whole_passed == len(old)
    assert whole_stats["against"]["index_files_read_whole"] == 1 and whole_stats["against"]["bytes_read"] == 0
    assert "against" in stats["stage_seconds"] and "against" in whole_stats["stage_seconds"]


def test_an_index_file_is_sorted_with_a_band_file_that_names_its_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gristmill.pipeline.format import Corpus, CorpusError, signature_index
    from gristmill.pipeline.format.sorted_parquet import groups_holding

    rng = np.random.default_rng(3)
    n, width = 1000, 4
    hashes = [f"{h:032x}" for h in rng.integers(0, 2**62, n)]
    bands = rng.integers(0, 2**63, (n, width), dtype=np.uint64)
    table = signature_index.SignatureTable([f"d{i}" for i in range(n)], hashes, np.arange(n),
                                           rng.integers(0, 2**63, (n, 8), dtype=np.uint64), bands)
    params = signature_index.IndexParams(8, 3, width, 2, 1, 0.8)
    monkeypatch.setattr(signature_index, "INDEX_GROUP_ROWS", 100)
    signature_index.write_index(str(tmp_path / "x"), params, table)
    [entry] = signature_index.listed_index_files(Corpus.open(str(tmp_path / "x")))
    index, band_file = pq.ParquetFile(entry.url), pq.ParquetFile(entry.bands_url)
    rows = index.read()
    assert rows["content_hash"].to_pylist() == sorted(hashes) and index.metadata.num_row_groups == 10
    pairs = band_file.read()
    assert pairs["hash"].to_pylist() == sorted(pairs["hash"].to_pylist()) and pairs.num_rows == n * width
    by_id = {d: i for i, d in enumerate(table.ids)}
    for band_hash, row in zip(pairs["hash"].to_pylist()[:50], pairs["row"].to_pylist()[:50], strict=True):
        assert band_hash in bands[by_id[rows["id"][row].as_py()]].tolist()  # the row holds that band
    # a reader finds the row groups that can hold a value from the footer alone
    wanted = np.array(sorted(hashes)[250:251])
    assert groups_holding(index.metadata, "content_hash", wanted) == [2]
    # a manifest naming a band file outside the corpus, or band files that do not pair up, is refused
    manifest = tmp_path / "x" / "_manifest.json"
    original = json.loads(manifest.read_text())
    for band_files, error in ((["../elsewhere.parquet"], "band file '../elsewhere.parquet'"),
                              (["_index/a.parquet", "_index/b.parquet"], "lists 1 files but 2 band files")):
        original["extra"]["signature_index"]["band_files"] = band_files
        manifest.write_text(json.dumps(original))
        with pytest.raises(CorpusError, match=error):
            signature_index.listed_index_files(Corpus.open(str(tmp_path / "x")))
    monkeypatch.setattr(signature_index, "MAX_INDEX_ROWS", n - 1)
    with pytest.raises(CorpusError, match="1,000 documents in one index file; at most 999"):
        signature_index.write_index(str(tmp_path / "y"), params, table)
