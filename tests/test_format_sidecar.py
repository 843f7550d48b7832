"""Format version 2: row groups in a checksummed Parquet block table beside the manifest.

The table is untrusted input like the manifest: generated tables (valid, mutated, garbage) are either
refused with an error naming the file, or accepted only when a plain-Python reference of the rules
agrees. Version 1 corpora (row groups inline) still read; a commit never pairs with another's table.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import tempfile
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gristmill.loaders import StreamingLoader
from gristmill.loaders.state import corpus_fingerprint
from gristmill.pipeline.format import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    BlockTable,
    Corpus,
    CorpusError,
    ShardWriter,
    write_manifest,
)
from gristmill.pipeline.format import manifest as manifest_module
from gristmill.pipeline.format.manifest import checksum_bytes
from tests.test_loader import make_corpus


def _manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST_NAME).read_text())


@pytest.fixture()
def sidecar_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commits write no inline copy of the block table, so readers read the file (as for a big corpus)."""
    monkeypatch.setattr(manifest_module, "INLINE_BLOCKS_BYTES", -1)


def test_a_commit_writes_the_row_groups_to_a_named_checksummed_table(tmp_path: Path) -> None:
    texts = make_corpus(str(tmp_path), 600, seed=1)
    manifest = _manifest(tmp_path)
    assert manifest["format_version"] == FORMAT_VERSION and all("row_groups" not in s for s in manifest["shards"])
    entry = manifest["blocks"]
    data = (tmp_path / entry["path"]).read_bytes()
    assert entry["bytes"] == len(data) and entry["checksum"] == checksum_bytes(data)
    corpus = Corpus.open(str(tmp_path))
    assert entry["count"] == len(corpus.manifest.blocks) == sum(len(s.row_groups) for s in corpus.shards) > 10
    for shard in corpus.shards:  # what the table says is what each shard's own footer says
        metadata = pq.read_metadata(corpus.shard_path(shard))
        assert [g.rows for g in shard.row_groups] == [metadata.row_group(i).num_rows
                                                      for i in range(metadata.num_row_groups)]
        starts = [metadata.row_group(i).column(0).data_page_offset for i in range(metadata.num_row_groups)]
        assert [g.offset for g in shard.row_groups] == starts
    assert sorted(t for batch in StreamingLoader(str(tmp_path), world_size=1, rank=0) for t in batch["text"]) \
        == sorted(texts)


def test_version_1_corpora_still_read(tmp_path: Path) -> None:
    texts = make_corpus(str(tmp_path), 500, seed=2)
    current = Corpus.open(str(tmp_path))
    manifest = _manifest(tmp_path)
    (tmp_path / manifest.pop("blocks")["path"]).unlink()
    manifest["format_version"] = 1
    manifest["shards"] = [s.to_dict() for s in current.shards]  # row groups inline, as version 1 wrote them
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    old = Corpus.open(str(tmp_path))
    assert old.manifest.format_version == 1 and old.shards == current.shards
    assert corpus_fingerprint(old.shards) == corpus_fingerprint(current.shards)  # saved states still resume
    assert np.array_equal(old.manifest.blocks.offset, current.manifest.blocks.offset)
    loader = StreamingLoader(str(tmp_path), world_size=1, rank=0, batch_size=7)
    assert sorted(t for batch in loader for t in batch["text"]) == sorted(texts)
    manifest["shards"][0]["row_groups"][1]["offset"] = 0  # overlaps row group 0: refused as in version 2
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(CorpusError, match="overlaps"):
        Corpus.open(str(tmp_path))


def test_a_manifest_never_pairs_with_another_commits_table(tmp_path: Path, sidecar_only: None) -> None:
    make_corpus(str(tmp_path), 300, seed=3)
    first_text = (tmp_path / MANIFEST_NAME).read_text()
    first = json.loads(first_text)["blocks"]["path"]
    corpus = Corpus.open(str(tmp_path))
    write_manifest(str(tmp_path), corpus.shards[1:], corpus.schema)  # a later commit, as a crawl makes
    second = _manifest(tmp_path)["blocks"]["path"]
    assert second != first and sorted(os.listdir(tmp_path / "_blocks")) == [Path(second).name]
    assert len(Corpus.open(str(tmp_path)).shards) == len(corpus.shards) - 1
    (tmp_path / MANIFEST_NAME).write_text(first_text)  # the old manifest back: its table is gone
    with pytest.raises(CorpusError, match=f"{first}: block table named by the manifest is missing"):
        Corpus.open(str(tmp_path))
    (tmp_path / second).rename(tmp_path / first)  # another commit's table under the old name
    with pytest.raises(CorpusError, match=f"{first}: block table is .* the manifest says"):
        Corpus.open(str(tmp_path))


