"""Hostile inputs, generated: malformed JSONL, truncated .jsonl.gz/.zst, damaged WARC and Parquet files,
a corpus whose shards are gone or damaged. Every file is read to its end; where the number of records
written is knowable, each comes out as exactly one document or one reject; a document is never a
damaged copy; whatever comes out fits the job's tables; and the Ray job over such a folder finishes
with kept + exact + near + rejected = input."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import os
import re
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gristmill.pipeline.format import CORPUS_SCHEMA, REJECT_SCHEMA, Corpus, ShardWriter
from gristmill.pipeline.job import DedupConfig, DedupError, run_dedup
from gristmill.pipeline.job.datasets import DOC_SCHEMA
from gristmill.pipeline.job.extras import ColumnTypes, batch_table
from gristmill.pipeline.job.inputs import Doc, ReadOptions, Reject, read_file, resolve_inputs

pytestmark = pytest.mark.timeout(300)
READERS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hostile")


def _read(folder: Path, name: str, data: bytes) -> list[Doc | Reject]:
    """Every record of ``data`` written as a file called ``name`` (in a fresh folder)."""
    path = Path(tempfile.mkdtemp(dir=folder)) / name
    path.write_bytes(data)
    [item] = resolve_inputs([str(path)])
    records = list(read_file(item, ReadOptions()))
    _assert_fits_the_job_tables(records)
    return records


def _assert_fits_the_job_tables(records: list[Doc | Reject]) -> None:
    """What a reader hands the job must go into its Arrow tables (a lone surrogate once failed the job)."""
    names = ("id", "text", "source", "domain", "language", "fetch_time")
    docs = [{name: getattr(r, name) for name in names} for r in records if isinstance(r, Doc)]
    pa.Table.from_pylist(docs, pa.schema([DOC_SCHEMA.field(n) for n in names]))
    carried = [r for r in records if isinstance(r, Doc) and r.extra is not None]
    if carried:  # and the fields they carry, into the batch table the read stage writes beside them
        batch_table(carried, ColumnTypes())
    rejects = [{**dataclasses.asdict(r), "origin": "test"} for r in records if isinstance(r, Reject)]
    pa.Table.from_pylist(rejects, REJECT_SCHEMA)
    assert all(r.kind and r.position and r.reason for r in records if isinstance(r, Reject))


def _docs(records: list[Doc | Reject]) -> list[Doc]:
    return [r for r in records if isinstance(r, Doc)]


def _rejects(records: list[Doc | Reject]) -> list[Reject]:
    return [r for r in records if isinstance(r, Reject)]


# -- JSONL -------------------------------------------------------------------------------------
WORDS = st.text(st.characters(categories=("L", "N")), min_size=1, max_size=40)  # never blank, always UTF-8
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)
SIDE_FIELDS = st.dictionaries(st.sampled_from(["id", "url", "domain", "language", "fetch_time"]), JSON_VALUES)
ODD_LINES = [
    b'{"text": "x", "id": NaN}', b'{"text": "x", "id": 1e999}', b'{"text": "a\\u0000b"}',
    b'{"text": "x", "url": "http://[::1"}', b'{"text": "x", "fetch_time": "9999-12-31T23:59:59-23:59"}',
    b'{"text": "x", "id": "\\udc80"}', b'{"text": "x", "url": "\\ud800"}', b'\xef\xbb\xbf{"text": "bom"}',
    b'{"text": "x", "text": 3}', b'{"body": "b", "title": "t", "url": "u"}', b"{}", b"\x00\x00\x00",
]
HOSTILE_LINES = st.one_of(
    st.builds(lambda value: json.dumps(value).encode(), JSON_VALUES),  # any JSON value, lone surrogates too
    st.builds(lambda text, side: json.dumps({"text": text, **side}).encode(), st.text(max_size=30), SIDE_FIELDS),
    st.binary(max_size=80).map(lambda raw: raw.replace(b"\n", b" ")),
    st.integers(1_000, 20_000).map(lambda depth: b'{"text": "x", "a": ' + b"[" * depth + b"]" * depth + b"}"),
    st.integers(1_000, 20_000).map(lambda depth: b"[" * depth),
    st.integers(20, 6_000).map(lambda digits: b'{"text": "x", "id": ' + b"7" * digits + b"}"),
    st.sampled_from(ODD_LINES),
)
# a line and the text it must give (None: anything, as long as it is one record)
LINES = st.one_of(WORDS.map(lambda text: (json.dumps({"text": text}).encode(), text)),
                  HOSTILE_LINES.map(lambda line: (line, None)))


@READERS
@given(lines=st.lists(LINES, min_size=1, max_size=25))
def test_every_jsonl_line_is_one_document_or_one_reject_in_place(scratch: Path, lines: list) -> None:
    records = _read(scratch, "hostile.jsonl", b"".join(line + b"\n" for line, _ in lines))
    assert [r.position for r in records] == [f"line {i}" for i in range(1, len(lines) + 1)]
    assert all(r.count == 1 for r in _rejects(records))
    for (_, text), record in zip(lines, records, strict=True):
        if text is not None:
            assert isinstance(record, Doc) and record.text == text


def test_a_record_without_the_text_field_names_the_fields_it_has(scratch: Path) -> None:
    fields = {f"f{i:02d}": i for i in range(12)} | {"body": "b", "Title": "t"}
    [few, many, wrong] = _read(scratch, "fields.jsonl", b'{"url": "u", "body": "b", "title": "t"}\n'
                               + json.dumps(fields).encode() + b'\n{"text": ["a"]}\n')
    assert isinstance(few, Reject) and few.reason == "no 'text' field (has: body, title, url)"
    assert isinstance(many, Reject) and many.reason == (
        "no 'text' field (has: Title, body, f00, f01, f02, f03, f04, f05, f06, f07, and 4 more)")
    assert isinstance(wrong, Reject) and wrong.reason == "'text' field is an array, not a string"


def _compress(codec: str, pieces: list[bytes]) -> tuple[bytes, set[int]]:
    """The pieces as consecutive gzip members or zstd frames, and the offsets where one ends."""
    data, ends = b"", set()
    for piece in pieces:
        data += gzip.compress(piece) if codec == "gzip" else zstandard.ZstdCompressor(write_checksum=True).compress(piece)
        ends.add(len(data))
    return data, ends


@READERS
@given(texts=st.lists(WORDS, min_size=1, max_size=40), codec=st.sampled_from(["gzip", "zstd"]),
       members=st.integers(1, 3), cut=st.floats(0, 1, exclude_max=True))
def test_a_truncated_compressed_stream_keeps_whole_lines_and_rejects_its_rest(
        scratch: Path, texts: list[str], codec: str, members: int, cut: float) -> None:
    lines = [json.dumps({"text": t}).encode() + b"\n" for t in texts]
    step = -(-len(lines) // members)
    data, ends = _compress(codec, [b"".join(lines[i:i + step]) for i in range(0, len(lines), step)])
    name = "t.jsonl.gz" if codec == "gzip" else "t.jsonl.zst"
    assert [d.text for d in _read(scratch, name, data)] == texts  # the whole stream, as written

    at = int(cut * len(data))
    records = _read(scratch, name, data[:at])
    docs, rejects = _docs(records), _rejects(records)
    assert [d.text for d in docs] == texts[:len(docs)]  # what was read whole, in order, unchanged
    if at in ends:  # a cut between members is a shorter valid stream: nothing is known lost
        assert not rejects
    else:
        [tail] = rejects
        assert (tail.kind, tail.count, tail.position) == ("corrupt", 1, f"line {len(docs) + 1}")
        assert codec in tail.reason and f"after line {len(docs)}" in tail.reason


# -- WARC --------------------------------------------------------------------------------------
def _warc_record(url: str, text: str, html: bool) -> bytes:
    """One response record (uncompressed) as warcio writes it, with block and payload digests."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    body = (f"<html><body><article><p>{text}</p></article></body></html>" if html else text).encode()
    headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html" if html else "text/plain; charset=utf-8")],
                               protocol="HTTP/1.1")
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=False)
    writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body), length=len(body),
                                                  http_headers=headers))
    return out.getvalue()


