"""Bring your own Parquet: ``gristmill index`` over existing files, ``write_corpus`` from Python, errors
that say how to make a corpus, and a corpus folder read as a plain Parquet dataset by pyarrow,
pandas, DuckDB and Hugging Face ``datasets`` (each the real library, on real files)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gristmill.loaders import StreamingLoader
from gristmill.pipeline.cli import main
from gristmill.pipeline.format import (
    LEGACY_MANIFEST_NAME,
    MANIFEST_NAME,
    Corpus,
    CorpusError,
    ShardWriter,
    write_corpus,
)
from gristmill.pipeline.format.existing import index_parquet


def _table(start: int, n: int) -> pa.Table:
    return pa.table({
        "text": [f"document {i} " + "word " * (i % 7) for i in range(start, start + n)],
        "meta": pa.array([{"score": i / 3, "lang": "en"} for i in range(start, start + n)],
                         pa.struct([("score", pa.float64()), ("lang", pa.string())])),
        "tokens": pa.array(range(start, start + n), pa.int64()),
    })


def _hf_like(root: Path) -> Path:
    """A folder as a Hugging Face dataset or Spark job leaves it: shards in a subfolder, small row groups,
    and files a reader skips (``_SUCCESS``, ``.crc``)."""
    (root / "data").mkdir(parents=True)
    pq.write_table(_table(0, 300), root / "data" / "train-00000-of-00002.parquet", row_group_size=64)
    pq.write_table(_table(300, 200), root / "data" / "train-00001-of-00002.parquet", row_group_size=64)
    (root / "_SUCCESS").write_text("")
    (root / "data" / ".train-00000-of-00002.parquet.crc").write_bytes(b"crc")
    return root


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.parquet")) if not p.relative_to(root).parts[0].startswith("_")}


def _streamed(url: str, columns: list[str], **storage: object) -> list[dict]:
    loader = StreamingLoader(url, columns=columns, batch_size=50, shuffle=False, **storage)
    return [dict(zip(columns, values, strict=True)) for batch in loader
            for values in zip(*(batch[c] for c in columns), strict=True)]


def test_index_makes_existing_parquet_a_corpus_without_rewriting_it(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    root = _hf_like(tmp_path / "hf")
    before = _digests(root)
    assert main(["index", str(root)]) == 0
    assert "500 rows" in capsys.readouterr().out
    assert _digests(root) == before  # not one byte of the data rewritten
    corpus = Corpus.open(str(root))
    assert [s.path for s in corpus.shards] == ["data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"]
    assert corpus.num_rows == 500 and len(corpus.manifest.blocks) == 5 + 4  # row groups of 64 rows
    assert all(result.ok for result in corpus.verify())
    rows = _streamed(str(root), ["text", "meta", "tokens"])
    assert sorted(r["tokens"] for r in rows) == list(range(500))
    assert rows[0]["meta"] == {"score": rows[0]["tokens"] / 3, "lang": "en"}
    assert main(["inspect", str(root)]) == 0
    assert main(["index", str(root)]) == 0  # indexing again replaces its own manifest


@pytest.mark.parametrize(("damage", "named", "reason"), [
    ("truncate", "train-00001-of-00002.parquet", "not a readable Parquet file"),
    ("no_text", "train-00001-of-00002.parquet", "no 'text' column"),
    ("other_type", "train-00001-of-00002.parquet", "column 'tokens' is string, not int64"),
])
def test_a_bad_file_is_named_and_nothing_is_written(tmp_path: Path, capsys: pytest.CaptureFixture, damage: str,
                                                    named: str, reason: str) -> None:
    root = _hf_like(tmp_path / "hf")
    bad = root / "data" / named
    if damage == "truncate":
        bad.write_bytes(bad.read_bytes()[:-100])
    elif damage == "no_text":
        pq.write_table(_table(0, 5).rename_columns(["body", "meta", "tokens"]), bad)
    else:
        pq.write_table(_table(0, 5).set_column(2, "tokens", pa.array([str(i) for i in range(5)])), bad)
    assert main(["index", str(root)]) == 2
    error = capsys.readouterr().err
    assert named in error and reason in error, error
    assert not (root / MANIFEST_NAME).exists() and not (root / "_blocks").exists()


def test_index_reads_an_object_store(s3_bucket: str, s3_server: dict, tmp_path: Path) -> None:
    import fsspec

    root = _hf_like(tmp_path / "hf")
    options = s3_server["storage_options"]
    fs = fsspec.filesystem("s3", **options)
    url = f"{s3_bucket}/hf"
    for path in root.rglob("*"):
        if path.is_file():
            fs.put_file(str(path), f"{url}/{path.relative_to(root)}")
    manifest = index_parquet(url, storage_options=options)
    assert manifest.num_rows == 500 and fs.exists(f"{url}/{MANIFEST_NAME}")
    rows = _streamed(url, ["text", "tokens"], storage_options=options)
    assert sorted(r["tokens"] for r in rows) == list(range(500))


def test_write_corpus_takes_any_table_with_a_text_column(tmp_path: Path) -> None:
    url = str(tmp_path / "mine")
    batches = (_table(i * 100, 100).to_batches()[0] for i in range(3))
    manifest = write_corpus(batches, url, row_group_bytes=1024, shard_bytes=2048)
    assert manifest.num_rows == 300 and len(manifest.shards) > 1  # cut into shards at the sizes asked
    rows = _streamed(url, ["text", "meta", "tokens"])
    assert sorted(r["tokens"] for r in rows) == list(range(300))
    with pytest.raises(CorpusError, match="no 'text' column"):
        write_corpus(pa.table({"body": ["x"]}), str(tmp_path / "bad"))
    with pytest.raises(CorpusError, match="'text' column is int64"):
        write_corpus(pa.table({"text": [1]}), str(tmp_path / "bad"))


def test_no_manifest_errors_name_both_ways_to_make_one(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = _hf_like(tmp_path / "hf")
    single = root / "data" / "train-00000-of-00002.parquet"
    for url in (str(root), str(single)):
        with pytest.raises(CorpusError) as caught:
            StreamingLoader(url)
        assert "gristmill index" in str(caught.value) and "write_corpus" in str(caught.value)
    assert "a file, not a corpus folder" in str(caught.value)
    assert main(["inspect", str(single)]) == 2
    error = capsys.readouterr().err
    assert "gristmill index" in error and "write_corpus" in error


def test_a_corpus_of_format_2_is_still_read_and_a_new_commit_replaces_its_manifest(tmp_path: Path) -> None:
    url = str(tmp_path / "old")
    write_corpus(_table(0, 40), url)
    manifest = json.loads((tmp_path / "old" / MANIFEST_NAME).read_text())
    manifest["format_version"] = 2
    (tmp_path / "old" / LEGACY_MANIFEST_NAME).write_text(json.dumps(manifest))
    (tmp_path / "old" / MANIFEST_NAME).unlink()
    assert Corpus.open(url).manifest.format_version == 2 and Corpus.open(url).num_rows == 40
    with ShardWriter(url, _table(0, 1).schema) as writer:
        writer.write(_table(40, 10))
    writer.commit()
    assert not (tmp_path / "old" / LEGACY_MANIFEST_NAME).exists()  # its shards may go; so must it
    assert Corpus.open(url).num_rows == 10


@pytest.fixture(scope="module")
def dedup_corpus(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, pa.Table]:
    """A corpus as ``gristmill dedup`` leaves it with every side folder: _blocks, _index, _rejects, _stats,
    _pairs, and _work (kept)."""
    from gristmill.pipeline.job import DedupConfig, run_dedup

    root = tmp_path_factory.mktemp("dedup")
    with open(root / "in.jsonl", "w") as handle:
        for i in range(60):
            handle.write(json.dumps({"id": f"d{i}", "text": f"story {i % 45} " + "alpha beta " * (i % 45),
                                     "url": f"https://x.example/{i}"}) + "\n")
        handle.write("not json\n")
    out = str(root / "out")
    run_dedup(DedupConfig(inputs=[str(root / "in.jsonl")], output=out, keep_work=True, num_partitions=1))
    assert {p.name for p in (root / "out").iterdir()} >= {"_blocks", "_index", "_rejects", "_stats", "_work"}
    return out, Corpus.open(out).to_table()


def _same_rows(table: pa.Table, expected: pa.Table) -> None:
    assert table.num_rows == expected.num_rows
    assert sorted(table["id"].to_pylist()) == sorted(expected["id"].to_pylist())
    assert sorted(table["url"].to_pylist()) == sorted(expected["url"].to_pylist())


def test_a_corpus_folder_reads_in_pyarrow_as_it_is(dedup_corpus: tuple[str, pa.Table]) -> None:
    url, expected = dedup_corpus
    _same_rows(pq.read_table(url), expected)


def test_a_corpus_folder_reads_in_pandas(dedup_corpus: tuple[str, pa.Table]) -> None:
    import pandas

    url, expected = dedup_corpus
    _same_rows(pa.Table.from_pandas(pandas.read_parquet(url), preserve_index=False), expected)


def test_a_corpus_folder_reads_in_duckdb(dedup_corpus: tuple[str, pa.Table]) -> None:
    import duckdb

    url, expected = dedup_corpus
    _same_rows(duckdb.sql(f"select * from read_parquet('{url}/*.parquet')").to_arrow_table(), expected)


def test_a_corpus_folder_reads_in_hugging_face_datasets(dedup_corpus: tuple[str, pa.Table],
                                                         tmp_path: Path) -> None:
    import datasets

    url, expected = dedup_corpus
    loaded = datasets.load_dataset("parquet", data_files=f"{url}/*.parquet", split="train",
                                   cache_dir=str(tmp_path / "hf-cache"))
    _same_rows(loaded.data.table, expected)
