"""A service shard's log on S3 (moto on loopback): group commit, snapshots, recovery and the fence that
keeps a stale writer from forking the shard (pipeline/service/durable.py)."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import s3fs
from hypothesis import given, settings
from hypothesis import strategies as st

from gristmill.dedup.lsh import band_hashes
from gristmill.pipeline.format.signature_index import params_for
from gristmill.pipeline.service.columns import ROW_HEAD, RowStore
from gristmill.pipeline.service.durable import (
    Fenced,
    Restarted,
    ShardStore,
    Shipper,
    check_shard_count,
    decode_segment,
    encode_segment,
    read_placements,
    segment_name,
)
from gristmill.pipeline.service.index import LiveIndex
from gristmill.pipeline.service.insert_log import LogRecord
from gristmill.pipeline.service.snapshot import StateError

PARAMS = params_for(0.8, 16, 5)


def record(n: int) -> LogRecord:
    rng = np.random.default_rng(n)
    return LogRecord(f"doc-{n}", f"{n:032x}", 100 + n, rng.integers(0, 2**63, 16, dtype=np.uint64))


def replayed(url: str) -> tuple[ShardStore, list[str]]:
    """A new writer's start: every record it recovers, and the store it now holds."""
    store = ShardStore(url, PARAMS)
    return store, [r.doc_id for batch in store.open() for r in batch]


def live_index(folder: str) -> LiveIndex:
    return LiveIndex(PARAMS, RowStore(f"{folder}/rows.u64", PARAMS.num_perm + ROW_HEAD))


def insert(index: LiveIndex, records: list[LogRecord]) -> None:
    for r in records:
        bands = band_hashes(r.signature[None, :], PARAMS.bands, PARAMS.rows)[0]
        index.insert(r.doc_id, r.content_hash, r.length, r.signature, bands)


def test_a_stale_writer_is_fenced_and_cannot_fork_the_shard(s3_bucket: str) -> None:
    url = f"{s3_bucket}/state/shard-0"
    old, found = replayed(url)
    assert found == [] and old.generation == 1
    for n in range(3):
        old.append([record(n)])  # acknowledged by the old writer
    new, found = replayed(url)  # the shard restarted elsewhere while the old one was cut off
    assert found == ["doc-0", "doc-1", "doc-2"] and new.generation == 2
    with pytest.raises(Fenced, match="newer generation"):
        old.append([record(99)])  # the old node comes back: refused, so never acknowledged
    with pytest.raises(Fenced):
        old.append([record(100)])  # and for good
    new.append([record(3)])
    _, found = replayed(url)
    assert found == ["doc-0", "doc-1", "doc-2", "doc-3"]  # one history, nothing of the stale writer's


def test_a_retried_segment_that_had_landed_is_not_taken_for_a_fence(s3_bucket: str) -> None:
    url = f"{s3_bucket}/state/shard-0"
    writer, _ = replayed(url)
    writer.append([record(1)])
    writer.last -= 1  # its answer was lost: the same segment is shipped again
    writer.append([record(1)])
    assert replayed(url)[1] == ["doc-1"]


def test_group_commit_snapshot_and_recovery(s3_bucket: str, s3_server: dict, tmp_path: Path) -> None:
    url = f"{s3_bucket}/state/shard-0"
    store, _ = replayed(url)
    index = live_index(str(tmp_path))
    shipper = Shipper(store, index, compact_every=5)

    async def add_concurrently() -> None:
        async def one(n: int) -> None:
            records = [record(n)]
            insert(index, records)
            await shipper.sync(shipper.add(records))

        await asyncio.gather(*(one(n) for n in range(12)))
        with pytest.raises(Restarted, match="generation 0 -> 1"):
            await shipper.sync((store.generation - 1, 1))  # a ticket from before a restart is not waited for
        await shipper.drain()

    asyncio.run(add_concurrently())
    fs = s3fs.S3FileSystem(**s3_server["storage_options"], skip_instance_cache=True)
    segments = fs.ls(f"{url}/log")
    assert len(segments) < 1 + 12  # the fence, then fewer PUTs than adds: adds shared segments
    assert fs.ls(f"{url}/snapshot")  # written after compact_every inserts
    _, found = replayed(url)
    assert sorted(found) == sorted(f"doc-{n}" for n in range(12))


