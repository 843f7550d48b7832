"""The service's saved state: snapshots, compaction, and a crash at every step of it.

In process (a :class:`DedupService` driven with ``asyncio.run``, files on the real disk), with small
deltas so that freezing, sorting, merging and folding into the main tables all happen on a few
hundred documents.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_service import text, variant

import gristmill.pipeline.service.core as core_module
import gristmill.pipeline.service.snapshot as snapshot_module
from gristmill.pipeline.format.signature_index import IndexParams
from gristmill.pipeline.service.core import DedupService, Doc
from gristmill.pipeline.service.snapshot import StateError, sealed_logs, snapshots

PARAMS = IndexParams(num_perm=64, ngram=3, bands=8, rows=8, seed=7, threshold=0.7)


@pytest.fixture(autouse=True)
def small_deltas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(core_module, "DELTA_DOCS", 16)


def stream(count: int, seed: int = 0) -> Iterator[list[Doc]]:
    """Batches of documents: new texts, near variants of earlier ones and exact repeats."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(count):
        kind = rng.integers(0, 4) if i > 4 else 0
        if kind == 1:
            body = variant(text(seed * 10_000 + int(rng.integers(0, i))), int(rng.integers(0, 20)))
        elif kind == 2:
            body = text(seed * 10_000 + int(rng.integers(0, i)))
        else:
            body = text(seed * 10_000 + i)
        docs.append(Doc(body, f"d{seed}-{i}"))
    for start in range(0, count, 10):
        yield docs[start : start + 10]


async def feed(service: DedupService, batches: list[list[Doc]]) -> list[dict]:
    results = []
    for batch in batches:
        results += await service.handle(batch, add=True)
    await service.drain()
    return results


def probes() -> list[Doc]:
    return [Doc(text(i), None) for i in range(0, 300, 7)] + [Doc(variant(text(i), 3), None) for i in range(0, 300, 11)]


def verdicts(service: DedupService) -> list[tuple]:
    async def check() -> list[dict]:
        return await service.handle(probes(), add=False)

    return [(r["new"], r["exact_duplicate_of"], tuple(n["id"] for n in r["near_duplicates"])) for r in asyncio.run(check())]


def everything(service: DedupService) -> list[tuple]:
    """Every document the index holds, as exported, sorted by id."""
    rows = []
    for table in service.index.tables(chunk=64):
        rows += [(i, h, int(n), s.tobytes()) for i, h, n, s in zip(table.ids, table.content_hashes, table.lengths,
                                                                      table.signatures, strict=True)]
    return sorted(rows)


def test_snapshot_plus_log_replay_equals_the_log_alone(tmp_path: Path) -> None:
    batches = list(stream(300))
    compacted = DedupService(str(tmp_path / "compacted"), PARAMS, compact_every=40)
    log_only = DedupService(str(tmp_path / "log-only"), PARAMS, compact_every=10**9)
    first = asyncio.run(feed(compacted, batches))
    assert first == asyncio.run(feed(log_only, batches))  # compaction changes no verdict
    assert 0 < sum(r["added"] for r in first) < 300
    assert len(snapshots(str(tmp_path / "compacted"))) == 1  # older snapshots and the logs they cover went
    assert sealed_logs(str(tmp_path / "compacted")) == []
    before = verdicts(compacted), everything(compacted)
    assert before == (verdicts(log_only), everything(log_only))
    compacted.close()
    log_only.close()

    compacted = DedupService(str(tmp_path / "compacted"), PARAMS)
    log_only = DedupService(str(tmp_path / "log-only"), PARAMS)
    try:
        assert compacted.counters.replayed < log_only.counters.replayed == sum(r["added"] for r in first)
        assert (verdicts(compacted), everything(compacted)) == before == (verdicts(log_only), everything(log_only))
    finally:
        compacted.close()
        log_only.close()


class Crash(Exception):
    """A simulated crash: nothing after the failing step runs."""


def crash_points(monkeypatch: pytest.MonkeyPatch, at: int) -> list[str]:
    """Make the ``at``-th durable step of a compaction fail; returns the steps taken, by name."""
    steps: list[str] = []

    def wrap(owner: object, name: str) -> None:
        original = getattr(owner, name)

        def step(*args: object, **kwargs: object) -> object:
            steps.append(name)
            if len(steps) == at:
                raise Crash(f"crash at step {at} ({name})")
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, step)

    wrap(core_module, "fsync_dir")  # after the log is sealed (renamed)
    wrap(core_module.InsertLog, "replay")  # the new active log is started
    wrap(snapshot_module._HashingFile, "close")  # each snapshot file made durable
    wrap(snapshot_module, "fsync_dir")  # the snapshot folder, then its rename (the commit)
    wrap(snapshot_module.shutil, "rmtree")  # the older snapshot removed
    wrap(snapshot_module.os, "remove")  # the sealed logs removed
    return steps


