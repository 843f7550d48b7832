"""The corpus format: writer and reader round trips, target sizes, atomic commit, clear errors."""

from __future__ import annotations

import json
import os
import random
import signal
import string
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from gristmill.pipeline.format import (
    CORPUS_SCHEMA,
    FORMAT_VERSION,
    MANIFEST_NAME,
    SOURCE_COLUMN,
    Corpus,
    CorpusError,
    ShardWriter,
)

REPO = Path(__file__).resolve().parents[1]
GRISTMILL = [sys.executable, "-m", "gristmill.pipeline.cli"]


def make_documents(count: int, seed: int = 0) -> list[dict]:
    """Documents of varied length with a realistic word distribution (compresses like prose)."""
    rng = random.Random(seed)
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(4000)]
    return [
        {
            "id": f"doc-{i:06d}",
            "text": " ".join(rng.choices(words, k=rng.randint(20, 600))),
            SOURCE_COLUMN: f"file:///data/{i % 7}.jsonl",
            "domain": f"site{i % 5}.example",
            "language": "en",
            "cluster_size": 1,
            "is_representative": True,
        }
        for i in range(count)
    ]


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_round_trip(tmp_path: Path, kind: str) -> None:
    url = str(tmp_path / "corpus") if kind == "local" else f"memory://roundtrip-{tmp_path.name}"
    docs = make_documents(3000)
    with ShardWriter(url, shard_bytes=1 << 20, row_group_bytes=128 << 10) as writer:
        for start in range(0, len(docs), 250):
            writer.write(docs[start : start + 250])
    writer.commit(stats={"documents_in": len(docs)})

    corpus = Corpus.open(url)
    assert corpus.num_rows == len(docs)
    assert corpus.stats == {"documents_in": len(docs)}
    assert corpus.schema == CORPUS_SCHEMA
    assert len(corpus.shards) > 1
    table = corpus.to_table()
    assert table.column("id").to_pylist() == [d["id"] for d in docs]
    assert table.column("text").to_pylist() == [d["text"] for d in docs]
    assert table.column("domain").to_pylist() == [d["domain"] for d in docs]
    assert all(result.ok for result in corpus.verify())
    # The manifest alone describes every block: row groups add up to the shard's rows.
    for shard in corpus.shards:
        assert sum(g.rows for g in shard.row_groups) == shard.rows
        assert shard.footer_offset + shard.footer_length == shard.bytes


def test_row_groups_and_shards_near_their_targets(tmp_path: Path) -> None:
    row_group_bytes, shard_bytes = 256 << 10, 2 << 20
    with ShardWriter(str(tmp_path), shard_bytes=shard_bytes, row_group_bytes=row_group_bytes) as writer:
        docs = make_documents(12000, seed=1)
        for start in range(0, len(docs), 500):
            writer.write(docs[start : start + 500])
    manifest = writer.commit()
    groups = [g.length for s in manifest.shards for g in s.row_groups]
    # Every full row group (all but each shard's possibly short tail) lies within 40% of the target.
    full = sorted(groups)[len(manifest.shards):]
    assert full and all(0.6 * row_group_bytes <= size <= 1.4 * row_group_bytes for size in full), full
    for shard in manifest.shards[:-1]:
        assert 0.75 * shard_bytes <= shard.bytes <= 1.05 * shard_bytes, shard.bytes
    # Byte ranges are real: they tile the data part of the file without overlapping.
    for shard in manifest.shards:
        ranges = sorted((g.offset, g.offset + g.length) for g in shard.row_groups)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(ranges, ranges[1:]))
        assert ranges[-1][1] == shard.footer_offset


def test_a_document_larger_than_a_row_group_gets_its_own(tmp_path: Path) -> None:
    big = "word " * 400_000  # 2 MB, larger than the 64 KiB row-group target
    with ShardWriter(str(tmp_path), row_group_bytes=64 << 10, shard_bytes=1 << 20) as writer:
        writer.write([{"id": "small", "text": "tiny"}, {"id": "big", "text": big}])
    writer.commit()
    corpus = Corpus.open(str(tmp_path))
    assert corpus.to_table().column("text").to_pylist() == ["tiny", big]


WRITER_SCRIPT = textwrap.dedent(
    """
    import random, string, sys
    from gristmill.pipeline.format import ShardWriter
    rng = random.Random(7)
    words = ["".join(rng.choices(string.ascii_lowercase, k=6)) for _ in range(3000)]
    writer = ShardWriter(sys.argv[1], shard_bytes=256 << 10, row_group_bytes=32 << 10)
    print("writing", flush=True)
    i = 0
    while True:  # never commits: the test kills it mid-write
        writer.write([{"id": f"new-{i}", "text": " ".join(rng.choices(words, k=300))}])
        i += 1
    """
)


