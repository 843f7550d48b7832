"""Honest exits of the ``gristmill`` command: a dedup run that rejected every record exits 1 and says
why, ``gristmill rejects`` lists what was rejected, Ctrl-C exits 130 with a resume hint and no
traceback, a closed pipe is not an error, usage errors exit 2.

One local Ray for the module; the Ctrl-C test's driver is a real subprocess with a Ray of its own."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sessions import kill_session
from test_crawl_support import ServerThread, Site, crawl_sites, serve
from test_pipeline_data import documents, write_jsonl

from gristmill.pipeline.cli import main
from gristmill.pipeline.commands.inspect import verify_shards
from gristmill.pipeline.format import Corpus, ShardWriter

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[1]
GRISTMILL = [sys.executable, "-m", "gristmill.pipeline.cli"]
PIPE_BUFFER = 64 << 10  # Linux's default pipe capacity

# One bad line of each kind, with the reject kind and reason it must get.
BAD_LINES = [
    (b'{"body": "text under another name", "title": "t"}', "unparseable", "no 'text' field (has: body, title)"),
    (b'{"text": "cut off', "unparseable", None),
    (b'{"text": ""}', "empty", "empty text"),
    (b'{"text": "caf\xe9"}', "invalid_utf8", None),
]
BAD_COPIES = 800  # of each: enough rejects that their listing overfills a pipe several times


@pytest.fixture(scope="module")
def with_rejects(ray_local: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict]:
    """A corpus whose input had 24 good documents, then BAD_COPIES lines of each bad kind; returns the
    corpus, the input file and {"line N": (kind, reason)} for every planted bad line."""
    root = tmp_path_factory.mktemp("rejects")
    source = root / "in.jsonl"
    write_jsonl(source, documents(24))
    good = len(source.read_bytes().splitlines())
    planted = {}
    with source.open("ab") as handle:
        for copy in range(BAD_COPIES):
            for offset, (line, kind, reason) in enumerate(BAD_LINES):
                handle.write(line + b"\n")
                planted[f"line {good + 1 + copy * len(BAD_LINES) + offset}"] = (kind, reason)
    out = root / "corpus"
    assert main(["dedup", str(source), "-o", str(out), "--removed", str(root / "removed")]) == 0
    return out, source, planted


def test_a_run_that_rejects_every_record_exits_1_with_its_reasons_and_a_hint(
        ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "posts.jsonl"
    source.write_text("".join(json.dumps({"body": text, "title": "t", "url": f"https://x.example/{i}"}) + "\n"
                              for i, text in enumerate(documents(6))))
    count = len(source.read_text().splitlines())
    out = str(tmp_path / "corpus")

    assert main(["dedup", str(source), "-o", out]) == 1
    captured = capsys.readouterr()
    assert "rejected" in captured.out  # the statistics are printed as for any run
    assert f"every input record was rejected; {out} is empty" in captured.err
    assert f"{count} input records rejected: unparseable {count}" in captured.err
    assert f"  {count:>12,}  unparseable: no 'text' field (has: body, title, url)" in captured.err
    assert "hint: the records have no 'text' field (they have: body, title, url); name the field that holds " \
           "the text with --text-column NAME" in captured.err
    assert f"gristmill rejects {out}" in captured.err

    # the hint works; the empty corpus is another job's, so replacing it takes --overwrite
    assert main(["dedup", str(source), "-o", out, "--text-column", "body"]) == 2
    assert main(["dedup", str(source), "-o", out, "--text-column", "body", "--overwrite"]) == 0
    assert Corpus.open(out).stats["documents"]["rejected"] == 0


def test_a_run_over_inputs_without_documents_exits_1(ray_local: None, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    out = str(tmp_path / "corpus")
    assert main(["dedup", str(tmp_path / "empty.jsonl"), "-o", out]) == 1
    assert f"the inputs hold no documents; {out} is empty" in capsys.readouterr().err


def test_rejects_lists_every_reject_after_a_summary(with_rejects: tuple[Path, Path, dict],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out, source, planted = with_rejects
    assert main(["rejects", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (f"{len(planted):,} input records rejected: unparseable {2 * BAD_COPIES:,}, "
                        f"empty {BAD_COPIES:,}, invalid_utf8 {BAD_COPIES:,}")
    assert lines[1:5] == [f"  {BAD_COPIES:>12,}  {kind}: {reason}" for kind, reason in (
        ("unparseable", "no 'text' field (has: body, title)"),
        ("unparseable", "unparseable line (column N: Invalid control character at)"),
        ("empty", "empty text"), ("invalid_utf8", "invalid UTF-8 at byte N"))]
    listed = [line for line in lines if line.startswith(f"{source}: ")]
    assert len(listed) == len(planted)
    first = min(planted, key=lambda position: int(position.split()[1]))
    assert listed[0] == f"{source}: {first}: unparseable: no 'text' field (has: body, title)"

    assert main(["rejects", str(out), "--kind", "empty", "--limit", "3"]) == 0
    listed = [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"{source}: ")]
    assert len(listed) == 3 and all(line.endswith(": empty: empty text") for line in listed)


def test_rejects_json_is_one_object_per_reject(with_rejects: tuple[Path, Path, dict],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out, source, planted = with_rejects
    assert main(["rejects", str(out), "--json"]) == 0
    rejects = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["position"]: r["kind"] for r in rejects} == {p: kind for p, (kind, _) in planted.items()}
    assert len(rejects) == len(planted)
    assert all(r["source"] == str(source) and r["count"] == 1 for r in rejects)
    assert all(r["reason"] == reason for r in rejects if (reason := planted[r["position"]][1]))


def test_rejects_needs_a_corpus_that_records_them(with_rejects: tuple[Path, Path, dict], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out, _, _ = with_rejects
    assert main(["rejects", str(out.parent / "removed")]) == 2  # the removed documents record no rejects
    assert "its manifest names no rejects file" in capsys.readouterr().err
    assert main(["rejects", str(tmp_path)]) == 2
    assert "no manifest" in capsys.readouterr().err


def test_a_closed_pipe_is_not_an_error(with_rejects: tuple[Path, Path, dict]) -> None:
    out, _, _ = with_rejects
    # the reader goes before anything is written: the first write fails (`gristmill inspect X | true`)
    early = subprocess.Popen([*GRISTMILL, "inspect", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    early.stdout.close()
    assert early.wait(timeout=60) == 0 and early.stderr.read() == b""
    # the reader goes after one byte of a listing several pipes long (`gristmill rejects X | head -c1`)
    late = subprocess.Popen([*GRISTMILL, "rejects", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert late.stdout.read(1)
    late.stdout.close()
    assert late.wait(timeout=60) == 0 and late.stderr.read() == b""
    listing = subprocess.run([*GRISTMILL, "rejects", str(out)], cwd=REPO, capture_output=True, check=True).stdout
    assert len(listing) > 4 * PIPE_BUFFER  # so the writer above met the closed pipe, not an empty buffer


def test_usage_and_input_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["rejects"], ["rejects", str(tmp_path), "--kind", "nope"], ["rejects", str(tmp_path), "--limit", "-1"],
                 ["no-such-command"], ["dedup", str(tmp_path), "--threshold", "high"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2, argv
    capsys.readouterr()
    with ShardWriter(str(tmp_path / "plain")) as writer:  # a corpus without dedup statistics
        pass
    writer.commit()
    assert main(["stats", str(tmp_path / "plain")]) == 2
    assert "the manifest holds no statistics" in capsys.readouterr().err

    shown = subprocess.run([*GRISTMILL, "--help"], cwd=REPO, capture_output=True, text=True)
    assert shown.returncode == 0
    assert "exit status:" in shown.stdout and "\n  130  interrupted (Ctrl-C)" in shown.stdout


def _stop_session(process: subprocess.Popen) -> None:
    """SIGKILL what is left of the processes the test's driver started (its Ray), by their session."""
    kill_session(process.pid)