def test_a_missing_segment_is_an_error_naming_it(s3_bucket: str, s3_server: dict) -> None:
    url = f"{s3_bucket}/state/shard-0"
    writer, _ = replayed(url)
    for n in range(3):
        writer.append([record(n)])
    fs = s3fs.S3FileSystem(**s3_server["storage_options"], skip_instance_cache=True)
    fs.rm(f"{url}/log/{segment_name(2)}")
    with pytest.raises(StateError, match=f"{url}/log/{segment_name(2)}: missing"):
        replayed(url)


@settings(max_examples=200, deadline=None)
@given(cut=st.integers(min_value=0), flip=st.integers(min_value=0), junk=st.binary(max_size=64))
def test_a_damaged_segment_is_an_error_naming_it(cut: int, flip: int, junk: bytes) -> None:
    whole = encode_segment(1, 7, PARAMS, [record(1), record(2)])
    where = "s3://bucket/state/shard-0/log/x.seg"
    flipped = bytearray(whole)
    flipped[flip % len(whole)] ^= 0x40
    for damaged in (whole[: cut % len(whole)], bytes(flipped), junk, whole + junk[:1]):
        try:
            _, records = decode_segment(damaged, where, PARAMS)
        except StateError as exc:
            assert str(exc).startswith(where + ": ")
            continue
        # what still decodes is every record (a flip inside the head's JSON may keep it valid JSON)
        assert [r.doc_id for r in records] == ["doc-1", "doc-2"]


def test_the_shard_count_is_kept_in_the_store(s3_bucket: str) -> None:
    check_shard_count(f"{s3_bucket}/state", 2)
    check_shard_count(f"{s3_bucket}/state", 2)
    with pytest.raises(StateError, match="built with --shards 2, not 3"):
        check_shard_count(f"{s3_bucket}/state", 3)


