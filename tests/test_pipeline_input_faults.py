"""Reading input from object storage: a storage fault told from damaged data (pipeline/job/inputs/faults.py),
reads sized to the piece, and the ``--work-dir`` option; through moto's S3 behind the counting,
fault-injecting proxy (benchmarks/shaped_store.py)."""

from __future__ import annotations

import dataclasses
import errno
import gzip
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs
from hypothesis import given, settings
from hypothesis import strategies as st

from gristmill.pipeline.commands import dedup as dedup_command
from gristmill.pipeline.job import DedupConfig, DedupError
from gristmill.pipeline.job.inputs import (
    Doc,
    InputUnreadable,
    ReadOptions,
    Reject,
    count_newlines,
    faults,
    fetch_counted,
    needs_line_count,
    number_lines,
    plan_splits,
    read_piece,
    resolve_inputs,
)
from gristmill.pipeline.job.plan import claim_folders

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from shaped_store import ShapedStore  # noqa: E402

pytestmark = pytest.mark.timeout(240)
OPTIONS = ReadOptions("text", "id", 10 * 1024 * 1024)


@pytest.fixture()
def shaped(store: ShapedStore, monkeypatch: pytest.MonkeyPatch) -> Iterator[ShapedStore]:
    """The proxy with no faults and fresh counts; s3fs and botocore try each request once, so what is
    retried here is the reader's own doing; backoff short."""
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    monkeypatch.setattr(faults, "BACKOFF_SECONDS", 0.01)
    store.clear_faults()
    store.reset_stats()
    yield store
    store.clear_faults()


def storage(store: ShapedStore) -> dict:
    return {"client_kwargs": {"endpoint_url": store.endpoint}, "skip_instance_cache": True,
            "config_kwargs": {"retries": {"mode": "standard", "max_attempts": 1}}}


def put(store: ShapedStore, key: str, data: bytes) -> str:
    fs = s3fs.S3FileSystem(**storage(store))
    if not fs.exists("faults"):
        fs.mkdir("faults")
    fs.pipe_file(f"faults/{key}", data)
    return f"s3://faults/{key}"


def jsonl(count: int, width: int = 200) -> bytes:
    return b"".join(json.dumps({"id": f"d{i}", "text": f"document {i} " + "x" * width}).encode() + b"\n"
                    for i in range(count))


def read_all(url: str, store: ShapedStore, split_bytes: int, fault: int | None = 0) -> list[Doc | Reject]:
    """Every record of ``url`` as the job reads it: planned, newlines counted, each piece read; after
    planning, the next ``fault`` requests for it (None: all) are answered 503 SlowDown."""
    options = storage(store)
    splits = plan_splits(resolve_inputs([url], options), split_bytes)
    if fault != 0:
        store.fail("/" + url.removeprefix("s3://"), fault)
    counts = {s.index: [count_newlines(p, options) if needs_line_count(p) else None for p in s.pieces]
              for s in splits}
    return [r for s in number_lines(splits, counts) for p in s.pieces for r in read_piece(p, OPTIONS, options)]