def test_ctrl_c_exits_130_with_a_resume_hint_and_the_rerun_finishes(
        ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    texts = documents(48)
    for i in range(8):
        write_jsonl(inputs / f"f{i}.jsonl", texts[i::8], prefix=f"f{i}-")
    out = tmp_path / "out"
    argv = ["dedup", str(inputs), "-o", str(out), "--split-bytes", "5000", "--num-partitions", "3"]
    # a session of its own, signalled as a whole: what Ctrl-C in a terminal does to the foreground group
    driver = subprocess.Popen([*GRISTMILL, *argv], cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        done = out / "_work" / "read" / "done"
        deadline = time.monotonic() + 180
        while not list(done.glob("*.json")) and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert driver.poll() is None, driver.communicate()[1][-2000:]
        os.killpg(driver.pid, signal.SIGINT)
        _, err = driver.communicate(timeout=120)
    finally:
        _stop_session(driver)
    assert not (out / "_manifest.json").exists(), "the job finished before Ctrl-C; nothing was tested"
    assert driver.returncode == 130, err[:3000] + "\n...\n" + err[-2000:]  # the chain's root first
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert err.rstrip().endswith("gristmill dedup: interrupted; run the same command again to resume")
    assert "token" not in err.lower(), err[-2000:]  # Ray's token-authentication notice is not the user's concern

    assert main(argv) == 0
    assert Corpus.open(str(out)).stats["documents"]["input"] == len(texts)
    capsys.readouterr()
    assert main(["rejects", str(out)]) == 0
    assert capsys.readouterr().out == f"no rejects: every input record of {out} became a document\n"


def _wrapped(error: BaseException) -> SystemError:
    try:
        raise SystemError("CPUDispatcher(<function minhash>) returned a result with an exception set") from error
    except SystemError as wrapper:
        return wrapper


@pytest.mark.parametrize("cause", [KeyboardInterrupt(), _wrapped(KeyboardInterrupt()), ValueError("a kernel bug"),
                                   _wrapped(ValueError("a kernel bug"))])
def test_ctrl_c_inside_compiled_code_is_an_interrupt_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str],
                                                         cause: BaseException) -> None:
    """numba's dispatcher turns a KeyboardInterrupt raised while it runs into a SystemError caused by it
    (seen on CI as exit 1 with a traceback), and may wrap that one again; only a KeyboardInterrupt at the
    root of the chain is an interrupt, any other cause stays a crash."""
    import gristmill.pipeline.job

    def interrupted(*_: object, **__: object) -> None:
        raise SystemError("CPUDispatcher(<function minhash>) returned a result with an exception set") from cause

    monkeypatch.setattr(gristmill.pipeline.job, "run_dedup", interrupted)
    inputs = tmp_path / "in"
    inputs.mkdir()
    write_jsonl(inputs / "a.jsonl", documents(8))
    argv = ["dedup", str(inputs), "-o", str(tmp_path / "out")]
    if isinstance(cause, KeyboardInterrupt) or isinstance(cause.__cause__, KeyboardInterrupt):
        assert main(argv) == 130
        assert capsys.readouterr().err.endswith("gristmill dedup: interrupted; run the same command again to resume\n")
    else:
        with pytest.raises(SystemError) as raised:
            main(argv)
        assert raised.value.__cause__ is cause