def _damaged(record: bytes, damage: str, where: float, value: int) -> bytes:
    """``record`` with one kind of damage; ``where`` and ``value`` pick its place and its byte."""
    header_end = record.index(b"\r\n\r\n")
    if damage == "version":
        return b"X" + record[1:]
    if damage == "header end":
        return record[:header_end] + record[header_end + 2:]
    if damage == "content length":
        start = record.index(b"Content-Length: ") + len(b"Content-Length: ")
        end = record.index(b"\r\n", start)
        return record[:start] + str(value * 7).encode() + record[end:]
    lo, hi = (0, header_end) if damage == "header byte" else (header_end + 4, len(record) - 4)
    at = lo + int(where * (hi - lo))
    return record[:at] + bytes([record[at] ^ (value % 255 + 1)]) + record[at + 1:]


WARC_PAGES = st.lists(st.tuples(WORDS, st.booleans()), min_size=1, max_size=5)


def _warc_file(pages: list[tuple[str, bool]]) -> list[bytes]:
    return [_warc_record(f"https://w.example/{i}", text * 3, html) for i, (text, html) in enumerate(pages)]


def _offsets(chunks: list[bytes]) -> list[int]:
    starts = [0]
    for chunk in chunks:
        starts.append(starts[-1] + len(chunk))
    return starts