def test_a_crash_at_any_step_of_a_compaction_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = list(stream(120, seed=1))
    reference = DedupService(str(tmp_path / "reference"), PARAMS, compact_every=10**9)
    asyncio.run(feed(reference, batches))
    expected = verdicts(reference), everything(reference)
    reference.close()

    at = 1
    while True:
        state = tmp_path / f"crash-{at}"
        service = DedupService(str(state), PARAMS, compact_every=10**9)
        asyncio.run(feed(service, batches[:6]))
        asyncio.run(service.compact())  # a first snapshot, so the crash has an older one to fall back on
        asyncio.run(feed(service, batches[6:]))
        with monkeypatch.context() as patch:
            steps = crash_points(patch, at)
            try:
                asyncio.run(service.compact())
                crashed = False
            except Crash:
                crashed = True
        service.close()  # what a crash leaves: open files closed, nothing else written
        reopened = DedupService(str(state), PARAMS)
        try:
            assert (verdicts(reopened), everything(reopened)) == expected, f"crash at step {at}: {steps}"
        finally:
            reopened.close()
        if not crashed:
            break
        at += 1
    assert at > 8  # every step above was reached and survived


def damaged_copy(source: Path, target: Path, name: str, cut: int | None, garbage: bytes, at: int) -> Path:
    """A copy of the state at ``source`` with one file of its snapshot cut short or overwritten."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    [generation] = snapshots(str(target))
    path = target / f"snapshot.{generation}" / name if name != "rows.u64" else target / name
    data = path.read_bytes()
    if cut is not None:
        data = data[: cut % max(1, len(data))]
    else:
        where = at % max(1, len(data))
        data = data[:where] + garbage + data[where + len(garbage) :]
    path.write_bytes(data)
    return path


@pytest.fixture(scope="module")
def snapshotted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple]:
    state = tmp_path_factory.mktemp("snapshotted") / "state"
    service = DedupService(str(state), PARAMS, compact_every=10**9)
    asyncio.run(feed(service, list(stream(60, seed=2))))
    asyncio.run(service.compact())
    expected = verdicts(service), everything(service)
    service.close()
    return state, expected


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["meta.json", "bands.keys", "bands.docs", "exact.keys", "exact.docs", "ids.arrow",
                             "rows.u64"]),
       cut=st.none() | st.integers(0, 1 << 20), garbage=st.binary(min_size=1, max_size=64), at=st.integers(0, 1 << 20))
def test_a_damaged_snapshot_is_refused_naming_the_file(snapshotted: tuple[Path, tuple], tmp_path: Path, name: str,
                                                       cut: int | None, garbage: bytes, at: int) -> None:
    source, expected = snapshotted
    path = damaged_copy(source, tmp_path / "copy", name, cut, garbage, at)
    try:
        service = DedupService(str(tmp_path / "copy"), PARAMS)
    except StateError as exc:
        assert str(path) in str(exc) or str(path.parent) in str(exc)
        return
    try:  # the damage changed nothing the snapshot relies on (garbage equal to what it replaced)
        assert (verdicts(service), everything(service)) == expected
    finally:
        service.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tail=st.binary(min_size=1, max_size=3000))
def test_garbage_after_the_last_record_of_a_log_is_cut_and_the_rest_kept(snapshotted: tuple[Path, tuple],
                                                                        tmp_path: Path, tail: bytes) -> None:
    source, expected = snapshotted
    target = tmp_path / "copy"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    service = DedupService(str(target), PARAMS)
    asyncio.run(feed(service, list(stream(20, seed=3))))
    after = verdicts(service), everything(service)
    service.close()
    with open(target / "inserts.log", "ab") as log:
        log.write(tail)
    os.rename(target / "inserts.log", target / f"inserts.{99}.log")  # a sealed log is read the same way
    service = DedupService(str(target), PARAMS)
    try:
        assert (verdicts(service), everything(service)) == after
    finally:
        service.close()


def test_a_state_is_tied_to_what_it_started_from(snapshotted: tuple[Path, tuple], tmp_path: Path) -> None:
    source, _ = snapshotted
    shutil.copytree(source, tmp_path / "copy")
    with pytest.raises(StateError, match="started from an empty index"):
        DedupService(str(tmp_path / "copy"), index_url=str(tmp_path / "some-corpus"))
    other = IndexParams(num_perm=64, ngram=3, bands=8, rows=8, seed=8, threshold=0.7)
    with pytest.raises(StateError, match="written for index parameters"):
        DedupService(str(tmp_path / "copy"), other)