def test_a_reader_racing_a_commit_reads_the_new_manifest(monkeypatch: pytest.MonkeyPatch, sidecar_only: None) -> None:
    url = f"memory://race-{uuid.uuid4().hex[:8]}"
    make_corpus(url, 300, seed=4)
    corpus = Corpus.open(url)
    real = MemoryFileSystem.cat_file
    raced = []

    def commit_in_between(self: MemoryFileSystem, path: str, *args: object, **kwargs: object) -> bytes:
        if "/_blocks/" in path and not raced:  # the manifest is read; a commit lands before its table is
            raced.append(path)
            write_manifest(url, corpus.shards[:1], corpus.schema)
        return real(self, path, *args, **kwargs)

    monkeypatch.setattr(MemoryFileSystem, "cat_file", commit_in_between)
    assert len(Corpus.open(url).shards) == 1 and raced


def test_a_small_table_travels_inline_and_needs_no_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below ``INLINE_BLOCKS_BYTES`` the manifest carries the table as base64 beside naming its file (which
    older format 2 readers read): a reader uses the copy and does not touch the file. Above it, no copy."""
    texts = make_corpus(str(tmp_path / "small"), 400, seed=8)
    entry = _manifest(tmp_path / "small")["blocks"]
    table_file = tmp_path / "small" / entry["path"]
    assert base64.b64decode(entry["inline"]) == table_file.read_bytes()
    table_file.unlink()
    loader = StreamingLoader(str(tmp_path / "small"), world_size=1, rank=0, batch_size=9)
    assert sorted(t for batch in loader for t in batch["text"]) == sorted(texts)
    monkeypatch.setattr(manifest_module, "INLINE_BLOCKS_BYTES", entry["bytes"] - 1)
    make_corpus(str(tmp_path / "big"), 400, seed=8)
    assert "inline" not in _manifest(tmp_path / "big")["blocks"]


# -- hostile block tables --------------------------------------------------------------------------------
def _reference_ok(shards: list[dict], table: dict[str, list[int]]) -> bool:
    """The rules, one block at a time in plain Python: what check_blocks must agree with."""
    n = len(shards)
    rows_seen = [0] * n
    previous: tuple[int, int, int] | None = None  # shard, group, end of its bytes
    for shard, group, rows, offset, length in zip(*(table[c] for c in ("shard", "group", "rows", "offset", "length"))):
        if not 0 <= shard < n or min(rows, offset, length) < 0:
            return False
        if offset + length > shards[shard]["footer_offset"]:
            return False
        if previous is not None and shard < previous[0]:
            return False
        expected_group = previous[1] + 1 if previous is not None and shard == previous[0] else 0
        if group != expected_group or (expected_group and offset < previous[2]):
            return False
        rows_seen[shard] += rows
        previous = (shard, group, offset + length)
    return rows_seen == [s["rows"] for s in shards]


@st.composite
def corpora(draw: st.DrawFn) -> tuple[list[dict], dict[str, list[int]]]:
    """A valid layout of 0-4 shards, then perhaps a few fields changed to anything."""
    shards, table = [], {c: [] for c in ("shard", "group", "rows", "offset", "length")}
    for index in range(draw(st.integers(0, 4))):
        offset, rows = 4, 0
        for group in range(draw(st.integers(0, 4))):
            length, count = draw(st.integers(1, 60)), draw(st.integers(0, 30))
            for column, value in zip(table, (index, group, count, offset, length)):
                table[column].append(value)
            offset += length + draw(st.integers(0, 3))
            rows += count
        footer = draw(st.integers(0, 40))
        shards.append({"path": f"part-{index}.parquet", "rows": rows, "bytes": offset + footer, "checksum": "x",
                       "footer_offset": offset, "footer_length": footer})
    for _ in range(draw(st.integers(0, 3))):
        if table["shard"]:
            column = draw(st.sampled_from(sorted(table)))
            at = draw(st.integers(0, len(table[column]) - 1))
            table[column][at] = draw(st.one_of(st.integers(-3, 70), st.integers(-(2 ** 63), 2 ** 63 - 1)))
    if draw(st.booleans()) and table["shard"]:  # a block dropped or repeated
        at, repeat = draw(st.integers(0, len(table["shard"]) - 1)), draw(st.booleans())
        for column in table.values():
            column.insert(at, column[at]) if repeat else column.pop(at)
    return shards, table


@functools.cache
def _empty_manifest() -> str:
    with tempfile.TemporaryDirectory() as folder:
        ShardWriter(folder).commit()
        return Path(folder, MANIFEST_NAME).read_text()


def _write(folder: str, shards: list[dict], payload: bytes, count: int, checksum: str | None = None,
           inline: str | None = None) -> None:
    """A version 2 manifest over ``shards`` naming ``payload`` as its block table (no shard files needed),
    with ``inline`` as its inline copy if given (the file is then left unwritten: it must not be read)."""
    manifest = json.loads(_empty_manifest())
    os.makedirs(os.path.join(folder, "_blocks"), exist_ok=True)
    if inline is None:
        Path(folder, "_blocks", "blocks-t.parquet").write_bytes(payload)
    manifest["shards"] = shards
    manifest["blocks"] = {"path": "_blocks/blocks-t.parquet", "bytes": len(payload),
                          "checksum": checksum or checksum_bytes(payload), "count": count}
    if inline is not None:
        manifest["blocks"]["inline"] = inline
    Path(folder, MANIFEST_NAME).write_text(json.dumps(manifest))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=corpora(), inline=st.booleans())
def test_block_tables_are_accepted_exactly_when_they_are_consistent(case: tuple[list[dict], dict],
                                                                    inline: bool) -> None:
    shards, table = case
    with tempfile.TemporaryDirectory() as folder:
        arrays = [np.asarray(table[c], dtype=np.int64) for c in ("shard", "group", "rows", "offset", "length")]
        payload = BlockTable(*arrays).to_parquet()
        _write(folder, shards, payload, len(table["shard"]),
               inline=base64.b64encode(payload).decode() if inline else None)
        try:
            corpus = Corpus.open(folder)
        except CorpusError as exc:
            assert "blocks-t.parquet" in str(exc) or "manifest.json" in str(exc)
            assert not _reference_ok(shards, table)
            event("refused")
            return
        assert _reference_ok(shards, table)
        event("accepted")
        assert [[(g.rows, g.offset, g.length) for g in s.row_groups] for s in corpus.shards] == [
            [(r, o, n) for k, r, o, n in zip(table["shard"], table["rows"], table["offset"], table["length"]) if k == i]
            for i in range(len(shards))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.binary(max_size=400), honest=st.booleans(), count=st.integers(-2, 2 ** 64),
       inline=st.one_of(st.none(), st.just("honest"), st.text(max_size=600), st.integers()))
def test_a_garbage_table_is_refused_naming_it(payload: bytes, honest: bool, count: int, inline: object) -> None:
    """Garbage in the file or in the inline copy (not base64, the wrong length, not a string)."""
    if inline == "honest":
        inline = base64.b64encode(payload).decode()
    with tempfile.TemporaryDirectory() as folder:
        _write(folder, [], payload, count, None if honest else "xxh3_128:" + "0" * 32, inline)  # type: ignore[arg-type]
        with pytest.raises(CorpusError, match=r"blocks-t.parquet|manifest is malformed|'blocks.inline'"):
            Corpus.open(folder)


def test_the_table_may_not_leave_the_corpus_folder(tmp_path: Path, sidecar_only: None) -> None:
    make_corpus(str(tmp_path / "c"), 200, seed=6)
    manifest = _manifest(tmp_path / "c")
    for escape in ("../elsewhere.parquet", "/etc/passwd", "s3://other/blocks.parquet"):
        manifest["blocks"]["path"] = escape
        (tmp_path / "c" / MANIFEST_NAME).write_text(json.dumps(manifest))
        with pytest.raises(CorpusError, match="block table path"):
            Corpus.open(str(tmp_path / "c"))
    link = tmp_path / "c" / "_blocks" / "linked.parquet"
    link.symlink_to(next((tmp_path / "c" / "_blocks").glob("blocks-*")))
    manifest["blocks"]["path"] = "_blocks/linked.parquet"
    (tmp_path / "c" / MANIFEST_NAME).write_text(json.dumps(manifest))
    assert len(Corpus.open(str(tmp_path / "c")).shards)  # a link inside the folder is fine
    outside = tmp_path / "outside.parquet"
    outside.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(CorpusError, match="resolves outside"):
        Corpus.open(str(tmp_path / "c"))


def test_memory_and_s3_round_trips_read_the_table(s3_server: dict, s3_bucket: str) -> None:
    for url, options in ((f"memory://sidecar-{uuid.uuid4().hex[:8]}", None),
                         (f"{s3_bucket}/corpus", s3_server["storage_options"])):
        make_corpus(url, 300, seed=7, storage_options=options)
        fs, root = fsspec.core.url_to_fs(url, **(options or {}))
        assert len(fs.ls(f"{root}/_blocks")) == 1
        corpus = Corpus.open(url, options)
        assert corpus.manifest.format_version == FORMAT_VERSION and len(corpus.manifest.blocks) > 3