def test_crash_before_manifest_leaves_previous_corpus_intact(tmp_path: Path) -> None:
    url = str(tmp_path / "corpus")
    with ShardWriter(url, shard_bytes=1 << 20, row_group_bytes=64 << 10) as writer:
        writer.write(make_documents(500))
    writer.commit(stats={"generation": 1})
    manifest_path = Path(url) / MANIFEST_NAME
    before = manifest_path.read_bytes()
    shards_before = set(os.listdir(url))

    proc = subprocess.Popen([sys.executable, "-c", WRITER_SCRIPT, url], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    deadline = time.monotonic() + 60
    while len(set(os.listdir(url)) - shards_before) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

    assert len(set(os.listdir(url)) - shards_before) >= 2, "the killed writer should have left new shards"
    assert manifest_path.read_bytes() == before
    corpus = Corpus.open(url)
    assert corpus.stats == {"generation": 1}
    assert corpus.num_rows == 500
    assert all(r.ok for r in corpus.verify())
    assert not any(n.startswith(MANIFEST_NAME + ".tmp") for n in os.listdir(url))


def _corpus(tmp_path: Path) -> str:
    url = str(tmp_path / "c")
    with ShardWriter(url, shard_bytes=256 << 10, row_group_bytes=32 << 10) as writer:
        writer.write(make_documents(800))
    writer.commit()
    return url


def test_inspect_verify_names_the_corrupted_shard(tmp_path: Path) -> None:
    url = _corpus(tmp_path)
    corpus = Corpus.open(url)
    victim = corpus.shard_path(corpus.shards[1])
    with open(victim, "r+b") as handle:  # flip one byte in the middle, keep the size
        handle.seek(corpus.shards[1].bytes // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))

    ok = subprocess.run([*GRISTMILL, "inspect", url], cwd=REPO, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr  # without --verify the manifest alone is read
    result = subprocess.run([*GRISTMILL, "inspect", "--verify", url], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 1
    assert f"CORRUPT  {victim}" in result.stdout
    assert result.stdout.count("CORRUPT") == 1

    as_json = subprocess.run([*GRISTMILL, "inspect", "--verify", "--json", url], cwd=REPO,
                             capture_output=True, text=True)
    report = json.loads(as_json.stdout)
    assert report["verify"]["ok"] is False
    assert [f["path"] for f in report["verify"]["failed"]] == [victim]


def test_inspect_summary_and_json(tmp_path: Path) -> None:
    url = _corpus(tmp_path)
    text = subprocess.run([*GRISTMILL, "inspect", "--verify", url], cwd=REPO, capture_output=True, text=True)
    assert text.returncode == 0
    assert "rows 800" in text.stdout and "match their checksums" in text.stdout
    report = json.loads(
        subprocess.run([*GRISTMILL, "inspect", "--json", url], cwd=REPO, capture_output=True, text=True).stdout
    )
    corpus = Corpus.open(url)
    assert report["rows"] == 800
    assert report["shards"] == len(corpus.shards)
    assert report["row_groups"]["count"] == sum(len(s.row_groups) for s in corpus.shards)
    assert [f["name"] for f in report["schema"]] == CORPUS_SCHEMA.names


@pytest.mark.parametrize(
    "content, expected",
    [
        ("{not json", "manifest is not valid JSON"),
        (json.dumps({"format": "gristmill-corpus", "format_version": FORMAT_VERSION + 41}),
         f"format version {FORMAT_VERSION + 41}"),
        (json.dumps({"format": "something-else"}), "not a gristmill corpus manifest"),
        (json.dumps({"format": "gristmill-corpus", "format_version": FORMAT_VERSION}), "manifest is malformed"),
    ],
)
def test_bad_manifest_gives_a_clear_error(tmp_path: Path, content: str, expected: str) -> None:
    (tmp_path / MANIFEST_NAME).write_text(content)
    with pytest.raises(CorpusError, match=expected):
        Corpus.open(str(tmp_path))
    result = subprocess.run([*GRISTMILL, "inspect", str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2
    assert expected in result.stderr and str(tmp_path / MANIFEST_NAME) in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_manifest_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run([*GRISTMILL, "inspect", str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2
    assert "no manifest" in result.stderr and "Traceback" not in result.stderr


def test_s3_round_trip(s3_bucket: str, s3_server: dict) -> None:
    url = f"{s3_bucket}/corpus"
    options = s3_server["storage_options"]
    docs = make_documents(400)
    with ShardWriter(url, shard_bytes=256 << 10, row_group_bytes=32 << 10, storage_options=options) as writer:
        writer.write(docs)
    writer.commit()
    corpus = Corpus.open(url, storage_options=options)
    assert corpus.to_table(["id"]).column("id").to_pylist() == [d["id"] for d in docs]
    assert all(r.ok for r in corpus.verify())


def test_table_input_must_carry_the_schema_columns(tmp_path: Path) -> None:
    writer = ShardWriter(str(tmp_path))
    with pytest.raises(CorpusError, match="lacks columns"):
        writer.write(pa.table({"id": ["a"]}))


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "gristmill"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "inspect" in result.stdout