def _texts_by_offset(records: list[Doc | Reject]) -> dict[int, str]:
    return {int(d.position.split()[3]): d.text for d in _docs(records)}


@READERS
@given(pages=WARC_PAGES, target=st.floats(0, 1, exclude_max=True), compressed=st.booleans(),
       damage=st.sampled_from(["version", "header end", "content length", "header byte", "block byte"]),
       where=st.floats(0, 1, exclude_max=True), value=st.integers(0, 400))
def test_a_damaged_warc_record_never_takes_its_neighbours(scratch: Path, pages: list, target: float, compressed: bool,
                                                          damage: str, where: float, value: int) -> None:
    chunks = _warc_file(pages)
    pack = (lambda cs: b"".join(gzip.compress(c) for c in cs)) if compressed else b"".join
    name = "w.warc.gz" if compressed else "w.warc"
    sound = _texts_by_offset(_read(scratch, name, pack(chunks)))
    assert len(sound) == len(chunks)
    j = int(target * len(chunks))
    damaged = chunks[:j] + [_damaged(chunks[j], damage, where, value)] + chunks[j + 1:]
    if damaged[j] == chunks[j]:
        return
    records = _read(scratch, name, pack(damaged))
    starts, old_starts = _offsets(damaged), _offsets(chunks)
    got = _texts_by_offset(records)
    # every other record comes out whole, at its place, exactly as from the sound file
    for i in (i for i in range(len(chunks)) if i != j):
        assert got.pop(starts[i]) == sound[old_starts[i]]
    # the damaged record gives no document (a changed header value may leave it one) and nothing else leaks
    inside = [r for r in records if starts[j] <= int(r.position.split()[3]) < starts[j + 1]]
    assert len(inside) == len(records) - (len(chunks) - 1)
    if damage != "header byte":
        assert inside and not _docs(inside) and {r.kind for r in _rejects(inside)} == {"corrupt"}
    if damage in ("version", "header end", "block byte"):
        assert len(inside) == 1


@READERS
@given(pages=WARC_PAGES, compressed=st.booleans(), cut=st.floats(0, 1, exclude_max=True))
def test_a_truncated_warc_keeps_its_whole_records_and_rejects_the_cut_one(
        scratch: Path, pages: list, compressed: bool, cut: float) -> None:
    chunks = _warc_file(pages)
    if compressed:
        chunks = [gzip.compress(c) for c in chunks]
    data = b"".join(chunks)
    sound = [d.text for d in _docs(_read(scratch, "t.warc.gz" if compressed else "t.warc", data))]
    at = int(cut * len(data))
    records = _read(scratch, "t.warc.gz" if compressed else "t.warc", data[:at])
    starts = _offsets(chunks)
    whole = sum(end <= at for end in starts[1:])
    docs, rejects = _docs(records), _rejects(records)
    assert [d.text for d in docs] == sound[:len(docs)]
    assert all(r.kind == "corrupt" for r in rejects)
    if len(docs) == whole + 1:  # only the closing blank lines (or the gzip member's end) were cut
        assert starts[whole + 1] - at <= (12 if compressed else 4)
        assert len(rejects) == (1 if compressed else 0)  # gzip still reports its stream cut
    else:  # the record the cut falls in is one reject (an empty .gz is a cut one; an empty .warc is empty)
        assert len(docs) == whole and len(rejects) == (0 if at in starts[compressed:] else 1)


