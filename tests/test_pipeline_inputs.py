"""Input parsing without Ray: every format, every kind of bad record named with file and position."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_pipeline_data import MAX_DOC_BYTES, mixed_input

from gristmill.pipeline.job.inputs import (
    InputError,
    ReadOptions,
    Reject,
    plan_splits,
    read_file,
    resolve_inputs,
)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("mixed")
    return root, mixed_input(root)


def _read_all(root: Path) -> tuple[dict[str, int], list[Reject]]:
    docs: dict[str, int] = {}
    rejects: list[Reject] = []
    for item in resolve_inputs([str(root)]):
        for record in read_file(item, ReadOptions(max_doc_bytes=MAX_DOC_BYTES)):
            if isinstance(record, Reject):
                rejects.append(record)
            else:
                docs[Path(item.url).name] = docs.get(Path(item.url).name, 0) + 1
    return docs, rejects


def test_every_format_is_read_and_every_bad_record_is_named(mixed: tuple[Path, dict]) -> None:
    root, info = mixed
    docs, rejects = _read_all(root)
    assert set(docs) == {"a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.parquet", "e.warc.gz", "f.jsonl.gz",
                         "h.warc.gz"}
    assert sum(docs[n] for n in ("a.jsonl", "b.jsonl.gz", "c.jsonl.zst", "d.parquet")) == info["good_jsonl_like"]
    by_kind: dict[str, int] = {}
    for reject in rejects:
        by_kind[reject.kind] = by_kind.get(reject.kind, 0) + reject.count
    assert by_kind == info["bad"]
    where = {(Path(r.source).name if "://" not in r.source else r.source, r.position, r.kind) for r in rejects}
    assert ("a.jsonl", "line 22", "unparseable") in where
    assert ("a.jsonl", "line 23", "invalid_utf8") in where
    assert ("a.jsonl", "line 24", "empty") in where
    assert ("a.jsonl", "line 25", "invalid_utf8") in where
    assert ("a.jsonl", "line 27", "over_size_cap") in where
    assert ("g.parquet", "file", "corrupt") in where
    truncated = [r for r in rejects if r.source.endswith("f.jsonl.gz")]
    assert len(truncated) == 1 and truncated[0].position == f"line {docs['f.jsonl.gz'] + 1}"
    assert "truncated" in truncated[0].reason
    corrupt_warc = [r for r in rejects if r.source.endswith("h.warc.gz")]
    assert len(corrupt_warc) == 1 and "corrupt WARC record" in corrupt_warc[0].reason


def test_corrupt_parquet_row_group_rejects_its_rows_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "rg.parquet"
    pq.write_table(pa.table({"text": [f"document number {i} " * 20 for i in range(30)]}), path, row_group_size=10,
                   compression="none")
    metadata = pq.ParquetFile(path).metadata
    column = metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    data[start:start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(data))
    [item] = resolve_inputs([str(path)])
    records = list(read_file(item, ReadOptions()))
    rejects = [r for r in records if isinstance(r, Reject)]
    assert len(rejects) == 1 and rejects[0].count == 10 and rejects[0].position == "row group 1 (rows 10-19)"
    assert len(records) - 1 == 20


def test_warc_html_goes_through_the_crawlers_extraction(mixed: tuple[Path, dict]) -> None:
    root, _ = mixed
    [item] = resolve_inputs([str(root / "e.warc.gz")])
    docs = [r for r in read_file(item, ReadOptions()) if not isinstance(r, Reject)]
    assert docs and all("<p>" not in d.text and d.source.startswith("https://warc.example/") for d in docs)
    assert all(d.domain == "warc.example" and d.id and d.id.startswith("<urn:uuid:") for d in docs)


def test_inputs_that_name_nothing_are_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="matches no"):
        resolve_inputs([str(tmp_path / "nothing-*.jsonl")])
    (tmp_path / "notes.csv").write_text("a,b\n")
    with pytest.raises(InputError, match="notes.csv"):
        resolve_inputs([str(tmp_path / "notes.csv")])


def test_splits_are_deterministic_and_keep_file_order(tmp_path: Path) -> None:
    for i in range(6):
        (tmp_path / f"f{i}.jsonl").write_text(json.dumps({"text": "x" * 100}) + "\n")
    (tmp_path / "big.jsonl.gz").write_bytes(gzip.compress(b'{"text": "y"}\n' * 5000))
    files = resolve_inputs([str(tmp_path / "*.jsonl"), str(tmp_path)])
    assert [Path(f.url).name for f in files] == sorted(Path(f.url).name for f in files)
    assert len(files) == 7  # the folder and the glob name the same files once
    splits = plan_splits(files, split_bytes=250, first_index=3)
    assert [s.index for s in splits] == list(range(3, 3 + len(splits)))
    assert [p.file for s in splits for p in s.pieces] == files
    assert splits == plan_splits(files, split_bytes=250, first_index=3)


def test_warc_records_that_are_not_documents_are_skipped_and_unknown_types_rejected(tmp_path: Path) -> None:
    from warcio.warcwriter import WARCWriter

    out = io.BytesIO()
    writer = WARCWriter(out, gzip=False)
    for kind, url, payload in (("request", "https://r.example/a", b"GET /a HTTP/1.1\r\nHost: r.example\r\n\r\n"),
                               ("resource", "https://r.example/b", b"plain words here"),
                               ("metadata", "https://r.example/c", b"key: value\r\n"),
                               ("resource", "https://r.example/d", b"plain words here")):
        writer.write_record(writer.create_warc_record(url, kind, payload=io.BytesIO(payload), length=len(payload),
                                                      warc_content_type="text/plain"))
    data = out.getvalue().replace(b"WARC-Type: resource", b"WARC-Type: resourcf", 1)  # a damaged type
    request_end = data.index(b"WARC/1.0", 1)
    data = data[:request_end - 10] + data[request_end - 4:]  # the request record's block cut short
    (tmp_path / "r.warc.gz").write_bytes(gzip.compress(data))  # one gzip stream, not a member per record
    [item] = resolve_inputs([str(tmp_path / "r.warc.gz")])
    records = list(read_file(item, ReadOptions()))
    assert [type(r).__name__ for r in records] == ["Reject", "Doc"]  # neither request nor metadata counts
    assert records[0].kind == "unsupported" and "'resourcf'" in records[0].reason
    assert records[1].source == "https://r.example/d" and records[1].text == "plain words here"


def test_a_zstd_file_of_several_frames_is_read_to_its_end(tmp_path: Path) -> None:
    import zstandard

    frames = [zstandard.ZstdCompressor().compress(b'{"text": "frame %d"}\n' % i) for i in range(3)]
    (tmp_path / "f.jsonl.zst").write_bytes(b"".join(frames))
    [item] = resolve_inputs([str(tmp_path / "f.jsonl.zst")])
    assert [r.text for r in read_file(item, ReadOptions())] == ["frame 0", "frame 1", "frame 2"]


@pytest.mark.parametrize(("names", "reason"), [
    (["body", "url"], "no 'text' column (has: body, url)"),
    (["text", "text"], "the 'text' column appears 2 times"),
])
def test_a_parquet_file_without_one_text_column_rejects_every_row_at_once(tmp_path: Path, names: list[str],
                                                                       reason: str) -> None:
    path = tmp_path / "columns.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array(["a", "b", "c"])] * len(names), names=names), path)
    [item] = resolve_inputs([str(path)])
    [reject] = read_file(item, ReadOptions())
    assert isinstance(reject, Reject) and (reject.kind, reject.reason, reject.count) == ("unparseable", reason, 3)