def test_relative_folders_hold_on_ray_workers_and_from_anywhere(ray_local: None, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Folders given relative to where dedup runs, on a Ray whose workers started in another folder (a
    cluster started elsewhere): the job writes where the user meant (it used to fail with a missing
    work file), and the manifest names ``--removed`` absolutely, so ``clusters`` run from another
    folder finds it (it used to look for ``removed`` under its own working folder)."""
    job = tmp_path / "job"
    job.mkdir()
    texts = documents(6)
    write_jsonl(job / "in.jsonl", texts + texts[:2])
    monkeypatch.chdir(job)
    assert main(["dedup", "in.jsonl", "-o", "corpus", "--removed", "removed", "--quiet"]) == 0, capsys.readouterr().err
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["clusters", str(job / "corpus")]) == 0, capsys.readouterr().err
    assert "clusters with removed members" in capsys.readouterr().out


def test_a_damaged_or_missing_shard_is_an_input_error_naming_it(with_rejects: tuple[Path, Path, dict], tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out, _, _ = with_rejects
    corpus, removed = tmp_path / "corpus", tmp_path / "removed"
    shutil.copytree(out, corpus)
    shutil.copytree(out.parent / "removed", removed)
    shard = Corpus.open(str(removed)).shard_path(Corpus.open(str(removed)).shards[0])
    size = os.path.getsize(shard)
    Path(shard).write_bytes(b"\0" * size)  # same size, not Parquet
    assert main(["clusters", str(corpus), "--removed", str(removed)]) == 2
    assert f"gristmill clusters: {corpus}: a shard cannot be read" in capsys.readouterr().err
    os.remove(shard)
    assert main(["clusters", str(corpus), "--removed", str(removed)]) == 2
    assert shard in capsys.readouterr().err


def test_stats_on_a_raw_crawl_says_what_it_is(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    servers: ServerThread = next(iter(generator := serve()))
    try:
        sites = [servers.start(Site(f"127.0.0.{k}", f"s{k}.test")) for k in (2, 3)]
        for site in sites:
            site.article("/", "Home", ["/a", "/gone"])
            site.article("/a", f"A page of {site.name}")
            site.page("/gone", "", status=404)
        crawl_sites(tmp_path / "crawl", [site.url("/") for site in sites], sites)
    finally:
        generator.close()
    out = str(tmp_path / "crawl")
    assert main(["stats", out]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"{out} is a raw crawl of 4 documents from 2 hosts, not yet deduplicated: run "
                           "gristmill dedup on it")
    assert "%" not in text and "exact_duplicate" not in text  # no funnel of zeros
    assert main(["stats", out, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["kind"], summary["documents"], summary["hosts"]) == ("raw crawl", 4, 2)
    assert sum(summary["outcomes"].values()) == 6  # every admitted URL: 4 pages, 2 not found

    shard = Corpus.open(out).shard_path(Corpus.open(out).shards[0])
    Path(shard).write_bytes(b"\0" * os.path.getsize(shard))  # damaged: same size, not Parquet
    assert main(["stats", out]) == 2
    assert capsys.readouterr().err.startswith(f"gristmill stats: {shard}: a shard cannot be read")


JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(crawl=st.fixed_dictionaries({}, optional={"documents": JSON, "outcomes": JSON | st.dictionaries(
    st.text(max_size=8), st.integers(0, 10**6), max_size=4), "parked_hosts": JSON}))
def test_stats_on_a_hostile_crawl_manifest_is_a_summary_or_an_error_naming_it(
        crawl: dict, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path_factory.mktemp("hostile-crawl"))
    writer = ShardWriter(out)
    writer.write([{"id": "a", "text": "x", "domain": "a.test"}, {"id": "b", "text": "y", "domain": "b.test"}])
    writer.commit(stats={"crawl": crawl}, extra={"kind": "raw-crawl"})
    status = main(["stats", out, "--json"])
    captured = capsys.readouterr()
    if status == 0:
        assert json.loads(captured.out) == {"kind": "raw crawl", "documents": 2, "hosts": 2,
                                            "outcomes": crawl.get("outcomes") or {}}
    else:
        assert status == 2 and captured.err.startswith(f"gristmill stats: {out}: the manifest's crawl outcomes "
                                                        "are not counts"), captured.err


def _corpus_of_shards(path: Path, shards: int) -> Corpus:
    writer = ShardWriter(str(path), shard_bytes=4_000, row_group_bytes=1_000)
    writer.write([{"id": f"d{i}", "text": f"document {i} " * 30} for i in range(10 * shards)])
    writer.commit()
    return Corpus.open(str(path))


def test_inspect_verify_shows_progress_unless_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = _corpus_of_shards(tmp_path / "corpus", 6)
    shards, total = len(corpus.shards), corpus.manifest.num_bytes
    assert shards > 3
    capsys.readouterr()
    monkeypatch.setattr("gristmill.pipeline.commands.inspect.PROGRESS_SECONDS", 0.0)  # a line per shard, not per 10 s
    assert all(result.ok for result in verify_shards(corpus, quiet=False))
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith(f"verify {shards}/{shards} shards: {total:,}/{total:,} B (100%), ")
    assert f"verify 1/{shards} shards: " in lines[0] and "B/s, ETA" in lines[0]
    assert all(result.ok for result in verify_shards(corpus, quiet=True))
    assert capsys.readouterr().err == ""

    # on a terminal: a bar that counts shards and bytes (it runs too briefly to redraw before it closes)
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # a new pty is 0 columns wide
    shown = subprocess.Popen([*GRISTMILL, "inspect", str(tmp_path / "corpus"), "--verify"], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=follower)
    os.close(follower)
    bar = b""
    with contextlib.suppress(OSError):  # EIO once the command has closed the terminal
        while chunk := os.read(leader, 65536):
            bar += chunk
    os.close(leader)
    shown.wait(timeout=60)
    assert shown.returncode == 0 and b"all %d shards match" % shards in shown.stdout.read()
    assert f"verify 0/{shards} shards:   0%|".encode() in bar and f"| 0/{total} ".encode() in bar


def test_rays_token_notice_is_dropped_and_its_other_warnings_kept() -> None:
    import inspect
    import logging

    from ray._private.authentication import authentication_token_setup as ray_auth

    from gristmill.pipeline.cli import quiet_third_party_warnings

    quiet_third_party_warnings()
    logger = logging.getLogger(ray_auth.__name__)
    assert logger is ray_auth.logger

    def passes(message: str) -> bool:
        return bool(logger.filter(logger.makeRecord(logger.name, logging.WARNING, __file__, 1, message, None, None)))

    notice = "Token authentication is enabled for this Ray cluster"
    assert notice in inspect.getsource(ray_auth._warn_token_auth_enabled)  # what this Ray prints, word for word
    assert not passes(f"{notice}. Set RAY_AUTH_MODE=disabled to opt out.")
    assert passes("Token authentication is disabled for this Ray cluster. Anyone with network access ...")
