"""One writer per corpus folder (pipeline/format/lease.py): a second job is refused naming the holder,
the same job run twice waits and resumes, a crashed writer's lease lapses, and no lease file, however
hostile, crashes a writer. Races between real threads and real `gristmill dedup` subprocesses, on a
local disk and on moto's S3 server on loopback."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from test_pipeline_data import documents, write_jsonl

import gristmill.pipeline.format.lease as lease_module
from gristmill.pipeline.format import Corpus, Lease, LeaseHeld
from gristmill.pipeline.format.lease import LEASE_NAME, LEASE_SECONDS, Holder, LeaseLost, LeaseUnsupported

REPO = Path(__file__).resolve().parents[1]
GRISTMILL = [sys.executable, "-m", "gristmill.pipeline.cli"]
pytestmark = pytest.mark.timeout(300)


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped) on this host."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _lease_file(folder: Path, **fields: object) -> None:
    now = time.time()
    holder = {"host": "elsewhere", "pid": 4242, "job": "other-job", "token": "t", "acquired": now,
              "expires": now + LEASE_SECONDS, **fields}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LEASE_NAME).write_text(json.dumps(holder))


# -- the lease itself ----------------------------------------------------------------------------------
def test_a_second_job_is_refused_naming_the_holder_and_given_back_it_is_free(tmp_path: Path) -> None:
    first = Lease(str(tmp_path / "out"), "job-a" * 4)
    first.acquire()
    with pytest.raises(LeaseHeld) as refused:
        Lease(str(tmp_path / "out"), "job-b").acquire()
    message = str(refused.value)
    assert "job-ajob-ajo " in message and f"pid {os.getpid()}" in message and socket.gethostname() in message
    assert "\n" not in message
    first.release()
    assert not (tmp_path / "out" / LEASE_NAME).exists()
    second = Lease(str(tmp_path / "out"), "job-b")
    second.acquire()
    second.release()


def test_the_same_job_waits_for_its_twin_then_takes_the_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease_module, "WAIT_POLL_SECONDS", 0.01)
    first = Lease(str(tmp_path), "job")
    first.acquire()
    twin = Lease(str(tmp_path), "job")
    waiter = threading.Thread(target=twin.acquire)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # waiting, not refused and not sharing
    first.release()
    waiter.join(30)
    assert not waiter.is_alive() and twin._held is not None
    twin.release()


@pytest.mark.parametrize("store", ["local", "s3", "memory"])
def test_of_eight_racing_writers_exactly_one_wins(store: str, tmp_path: Path, request: pytest.FixtureRequest,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "out") if store == "local" else f"memory://race-{tmp_path.name}/out"
    if store == "s3":
        url = request.getfixturevalue("s3_bucket") + "/out"
    if store == "memory":  # a slow store: every writer has looked before any writes
        exists = MemoryFileSystem.exists

        def slow_exists(fs: MemoryFileSystem, path: str, **kwargs: object) -> bool:
            found = exists(fs, path, **kwargs)
            time.sleep(0.05)
            return found

        monkeypatch.setattr(MemoryFileSystem, "exists", slow_exists)
    won: list[Lease] = []
    refused: list[str] = []
    start = threading.Barrier(8)

    def race(index: int) -> None:
        lease = Lease(url, f"job-{index}")
        start.wait()
        try:
            lease.acquire()
            won.append(lease)
        except LeaseHeld as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == 7
    assert all(won[0].job in message for message in refused)
    won[0].release()


@pytest.mark.parametrize("store", ["local", "s3"])
def test_an_expired_lease_is_taken_over_and_its_old_holder_may_not_commit(
        store: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    url = str(tmp_path / "out") if store == "local" else request.getfixturevalue("s3_bucket") + "/out"
    crashed = Lease(url, "crashed-job")
    crashed.acquire()
    crashed._stop.set()  # its renewals stop, as a killed writer's do
    with pytest.raises(LeaseHeld):
        Lease(url, "next-job").acquire()
    monkeypatch.setattr(Holder, "live", lambda self, now: False)  # time passes: the lease lapses unrenewed
    successor = Lease(url, "next-job")
    successor.acquire()
    # the old holder wakes and goes to commit before its next renewal: the check itself finds out
    with pytest.raises(LeaseLost, match="taken over.*next-job"):
        crashed.check()
    successor.check()
    successor.release()


def test_a_store_without_an_atomic_create_is_refused_before_any_write() -> None:
    class PlainStore(MemoryFileSystem):  # any fsspec store but local, S3 and memory: no create-if-absent
        protocol = "plainstore"

    fsspec.register_implementation("plainstore", PlainStore, clobber=True)
    with pytest.raises(LeaseUnsupported) as refused:
        Lease("plainstore://bucket/out", "job")
    assert str(refused.value).startswith("plainstore://bucket/out/_lease.json: cannot take the one-writer lease on plainstore://")
    assert not PlainStore().exists("/bucket/out")


def test_a_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path: Path) -> None:
    _lease_file(tmp_path, host=socket.gethostname(), pid=_dead_pid())
    lease = Lease(str(tmp_path), "job")
    lease.acquire()
    lease.release()
    _lease_file(tmp_path, host=socket.gethostname(), pid=os.getpid())  # alive: it holds
    with pytest.raises(LeaseHeld):
        Lease(str(tmp_path), "job-2").acquire()


# -- hostile lease files ---------------------------------------------------------------------------------
_HOSTILE = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**80), 2**80),
                     st.text(max_size=5), st.none(), st.booleans(), st.lists(st.integers(), max_size=2))
_OFFSET = st.floats(-1e7, 1e7).map(lambda offset: ("offset", offset))  # the expiry, relative to now
def _mostly(valid: st.SearchStrategy) -> st.SearchStrategy:
    """``valid`` five times in six, else a hostile value of any type."""
    return st.integers(0, 5).flatmap(lambda n: _HOSTILE if n == 0 else valid)


_FIELDS = st.fixed_dictionaries({  # each field mostly well formed, so that the rules about the others are reached
    "host": _mostly(st.sampled_from([socket.gethostname(), "elsewhere"])),
    "pid": _mostly(st.sampled_from([os.getpid(), 4242, 0, -1, 2**40])),
    "job": _mostly(st.just("other-job")),  # never "mine", the job that tries to take it
    "token": _mostly(st.just("t")),
    "acquired": _mostly(_OFFSET),
    "expires": _mostly(_OFFSET),
}).flatmap(lambda fields: st.sets(st.sampled_from(sorted(fields)), max_size=1).map(
    lambda dropped: {k: v for k, v in fields.items() if k not in dropped}))


def _a_live_lease(data: bytes, now: float) -> bool:
    """The documented rule, independently of the code: every field of the right type, a pid above 0, an
    expiry ahead of now by at most twice LEASE_SECONDS, and not a dead process of this host."""
    try:
        fields = json.loads(data)
    except (ValueError, RecursionError):
        return False
    if not isinstance(fields, dict) or not {"host", "pid", "job", "token", "acquired", "expires"} <= set(fields):
        return False
    number = (lambda v: type(v) in (int, float) and -1.7e308 < v < 1.7e308)  # noqa: E731
    if not all(isinstance(fields[k], str) for k in ("host", "job", "token")) or type(fields["pid"]) is not int:
        return False
    if not (number(fields["acquired"]) and number(fields["expires"]) and 0 < fields["pid"] < 2**31):
        return False
    mine = fields["host"] == socket.gethostname()
    return now < fields["expires"] <= now + 2 * LEASE_SECONDS and (not mine or fields["pid"] == os.getpid())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(st.binary(max_size=200), _FIELDS, st.just("deep")))
def test_a_hostile_lease_file_is_honoured_only_when_it_is_a_live_lease(tmp_path: Path, content: object) -> None:
    """Garbage, wrong types, negative, non-finite, far-future expiries, pids of nobody: the writer either
    takes the lease over or is refused naming a live holder, never crashes and never waits forever."""
    folder = tmp_path / "out"
    folder.mkdir(exist_ok=True)
    now = time.time()
    if content == "deep":
        data = b"[" * 100_000
    elif isinstance(content, dict):
        fields = dict(content)
        for name in ("acquired", "expires"):
            if isinstance(fields.get(name), tuple):
                offset = fields[name][1]
                assume(abs(offset) > 30 and abs(offset - 2 * LEASE_SECONDS) > 30)  # clear of the clock's edges
                fields[name] = now + offset
        data = json.dumps(fields).encode()
    else:
        data = content
    (folder / LEASE_NAME).write_bytes(data)
    lease = Lease(str(folder), "mine")
    if _a_live_lease(data, now):
        with pytest.raises(LeaseHeld, match="being written by another job other-job"):
            lease.acquire()
    else:
        lease.acquire()
        assert Holder.parse((folder / LEASE_NAME).read_bytes()).job == "mine"
        lease.release()
    (folder / LEASE_NAME).unlink(missing_ok=True)


# -- real concurrent `gristmill dedup` jobs ---------------------------------------------------------------
def _inputs(tmp_path: Path) -> Path:
    raw = tmp_path / "raw"
    raw.mkdir()
    texts = documents(120)
    write_jsonl(raw / "a.jsonl", texts + texts[:20])
    return raw


def _start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([*GRISTMILL, "dedup", *args, "--json", "-q", "--num-partitions", "2"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _when_leased(exists: object, job: subprocess.Popen) -> None:
    """Wait until the running job holds its lease (``exists()`` is true)."""
    while not exists():  # type: ignore[operator]
        assert job.poll() is None, job.communicate()
        time.sleep(0.05)


@pytest.mark.parametrize("store", ["local", "s3"])
def test_two_different_jobs_at_once_one_writes_the_other_exits_2_naming_it(
        store: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    raw = _inputs(tmp_path)
    if store == "local":
        out = str(tmp_path / "out")
        exists = (tmp_path / "out" / LEASE_NAME).exists
    else:
        import s3fs

        out = request.getfixturevalue("s3_bucket") + "/out"
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        exists = lambda: fs.exists(f"{out}/{LEASE_NAME}")  # noqa: E731
    first = _start([str(raw), "-o", out])
    _when_leased(exists, first)
    second = subprocess.run([*GRISTMILL, "dedup", str(raw), "-o", out, "--threshold", "0.5", "--overwrite"],
                            cwd=REPO, capture_output=True, text=True, timeout=240)
    assert first.poll() is None, "the first job finished before the second one tried: nothing was raced"
    stdout, stderr = first.communicate(timeout=240)
    assert first.returncode == 0, stderr
    assert second.returncode == 2
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and "being written by another job" in lines[0] and f"pid {first.pid}" in lines[0]
    corpus = Corpus.open(out)
    assert json.loads(stdout) == corpus.stats and corpus.stats["params"]["threshold"] == 0.8
    assert all(result.ok for result in corpus.verify())  # every shard the manifest lists exists, whole


def test_the_same_job_twice_at_once_waits_then_resumes_with_the_same_result(tmp_path: Path) -> None:
    raw = _inputs(tmp_path)
    out = tmp_path / "out"
    first = _start([str(raw), "-o", str(out)])
    _when_leased((out / LEASE_NAME).exists, first)
    twin = _start([str(raw), "-o", str(out)])
    results = [job.communicate(timeout=240) for job in (first, twin)]
    assert [job.returncode for job in (first, twin)] == [0, 0], [err for _, err in results]
    assert json.loads(results[0][0]) == json.loads(results[1][0]) == Corpus.open(str(out)).stats
    assert "Traceback" not in results[1][1]
    assert not (out / LEASE_NAME).exists()


@pytest.mark.parametrize("fields", [{"expires": time.time() + 10 * 365 * 86400}, {"expires": -1}, {"expires": 1e400},
                                    {"expires": 2**2000}, {"pid": 0}, {"pid": -1}, {"host": None}, {"expires": "soon"}])
def test_a_lease_no_writer_could_have_written_holds_no_one(tmp_path: Path, fields: dict) -> None:
    _lease_file(tmp_path, **fields)
    lease = Lease(str(tmp_path), "mine")
    lease.acquire()
    assert Holder.parse((tmp_path / LEASE_NAME).read_bytes()).job == "mine"
    lease.release()
