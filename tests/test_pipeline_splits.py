"""Splits that cut files.

A cut file reads as the whole file does: the same documents and rejects at the same positions (so the
same generated ids), whatever the cuts; compressed files stay whole. On a real local Ray, one big file
gives the same corpus as its rows in many files and as itself cut at another ``--split-bytes``.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import random
import uuid
from pathlib import Path

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pipeline_data import documents

from gristmill.pipeline.cli import main
from gristmill.pipeline.format import SOURCE_COLUMN, Corpus
from gristmill.pipeline.job import DedupConfig, run_dedup
from gristmill.pipeline.job.inputs import (
    SPLIT_MAX_PIECES,
    Doc,
    InputFile,
    InputUnreadable,
    Piece,
    ReadOptions,
    Reject,
    cuttable,
    fetch_counted,
    needs_line_count,
    number_lines,
    plan_splits,
    read_file,
    read_piece,
    resolve_inputs,
)

pytestmark = pytest.mark.timeout(240)
CUTS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])
OPTIONS = ReadOptions(max_doc_bytes=2_000)  # lines over 16 KB are over the raw-record cap: read past unread


def _cut_read(item: InputFile, split_bytes: int, options: ReadOptions = OPTIONS) -> tuple[list[Doc | Reject], int]:
    """Every record of ``item`` read piece by piece as the job reads it (newlines counted, lines numbered,
    off a local disk the counted bytes parsed: ``gristmill.pipeline.job.read``), and the number of pieces."""
    splits = plan_splits([item], split_bytes)
    fetched = {s.index: [fetch_counted(p) if needs_line_count(p) else (None, None) for p in s.pieces] for s in splits}
    numbered = number_lines(splits, {index: [count for count, _ in got] for index, got in fetched.items()})
    pieces = [dataclasses.replace(p, prefetched=data) for s in numbered
              for p, (_, data) in zip(s.pieces, fetched[s.index], strict=True)]
    return [r for p in pieces for r in read_piece(p, options)], len(pieces)


def _split_bytes(size: int, cut: float) -> int:
    """A split budget from ``cut`` in [0, 1]: from 1/30 of the file (at most ~30 pieces) to all of it."""
    return max(size // 30, 1) + int(cut * size)


def _write(folder: Path, name: str, data: bytes, where: str = "local") -> InputFile:
    """``data`` as an input file on the local disk or (``where="memory"``) in fsspec's memory store,
    which the reader treats as an object store."""
    if where == "memory":
        url = f"memory://{folder.name}-{uuid.uuid4().hex[:8]}/{name}"
        fsspec.filesystem("memory").pipe(url, data)
        [item] = resolve_inputs([url])
        return item
    path = folder / name
    path.write_bytes(data)
    [item] = resolve_inputs([str(path)])
    return item


# -- planning --------------------------------------------------------------------------------------
FILES = st.lists(st.tuples(st.integers(0, 5_000), st.sampled_from([None, "gzip", "zstd"]),
                           st.sampled_from(["jsonl", "parquet", "warc"])), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(files=FILES, split_bytes=st.integers(1, 3_000))
def test_the_pieces_of_every_file_tile_it_and_compressed_files_stay_whole(files: list, split_bytes: int) -> None:
    items = [InputFile(f"/in/f{i:03d}.{kind}", kind, None if kind == "parquet" else codec, size, "/in")
             for i, (size, codec, kind) in enumerate(files)]
    splits = plan_splits(items, split_bytes, first_index=2)
    assert splits == plan_splits(items, split_bytes, first_index=2)
    assert [s.index for s in splits] == list(range(2, 2 + len(splits)))
    pieces = [p for s in splits for p in s.pieces]
    assert [p.file for p in pieces if p.start == 0] == items  # every file, in order, starts once
    for item in items:
        own = [p for p in pieces if p.file == item]
        ends = [p.start for p in own[1:]] + [None]
        assert [p.end for p in own] == ends and own[0].start == 0  # consecutive ranges to the end of the file
        assert cuttable(item) or len(own) == 1
        assert all(p.end - p.start >= max(split_bytes // 4, 1) for p in own[:-1])  # no sliver but the last
    for split in splits:
        assert 1 <= len(split.pieces) <= SPLIT_MAX_PIECES
        whole_uncuttable = len(split.pieces) == 1 and not cuttable(split.pieces[0].file)
        assert split.bytes <= split_bytes or whole_uncuttable
    assert sum(s.bytes for s in splits) == sum(i.size for i in items)


def test_a_split_of_many_small_files_is_capped_by_count() -> None:
    items = [InputFile(f"/in/{i:05d}.jsonl", "jsonl", None, 10, "/in") for i in range(1_000)]
    splits = plan_splits(items, 1 << 30)
    assert [len(s.pieces) for s in splits] == [SPLIT_MAX_PIECES] * 15 + [1_000 - 15 * SPLIT_MAX_PIECES]


# -- readers: a cut file reads as the whole one ------------------------------------------------------
LINE = st.one_of(
    st.builds(lambda t, i: json.dumps({"id": f"x{i}", "text": t}).encode(), st.text(min_size=1, max_size=60),
              st.integers(0, 9)),
    st.builds(lambda t: json.dumps({"text": t}).encode(), st.text(min_size=1, max_size=60)),  # an id generated
    st.sampled_from([b"", b"   ", b"{not json", b'{"text": "\xff\xfe"}', b"[1, 2]", b'{"body": "b"}']),
    st.integers(17_000, 40_000).map(lambda n: json.dumps({"text": "w " * n}).encode()),  # over the line cap
)


@pytest.mark.parametrize("where", ["local", "memory"])  # memory: pieces parsed from the bytes their count fetched
@CUTS
@given(lines=st.lists(LINE, min_size=1, max_size=40), final_newline=st.booleans(), cut=st.floats(0, 1))
def test_a_cut_jsonl_file_gives_the_whole_files_records_and_line_numbers(
        tmp_path: Path, where: str, lines: list[bytes], final_newline: bool, cut: float) -> None:
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    item = _write(tmp_path, "cut.jsonl", data, where)
    whole = list(read_file(item, OPTIONS))
    assert len(whole) == len(lines) - (not final_newline and lines[-1] == b"")  # one record per line
    got, pieces = _cut_read(item, _split_bytes(len(data), cut))
    assert got == whole
    assert pieces > 1 or len(data) <= _split_bytes(len(data), cut)


def test_every_cut_of_a_small_jsonl_file_reads_as_the_whole_file(tmp_path: Path) -> None:
    data = b'{"text": "a"}\n\n{"text": "bb"}\r\n{oops\n{"text": "ccc"}'
    item = _write(tmp_path, "small.jsonl", data)
    whole = list(read_file(item, OPTIONS))
    assert [r.position for r in whole] == [f"line {i}" for i in range(1, 6)]
    for split_bytes in range(1, len(data) + 1):  # down to one-byte pieces: most hold no line start
        assert _cut_read(item, split_bytes)[0] == whole, split_bytes


def _warc_record(url: str, text: str, kind: str = "resource") -> bytes:
    from warcio.warcwriter import WARCWriter

    out = io.BytesIO()
    writer = WARCWriter(out, gzip=False)
    payload = text.encode()
    writer.write_record(writer.create_warc_record(url, kind, payload=io.BytesIO(payload), length=len(payload),
                                                  warc_content_type="text/plain"))
    return out.getvalue()


WARC_CHUNK = st.one_of(
    st.builds(lambda i, t: _warc_record(f"https://w.example/{i}", t * 20), st.integers(0, 99),
              st.text(st.characters(categories=("L", "N", "Zs")), min_size=1, max_size=30)),
    st.builds(lambda t: _warc_record("https://w.example/meta", t, "metadata"), st.text(min_size=1, max_size=30)),
    st.just(b"junk between records\r\n"),
    st.builds(lambda t: _warc_record("https://w.example/bad", t * 20).replace(b"Content-Length: ", b"Content-Length: 9",
                                                                              1), st.text(min_size=1, max_size=30)),
)


@CUTS
@given(chunks=st.lists(WARC_CHUNK, min_size=1, max_size=12), cut=st.floats(0, 1))
def test_a_cut_warc_file_gives_the_whole_files_records_and_offsets(tmp_path: Path, chunks: list[bytes],
                                                                    cut: float) -> None:
    data = b"".join(chunks)
    item = _write(tmp_path, "cut.warc", data)
    whole = list(read_file(item, OPTIONS))
    got, _ = _cut_read(item, _split_bytes(len(data), cut))
    assert got == whole


@CUTS
@given(rows=st.integers(1, 60), group=st.integers(1, 12), damaged=st.integers(-1, 5), cut=st.floats(0, 1))
def test_a_cut_parquet_file_gives_the_whole_files_rows_by_row_group(tmp_path: Path, rows: int, group: int,
                                                                     damaged: int, cut: float) -> None:
    texts = [f"document {i} " + "word " * (i % 7) for i in range(rows)]
    texts[rows // 2] = ""  # an empty text: one reject at its row
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": texts, "url": [f"https://p.example/{i}" for i in range(rows)]}), buffer,
                   row_group_size=group, compression="none", use_dictionary=False)
    data = bytearray(buffer.getvalue())
    metadata = pq.ParquetFile(io.BytesIO(bytes(data))).metadata
    if 0 <= damaged < metadata.num_row_groups:  # a row group whose text pages are garbage: its rows, one reject
        column = metadata.row_group(damaged).column(0)
        data[column.data_page_offset:column.data_page_offset + column.total_compressed_size] = (
            b"\xff" * column.total_compressed_size)
    item = _write(tmp_path, "cut.parquet", bytes(data))
    whole = list(read_file(item, OPTIONS))
    assert sum(r.count if isinstance(r, Reject) else 1 for r in whole) == rows
    got, _ = _cut_read(item, _split_bytes(len(data), cut))
    assert got == whole


def test_a_parquet_row_group_belongs_to_the_piece_its_first_page_starts_in(tmp_path: Path) -> None:
    item = _write(tmp_path, "groups.parquet", _parquet_bytes(pa.table({"text": [f"row {i}" for i in range(40)]}), 8))
    metadata = pq.ParquetFile(item.url).metadata
    starts = [metadata.row_group(g).column(0).dictionary_page_offset for g in range(metadata.num_row_groups)]
    whole = list(read_file(item, OPTIONS))
    for shift in (-1, 0, 1):  # cuts just before, at and just after each row group's first page
        cuts = [0] + [start + shift for start in starts[1:]]
        pieces = [Piece(item, a, b) for a, b in zip(cuts, cuts[1:], strict=False)] + [Piece(item, cuts[-1])]
        got = [[r.position for r in read_piece(p, OPTIONS)] for p in pieces]
        assert [r for rows in got for r in rows] == [r.position for r in whole]
        if shift == 0:
            assert got == [[f"row {i}" for i in range(g * 8, g * 8 + 8)] for g in range(5)]


def test_what_concerns_the_whole_file_is_reported_once(tmp_path: Path) -> None:
    rows = [json.dumps({"text": f"line {i}"}).encode() for i in range(200)]
    cases = {
        "gzip-inside.jsonl": gzip.compress(b"\n".join(rows) + b"\n"),  # a cut file whose content is compressed
        "no-text.parquet": _parquet_bytes(pa.table({"body": [f"row {i}" for i in range(300)]}), 10),
        "damaged-footer.parquet": _parquet_bytes(pa.table({"text": [f"row {i}" for i in range(300)]}), 10)[:-12]
        + b"\x00" * 8 + b"PAR1",
    }
    for name, data in cases.items():
        item = _write(tmp_path, name, data)
        whole = list(read_file(item, OPTIONS))
        got, pieces = _cut_read(item, max(len(data) // 5, 1))
        assert pieces >= 5 and got == whole, name
    # a file that is not there is no damage to count: the job stops, naming it (pipeline.job.inputs.faults)
    gone = InputFile(str(tmp_path / "gone.jsonl"), "jsonl", None, 1_000, str(tmp_path))
    with pytest.raises(InputUnreadable, match=r"^input .*gone\.jsonl is missing \(FileNotFoundError"):
        _cut_read(gone, 100)


def _parquet_bytes(table: pa.Table, group: int) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=group, compression="none")
    return buffer.getvalue()


# -- the job on a real local Ray ---------------------------------------------------------------------
def _corpus(url: str, columns: tuple[str, ...]) -> list[tuple]:
    return sorted(tuple(row[c] for c in columns) for row in Corpus.open(url).to_table().to_pylist())


def _rejects(url: str) -> list[tuple]:
    corpus = Corpus.open(url)
    table = pq.read_table(str(Path(url) / corpus.manifest.extra["rejects"]))
    return sorted(zip(*(table[c].to_pylist() for c in ("source", "position", "kind", "count")), strict=True))


def test_one_big_file_gives_the_same_corpus_as_many_files_and_any_split_bytes(
        ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    texts = documents(90)
    random.Random(3).shuffle(texts)
    lines = [json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(texts)]
    lines += [json.dumps({"text": f"a document without an id, number {i} " * 8}) for i in range(6)]
    lines += ["{broken", "", json.dumps({"body": "no text"})]
    random.Random(4).shuffle(lines)
    big, many = tmp_path / "in-big", tmp_path / "in-many"
    big.mkdir()
    many.mkdir()
    (big / "all.jsonl").write_text("\n".join(lines) + "\n")
    for i in range(0, len(lines), 20):
        (many / f"part-{i:04d}.jsonl").write_text("\n".join(lines[i:i + 20]) + "\n")
    size = (big / "all.jsonl").stat().st_size

    def run(folder: Path, name: str, split_bytes: int) -> dict:
        return run_dedup(DedupConfig(inputs=[str(folder)], output=str(tmp_path / name), split_bytes=split_bytes))

    whole = run(big, "whole", 10 * size)
    cut = run(big, "cut", size // 7)
    other = run(big, "other", size // 3 + 1_001)
    spread = run(many, "many", 10 * size)
    assert len(plan_splits(resolve_inputs([str(big)]), size // 7)) == cut["splits"] >= 7  # one read task each
    assert (whole["splits"], other["splits"], spread["splits"]) == (1, 3, 1)
    capsys.readouterr()
    assert main(["stats", str(tmp_path / "cut"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["splits"] == cut["splits"]  # gristmill stats --json, top level
    everything = ("id", "text", SOURCE_COLUMN, "content_hash", "cluster_id", "cluster_size")
    assert _corpus(str(tmp_path / "cut"), everything) == _corpus(str(tmp_path / "whole"), everything)
    assert _corpus(str(tmp_path / "other"), everything) == _corpus(str(tmp_path / "whole"), everything)
    assert _rejects(str(tmp_path / "cut")) == _rejects(str(tmp_path / "whole")) == _rejects(str(tmp_path / "other"))
    assert cut["documents"] == whole["documents"] == other["documents"] == spread["documents"]
    assert whole["documents"]["near_duplicate"] > 0 and whole["documents"]["exact_duplicate"] > 0
    # in many files the generated ids (from the file name) differ; the documents with ids, and their
    # clusters, are the same
    with_ids = ("id", "text", "cluster_id", "cluster_size")
    given = {f"d{i}" for i in range(len(texts))}
    assert ([r for r in _corpus(str(tmp_path / "many"), with_ids) if r[0] in given]
            == [r for r in _corpus(str(tmp_path / "whole"), with_ids) if r[0] in given])

