"""Incremental runs at scale on a real local Ray: several ``--against`` corpora, and a document key
space that refuses to overflow."""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_pipeline_data import near_copy, real_texts, write_jsonl

from dedup import deduplicate
from pipeline.format import Corpus
from pipeline.job import DedupConfig, DedupError, run_dedup

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


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
    from pipeline.commands import dedup as dedup_cmd

    parser = argparse.ArgumentParser()
    dedup_cmd.add_arguments(parser)
    args = parser.parse_args(["in.jsonl", "-o", "out", "--against", "A", "--against", "B", "--against", "A"])
    assert dedup_cmd.config_from_args(args).against == ["A", "B"]  # a corpus given twice counts once
    job = tmp_path / "job.toml"
    job.write_text('inputs = ["in.jsonl"]\noutput = "out"\nagainst = "A"\n')
    assert dedup_cmd.config_from_args(parser.parse_args(["--job", str(job)])).against == ["A"]
    job.write_text('inputs = ["in.jsonl"]\noutput = "out"\nagainst = ["A", "B"]\n')
    assert dedup_cmd.config_from_args(parser.parse_args(["--job", str(job)])).against == ["A", "B"]
    assert dedup_cmd.config_from_args(parser.parse_args(["--job", str(job), "--against", "C"])).against == ["C"]
    assert DedupConfig(inputs=[], output="o").against == []


def test_the_key_space_refuses_to_overflow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from pipeline.job import inputs, keys

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
        run_dedup(DedupConfig(inputs=[str(tmp_path / "in")], output=str(tmp_path / "out"), split_bytes=10))
    assert not (tmp_path / "out").exists()