# -- classification ----------------------------------------------------------------------------------
def _caused(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


class ClientError(Exception):
    """botocore's ClientError as faults sees it: a ``response`` with an error code."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.response = {"Error": {"Code": code}}


@pytest.mark.parametrize(("exc", "kind"), [
    (OSError(errno.EBUSY, "Service Unavailable"), "transient"),  # s3fs's 503 SlowDown
    (_caused(OSError(errno.EIO, "x"), ClientError("SlowDown")), "transient"),
    (ConnectionResetError(errno.ECONNRESET, "reset"), "transient"),
    (TimeoutError("read timed out"), "transient"),
    (FileNotFoundError(errno.ENOENT, "NoSuchKey"), "missing"),
    (PermissionError(errno.EACCES, "AccessDenied"), "refused"),
    (gzip.BadGzipFile("Not a gzipped file"), None),  # an OSError, but the data's
    (EOFError("Compressed file ended before the end-of-stream marker was reached"), None),
    (ValueError("bad"), None),
    (_caused(ValueError("decode"), ClientError("NoSuchBucketPolicy")), None),
])
def test_storage_faults_are_told_from_damaged_data(exc: BaseException, kind: str | None) -> None:
    assert faults.fault_class(exc) == kind


@given(st.lists(st.sampled_from(["transient", "data"]), min_size=1, max_size=6))
@settings(max_examples=40, deadline=None)
def test_a_fault_anywhere_in_the_cause_chain_decides(chain: list[str]) -> None:
    exc: BaseException | None = None
    for link in reversed(chain):
        new = OSError(errno.ECONNRESET, "reset") if link == "transient" else ValueError("data")
        new.__cause__ = exc
        exc = new
    assert faults.fault_class(exc) == ("transient" if "transient" in chain else None)


def test_s3_jobs_get_the_clients_retries_unless_the_user_chose() -> None:
    assert DedupConfig(["s3://b/in"], "out").storage_options["config_kwargs"]["retries"] == faults.CLIENT_RETRIES
    assert "config_kwargs" not in DedupConfig(["in"], "out").storage_options
    mine = {"config_kwargs": {"retries": {"max_attempts": 2}}}
    assert DedupConfig(["in"], "s3://b/out", storage_options=mine).storage_options == mine


# -- reads through a throttling store --------------------------------------------------------------------
def test_a_throttled_input_is_retried_and_every_document_read(shaped: ShapedStore) -> None:
    url = put(shaped, "throttled.jsonl", jsonl(400))
    expected = read_all(url, shaped, 1 << 30)
    got = read_all(url, shaped, 1 << 30, fault=3)  # each try makes one request: three tries fail
    assert shaped.stats()["throttled"] == 3
    assert got == expected and all(isinstance(r, Doc) for r in got) and len(got) == 400


def test_a_fault_in_the_middle_of_a_piece_resumes_where_it_stopped(shaped: ShapedStore) -> None:
    data = jsonl(8000)
    url = put(shaped, "middle.jsonl", data)
    options = storage(shaped)
    piece = plan_splits(resolve_inputs([url], options), len(data) // 2)[0].pieces[0]  # read in 64 KiB ranges
    assert piece.end is not None and piece.bytes > 4 * 64 * 1024
    whole = list(read_piece(piece, OPTIONS, options))
    records = read_piece(piece, OPTIONS, options)
    got = [next(records)]  # the first ranged read is done; the next one is refused twice
    shaped.fail("/faults/middle.jsonl", 2)
    got += list(records)
    assert shaped.stats()["throttled"] == 2
    assert got == whole and len(whole) > 3000


def test_an_input_that_stays_throttled_raises_naming_it(shaped: ShapedStore) -> None:
    url = put(shaped, "stuck.jsonl", jsonl(10))
    with pytest.raises(InputUnreadable, match=r"^input s3://faults/stuck\.jsonl could not be read after 4 attempts"):
        read_all(url, shaped, 1 << 30, fault=None)
    assert shaped.stats()["throttled"] >= faults.READ_ATTEMPTS


def test_an_input_gone_after_planning_raises_naming_it(shaped: ShapedStore) -> None:
    url = put(shaped, "gone.jsonl", jsonl(10))
    splits = plan_splits(resolve_inputs([url], storage(shaped)), 1 << 30)
    s3fs.S3FileSystem(**storage(shaped)).rm(url)
    with pytest.raises(InputUnreadable, match=r"^input s3://faults/gone\.jsonl is missing"):
        list(read_piece(splits[0].pieces[0], OPTIONS, storage(shaped)))


def test_damaged_bytes_that_were_read_are_still_a_corrupt_reject(shaped: ShapedStore) -> None:
    url = put(shaped, "cut.jsonl.gz", gzip.compress(jsonl(50))[:-30])
    got = read_all(url, shaped, 1 << 30)
    assert [r.kind for r in got if isinstance(r, Reject)] == ["corrupt"]


# -- reads sized to what is needed -----------------------------------------------------------------------
@pytest.mark.parametrize("split_bytes", [256 * 1024, 1024 * 1024])
def test_cut_files_download_about_their_own_bytes(shaped: ShapedStore, split_bytes: int) -> None:
    data = jsonl(12_000)  # ~2.7 MB
    url = put(shaped, f"sized-{split_bytes}.jsonl", data)
    options = storage(shaped)
    splits = plan_splits(resolve_inputs([url], options), split_bytes)
    assert len(splits) >= 3
    shaped.reset_stats()
    fetched = {s.index: [fetch_counted(p, options) if needs_line_count(p) else (None, None) for p in s.pieces]
               for s in splits}
    # the newline count fetches exactly its bytes: every piece but the last (and byte start - 1 of each)
    pieces = [p for s in splits for p in s.pieces if needs_line_count(p)]
    assert shaped.stats()["bytes_sent"] == sum(p.bytes for p in pieces) + len(pieces) - 1
    numbered = number_lines(splits, {index: [count for count, _ in got] for index, got in fetched.items()})
    records = [r for s in numbered for p, (_, kept) in zip(s.pieces, fetched[s.index], strict=True)
               for r in read_piece(dataclasses.replace(p, prefetched=kept), OPTIONS, options)]
    assert len(records) == 12_000 and all(isinstance(r, Doc) for r in records)
    # the read parses those bytes and fetches only the last piece and the records crossing a cut: the
    # file is downloaded once (was 2x: counted, then read; and 6.5x with 50 MiB blocks from each piece)
    assert len(data) <= shaped.stats()["bytes_sent"] <= 1.1 * len(data)


# -- --work-dir ------------------------------------------------------------------------------------------
def test_work_dir_is_an_option_and_defaults_inside_the_output() -> None:
    parser = __import__("argparse").ArgumentParser()
    dedup_command.add_arguments(parser)
    config = dedup_command.config_from_args(parser.parse_args(["in", "-o", "out", "--work-dir", "s3://b/work"]))
    assert config.work_dir == "s3://b/work" and config.work_url == "s3://b/work"
    assert DedupConfig(["in"], "s3://b/out/").work_url == "s3://b/out/_work"


def test_a_work_dir_that_holds_other_files_or_overlaps_an_input_is_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_bytes(jsonl(3))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "notes.txt").write_text("mine")

    def claim(work: Path) -> None:
        config = DedupConfig([str(tmp_path / "in")], str(tmp_path / "out"), work_dir=str(work))
        claim_folders(config, resolve_inputs(config.inputs), "fingerprint")

    with pytest.raises(DedupError, match=r"--work-dir .*work is not empty and is not a gristmill work folder"):
        claim(tmp_path / "work")
    with pytest.raises(DedupError, match=r"--work-dir .* lies inside input"):
        claim(tmp_path / "in" / "work")
    claim(tmp_path / "fresh")  # a new folder is fine
    (tmp_path / "work" / "job.json").write_text("{}")
    claim(tmp_path / "work")  # so is an earlier run's work folder