# -- Parquet -----------------------------------------------------------------------------------
WRONG_TYPES = {
    "text as numbers": lambda n: {"text": pa.array(range(n), pa.int64())},
    "text as lists": lambda n: {"text": pa.array([["a", "b"]] * n)},
    "text as structs": lambda n: {"text": pa.array([{"a": "b"}] * n)},
    "text as nulls": lambda n: {"text": pa.nulls(n)},
    "side columns odd": lambda n: {"id": pa.array([[i] for i in range(n)]), "url": pa.array(range(n)),
                                   "fetch_time": pa.array(["not a time"] * n), "language": pa.array([{"x": 1}] * n),
                                   "domain": pa.array([b"\xff"] * n)},
}


def _parquet(texts: list[str], group_rows: int, replace: dict | None = None, codec: str = "snappy") -> bytes:
    n = len(texts)
    columns = {"id": pa.array([f"d{i}" for i in range(n)]), "text": pa.array(texts),
               "url": pa.array([f"https://p.example/{i}" for i in range(n)])} | (replace or {})
    out = io.BytesIO()
    pq.write_table(pa.table(columns), out, row_group_size=group_rows, compression=codec, write_page_checksum=True)
    return out.getvalue()


def _assert_rows_accounted(records: list[Doc | Reject], rows: int) -> None:
    """Every row is one document or inside one reject's count; only a file whose footer cannot be
    read is one reject of unknown count (and says so)."""
    rejects = _rejects(records)
    if len(rejects) == 1 and "record count is unknown" in rejects[0].reason:
        assert records == rejects and rejects[0].position == "file"
    else:
        assert len(_docs(records)) + sum(r.count for r in rejects) == rows


@READERS
@given(texts=st.lists(WORDS, min_size=1, max_size=60), group_rows=st.integers(1, 25),
       codec=st.sampled_from(["none", "snappy", "zstd"]),
       flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(1, 255)), min_size=1, max_size=3))
def test_a_parquet_file_with_flipped_bytes_accounts_for_every_row(
        scratch: Path, texts: list[str], group_rows: int, codec: str, flips: list) -> None:
    data = bytearray(_parquet(texts, group_rows, codec=codec))
    for where, xor in flips:
        data[int(where * len(data))] ^= xor
    records = _read(scratch, "f.parquet", bytes(data))
    _assert_rows_accounted(records, len(texts))
    assert all(d.text in texts for d in _docs(records))  # page checksums catch changed values


@READERS
@given(texts=st.lists(WORDS, min_size=1, max_size=60), group_rows=st.integers(1, 25), cut=st.floats(0, 1, exclude_max=True))
def test_a_truncated_parquet_file_is_one_reject_of_unknown_count(
        scratch: Path, texts: list[str], group_rows: int, cut: float) -> None:
    data = _parquet(texts, group_rows)
    [reject] = _read(scratch, "t.parquet", data[:int(cut * len(data))])
    assert (reject.kind, reject.position, reject.count) == ("corrupt", "file", 1)
    assert "record count is unknown" in reject.reason


@READERS
@given(texts=st.lists(WORDS, min_size=1, max_size=30), group_rows=st.integers(1, 10), wrong=st.sampled_from(sorted(WRONG_TYPES)))
def test_parquet_columns_of_the_wrong_type(scratch: Path, texts: list[str], group_rows: int, wrong: str) -> None:
    records = _read(scratch, "w.parquet", _parquet(texts, group_rows, WRONG_TYPES[wrong](len(texts))))
    _assert_rows_accounted(records, len(texts))
    if wrong.startswith("text as"):  # one reject for the file, counting every row
        [reject] = records
        assert isinstance(reject, Reject) and reject.count == len(texts) and "not text" in reject.reason
    else:  # odd side columns cost no document
        assert [d.text for d in _docs(records)] == texts


# -- corpus inputs -----------------------------------------------------------------------------
def _corpus(folder: Path, count: int) -> Corpus:
    writer = ShardWriter(str(folder), CORPUS_SCHEMA, row_group_bytes=2048, shard_bytes=4096)
    writer.write(pa.Table.from_pylist([{"id": f"c{i}", "text": f"corpus document {i} " * (4 + i % 25)} for i in range(count)],
                                      schema=CORPUS_SCHEMA))
    writer.commit()
    return Corpus.open(str(folder))