def test_a_new_scratch_copy_clears_those_no_process_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A killed shard leaves its scratch folder on the node; the next one started there removes it,
    never the folder of a shard still running (its lock is held)."""
    from gristmill.pipeline.service.shards import scratch_folder
    from gristmill.pipeline.service.snapshot import lock_state

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    left, running, starting = scratch_folder(0), scratch_folder(1), scratch_folder(2)
    lock_state(left).close()  # what a killed shard leaves
    held = lock_state(running)
    try:
        new = scratch_folder(0)
        assert not os.path.exists(left) and os.path.isdir(running) and os.path.isdir(starting) and os.path.isdir(new)
    finally:
        held.close()


def test_a_placement_record_is_never_replaced_by_an_older_generation(s3_bucket: str, s3_server: dict,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """The record a front reads names the shard's newest generation: a writer overtaken between its
    fence and its record (or a stale one trying again) is fenced, and the newer record stands."""
    state = f"{s3_bucket}/state"
    assert read_placements(state, 2) == [None, None]  # not started yet
    old, _ = replayed(f"{state}/shard-1")
    new, _ = replayed(f"{state}/shard-1")  # took over before the old writer recorded its placement
    new.record_placement({"node": "new-node"})
    for _ in range(2):
        with pytest.raises(Fenced, match="names generation 2 of this shard; generation 1 writes no more"):
            old.record_placement({"node": "old-node"})
    with pytest.raises(Fenced):
        old.append([record(1)])  # and it writes no segment either
    [none, placement] = read_placements(state, 2)
    assert none is None and placement["node"] == "new-node" and placement["generation"] == 2
    newest, _ = replayed(f"{state}/shard-1")
    newest.record_placement({"node": "third-node"})  # a newer generation replaces it
    assert read_placements(state, 2)[1]["generation"] == 3

    fs = s3fs.S3FileSystem(**s3_server["storage_options"], skip_instance_cache=True)
    fs.pipe_file(f"{state}/shard-1/placement.json", b"{not json")
    with pytest.raises(StateError, match=f"^{state}/shard-1/placement.json: not a shard's placement record"):
        read_placements(state, 2)
    newest.record_placement({"node": "third-node"})  # a damaged record is replaced, with a warning naming it
    assert "shard-1/placement.json: not a shard's placement record" in caplog.text
    assert read_placements(state, 2)[1]["node"] == "third-node"


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64) | st.builds(
    lambda fields: json.dumps(fields).encode(),
    st.fixed_dictionaries({"generation": st.none() | st.booleans() | st.integers() | st.floats() | st.text()})))
def test_a_damaged_placement_record_is_an_error_naming_it(data: bytes) -> None:
    import fsspec

    fsspec.filesystem("memory").pipe_file("/placement-state/shard-0/placement.json", data)
    try:
        [placement] = read_placements("memory://placement-state", 1)
    except StateError as exc:
        assert str(exc).startswith("memory://placement-state/shard-0/placement.json: not a shard's placement record")
        return
    assert placement is not None and type(placement["generation"]) is int and placement["generation"] >= 1


def test_reading_a_shard_writes_nothing(s3_bucket: str, s3_server: dict) -> None:
    """What an export does to a shard that is serving: it reads the snapshot and the segments after it,
    and the writer goes on without being fenced."""
    url = f"{s3_bucket}/state/shard-0"
    writer, _ = replayed(url)
    writer.append([record(1)])
    writer.write_snapshot(writer.last, iter([record(1)]))
    writer.append([record(2)])
    fs = s3fs.S3FileSystem(**s3_server["storage_options"], skip_instance_cache=True)
    before = fs.find(url)
    reader = ShardStore(url, PARAMS)
    assert [r.doc_id for batch in reader.read() for r in batch] == ["doc-1", "doc-2"]
    assert reader.generation == writer.generation and fs.find(url) == before
    writer.append([record(3)])  # not fenced
    assert replayed(url)[1] == ["doc-1", "doc-2", "doc-3"]


def test_export_of_a_state_on_the_store(s3_bucket: str, s3_server: dict, tmp_path: Path,
                                        capsys: pytest.CaptureFixture) -> None:
    """``serve --export`` reads each shard's snapshot and later segments from the store (nothing local
    is needed, nothing on the store is written) and writes every document as a corpus index."""
    from gristmill.pipeline.cli import main
    from gristmill.pipeline.format.signature_index import load_index

    state = f"{s3_bucket}/state"
    check_shard_count(state, 2)
    first, _ = replayed(f"{state}/shard-0")
    for n in range(3):
        first.append([record(n)])
    first.write_snapshot(first.last, iter([record(n) for n in range(3)]))
    first.append([record(3), record(4)])  # after the snapshot
    second, _ = replayed(f"{state}/shard-1")
    second.append([record(10)])
    fs = s3fs.S3FileSystem(**s3_server["storage_options"], skip_instance_cache=True)
    before = fs.find(state)
    params = ["--threshold", "0.8", "--num-perm", "16", "--ngram", "5"]
    out = tmp_path / "out"
    assert main(["serve", "--state-dir", state, "--shards", "2", *params, "--export", str(out)]) == 0
    _, table = load_index(str(out))
    assert sorted(table.ids) == sorted(["doc-0", "doc-1", "doc-2", "doc-3", "doc-4", "doc-10"])
    signatures = dict(zip(table.ids, table.signatures, strict=True))
    assert np.array_equal(signatures["doc-4"], record(4).signature)
    assert fs.find(state) == before  # no fence, no placement: a serving shard would go on
    first.append([record(5)])

    for argv, reason in (
        (["--shards", "3", *params], f"{state}/shards.json: this state was built with --shards 2, not 3"),
        (["--shards", "2", "--threshold", "0.8", "--num-perm", "32", "--ngram", "5"],
         f"{state}/shard-0/snapshot/{segment_name(4)}: written for index parameters"),
    ):
        capsys.readouterr()
        assert main(["serve", "--state-dir", state, *argv, "--export", str(tmp_path / "refused")]) == 2
        assert reason in capsys.readouterr().err
    capsys.readouterr()
    assert main(["serve", "--state-dir", f"{s3_bucket}/nothing", "--shards", "2", *params, "--export",
                 str(tmp_path / "refused")]) == 2
    assert f"{s3_bucket}/nothing/shards.json: missing; not the state of a gristmill serve --shards" in \
        capsys.readouterr().err
    assert not (tmp_path / "refused").exists() or not any((tmp_path / "refused").iterdir())


def test_where_the_state_goes() -> None:
    """Under a remote --index with --shards (nodes share no disk); a store without --shards is refused
    in one line rather than taken for a local folder named 's3:'."""
    from argparse import Namespace

    from gristmill.pipeline.commands.serve import LOCAL_STATE, _state_dir

    def state(**options: object) -> str:
        return _state_dir(Namespace(**{"state_dir": None, "index": None, "shards": 1, "export": None, **options}))

    assert state(index="s3://b/corpus/", shards=2) == "s3://b/corpus/_serve"
    assert state(index="s3://b/corpus") == state(index="corpus", shards=2) == LOCAL_STATE
    assert state(state_dir="s3://b/state", shards=2) == "s3://b/state"
    assert state(state_dir="s3://b/state", shards=2, export="out") == "s3://b/state"
    with pytest.raises(ValueError, match="^--state-dir s3://b/state: a state on a store needs --shards"):
        state(state_dir="s3://b/state", shards=1)