def test_a_corpus_shard_gone_truncated_or_swapped_counts_its_manifest_rows(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus", 120)
    gone, cut, swapped = corpus.shards[:3]
    Path(corpus.shard_path(gone)).unlink()
    path = Path(corpus.shard_path(cut))
    path.write_bytes(path.read_bytes()[: cut.bytes // 2])
    donor = next(s for s in corpus.shards[3:] if s.rows != swapped.rows)
    Path(corpus.shard_path(swapped)).write_bytes(Path(corpus.shard_path(donor)).read_bytes())
    counted: dict[str, int] = {}
    for item in resolve_inputs([str(tmp_path / "corpus")]):
        records = list(read_file(item, ReadOptions()))
        _assert_fits_the_job_tables(records)
        counted[Path(item.url).name] = len(_docs(records)) + sum(r.count for r in _rejects(records))
        if Path(item.url).name in {gone.path, cut.path, swapped.path}:
            [reject] = records
            assert isinstance(reject, Reject) and reject.kind == "corrupt" and "manifest lists" in reject.reason
    assert counted == {s.path: s.rows for s in corpus.shards}


# -- the Ray job -------------------------------------------------------------------------------
def _read_all(inputs: list[str]) -> tuple[int, str | None]:
    """Records the readers find in ``inputs`` (documents plus what each reject stands for), and the
    clash of column types the job must stop on, if the carried columns have one (None otherwise)."""
    total = 0
    types = ColumnTypes()
    for item in resolve_inputs(inputs):
        records = list(read_file(item, ReadOptions()))
        total += len(_docs(records)) + sum(r.count for r in _rejects(records))
        batch_table([d for d in _docs(records) if d.extra is not None], types)
    try:
        types.schema()
    except DedupError as exc:
        return total, str(exc)
    return total, None


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(lines=st.lists(LINES, min_size=5, max_size=40), texts=st.lists(WORDS, min_size=5, max_size=40),
       pages=WARC_PAGES, damage=st.sampled_from(["version", "content length", "block byte"]),
       cut=st.floats(0.05, 0.95), flip=st.floats(0, 1, exclude_max=True))
def test_the_job_over_hostile_files_finishes_and_accounts_for_every_record(
        ray_local: None, tmp_path_factory: pytest.TempPathFactory, lines: list, texts: list[str], pages: list,
        damage: str, cut: float, flip: float) -> None:
    root = tmp_path_factory.mktemp("job")
    files = root / "in"
    files.mkdir()
    (files / "hostile.jsonl").write_bytes(b"".join(line + b"\n" for line, _ in lines))
    jsonl = "".join(json.dumps({"text": f"{t} document"}) + "\n" for t in texts).encode()
    (files / "cut.jsonl.gz").write_bytes(gzip.compress(jsonl)[: int(cut * len(gzip.compress(jsonl)))])
    (files / "cut.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(jsonl)[:-3])
    (files / os.fsdecode(b"name-\xff.jsonl")).write_bytes(jsonl)  # a file name that is not UTF-8
    chunks = _warc_file(pages)
    chunks[0] = _damaged(chunks[0], damage, 0.5, 7)
    (files / "damaged.warc.gz").write_bytes(b"".join(gzip.compress(c) for c in chunks))
    parquet = bytearray(_parquet(texts, 4))
    parquet[int(flip * len(parquet))] ^= 0x5A
    (files / "flipped.parquet").write_bytes(bytes(parquet))
    corpus = _corpus(root / "corpus", 40)
    Path(corpus.shard_path(corpus.shards[1])).unlink()  # a corpus input missing a shard

    inputs = [str(files), str(root / "corpus")]
    expected, clash = _read_all(inputs)
    assert expected >= len(lines) + len(texts) + 40
    config = DedupConfig(inputs=inputs, output=str(root / "out"), split_bytes=4_000, num_partitions=2)
    if clash is not None:  # hostile lines gave a side field (url: true) a type another file's does not share
        with pytest.raises(DedupError, match=re.escape(clash.split(" is ")[0])):
            run_dedup(config)
        return
    stats = run_dedup(config)
    docs = stats["documents"]
    assert docs["input"] == docs["kept"] + docs["exact_duplicate"] + docs["near_duplicate"] + docs["rejected"]
    assert docs["input"] == expected
    assert stats["rejected"]["corrupt"] >= corpus.shards[1].rows + 3


def _giant_line_file(compression: str | None) -> tuple[bytes, int]:
    """Three JSONL lines, the middle one 3 MiB of text: over the line cap at max_doc_bytes=256 KiB."""
    lines = [json.dumps({"id": str(i), "text": ("word " * (600_000 if i == 1 else 50)).strip()}).encode() + b"\n"
             for i in range(3)]
    data = b"".join(lines)
    if compression == "gzip":
        data = gzip.compress(data)
    elif compression == "zstd":
        data = zstandard.ZstdCompressor().compress(data)
    return data, len(lines[1])


@pytest.mark.parametrize("name,compression", [("a.jsonl", None), ("a.jsonl.gz", "gzip"), ("a.jsonl.zst", "zstd")])
def test_a_line_over_the_cap_is_skipped_unread_and_counted(scratch: Path, name: str, compression: str | None) -> None:
    data, giant = _giant_line_file(compression)
    path = Path(tempfile.mkdtemp(dir=scratch)) / name
    path.write_bytes(data)
    [item] = resolve_inputs([str(path)])
    records = list(read_file(item, ReadOptions(max_doc_bytes=256 * 1024)))
    assert [d.id for d in _docs(records)] == ["0", "2"]
    [reject] = _rejects(records)
    assert (reject.kind, reject.position, reject.bytes) == ("over_size_cap", "line 2", giant)
    assert "line cap" in reject.reason


def test_jsonl_on_an_object_store_reads_with_the_line_cap(s3_bucket: str, s3_server: dict) -> None:
    """An object store's file object has a readline without a size; the reader must still cap lines."""
    import fsspec

    data, giant = _giant_line_file(None)
    options = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": s3_server["endpoint_url"], "region_name": "us-east-1"}}
    fsspec.filesystem("s3", **options).pipe_file(f"{s3_bucket}/raw/a.jsonl", data)
    [item] = resolve_inputs([f"{s3_bucket}/raw/a.jsonl"], options)
    records = list(read_file(item, ReadOptions(max_doc_bytes=256 * 1024), options))
    assert [d.id for d in _docs(records)] == ["0", "2"]
    assert [(r.kind, r.bytes) for r in _rejects(records)] == [("over_size_cap", giant)]


@pytest.mark.parametrize("cut", [False, True])
def test_a_warc_block_over_the_cap_is_passed_over_unread(scratch: Path, cut: bool) -> None:
    """A 3 MB page between two small ones, at max_doc_bytes=256 KiB: one over_size_cap reject (or, when
    the file ends inside it, one corrupt reject), never a document, and its neighbours read."""
    records = [_warc_record(f"http://a.test/{i}", ("word " * (600_000 if i == 1 else 50)).strip(), html=False)
               for i in range(3)]
    data = b"".join(records[:2]) if cut else b"".join(records)
    if cut:
        data = data[: len(records[0]) + len(records[1]) // 2]
    path = Path(tempfile.mkdtemp(dir=scratch)) / "a.warc"
    path.write_bytes(data)
    [item] = resolve_inputs([str(path)])
    out = list(read_file(item, ReadOptions(max_doc_bytes=256 * 1024)))
    assert [d.source for d in _docs(out)] == (["http://a.test/0"] if cut else ["http://a.test/0", "http://a.test/2"])
    [reject] = _rejects(out)
    assert reject.kind == ("corrupt" if cut else "over_size_cap") and "block of" in reject.reason


@pytest.mark.parametrize("magic", [b"\x28\xb5\x2f\xfd", b"\x1f\x8b\x08\x00"])
def test_a_jsonl_line_starting_with_a_compressor_magic_costs_only_itself(scratch: Path, magic: bytes) -> None:
    """A plain .jsonl is taken as named: a hostile first line that looks like a zstd or gzip header
    is one reject, not a corrupt stream that swallows the good lines after it."""
    good = [json.dumps({"id": str(i), "text": f"document number {i} with some words"}).encode() + b"\n"
            for i in range(3)]
    records = _read(scratch, "a.jsonl", magic + b"garbage\n" + b"".join(good))
    assert [d.id for d in _docs(records)] == ["0", "1", "2"]
    assert [r.position for r in _rejects(records)] == ["line 1"]
