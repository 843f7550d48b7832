"""``gristmill crawl`` speaks the shared vocabulary (issue 19): --json, -q/--quiet, --job TOML,
--max-body-bytes SIZE (the old --max-body-mb renamed), readable progress lines off a terminal, and a
re-run of a finished crawl that exits at once, quietly."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_crawl_support import ServerThread, Site, documents, outcomes, serve

from gristmill.pipeline.cli import main

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def servers() -> Iterator[ServerThread]:
    yield from serve()


def _site(servers: ServerThread, pages: int = 4, name: str = "cli.test") -> Site:
    site = servers.start(Site("127.0.0.1", name))
    site.article("/", "Home", [f"/p{i}" for i in range(pages)])
    for i in range(pages):
        site.article(f"/p{i}", f"Page number {i} of the site", words=150)
    return site


def _cli(seeds: Path, out: Path, site: Site, *options: str) -> subprocess.CompletedProcess[str]:
    """The command in a process of its own: stderr is a pipe, not a terminal."""
    return subprocess.run(
        [sys.executable, "-m", "gristmill.pipeline.cli", "crawl", str(seeds), "-o", str(out), "--allow-network", "127.0.0.0/8",
         "--resolve", f"{site.name}={site.ip}", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=90, check=False)


def _seeds(tmp_path: Path, site: Site) -> Path:
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(site.url("/") + "\n", encoding="utf-8")
    return seeds


def test_a_rerun_of_a_finished_crawl_exits_at_once_quietly_and_fetches_nothing(servers: ServerThread,
                                                                               tmp_path: Path) -> None:
    """With extraction on: the re-run used to start extraction workers and close them while they
    loaded, so one died with a BrokenPipeError traceback, after seconds of waiting for nothing."""
    site = _site(servers)
    seeds, out = _seeds(tmp_path, site), tmp_path / "out"
    first = _cli(seeds, out, site, "--delay", "0", "--extract-workers", "1", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["documents"] == 5
    hits = len(site.hits)
    again = _cli(seeds, out, site, "--delay", "0", "--extract-workers", "1", "--json")
    assert again.returncode == 0, again.stderr
    assert "Traceback" not in again.stderr and "Error" not in again.stderr, again.stderr
    assert len(site.hits) == hits  # not a page, not even robots.txt
    report = json.loads(again.stdout)
    assert report["fetched_this_run"] == 0 and report["requests"] == 0 and report["documents"] == 5
    assert "nothing left to fetch" in again.stderr
    quiet = _cli(seeds, out, site, "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "" and "5 documents stored" in quiet.stdout


def test_progress_lines_off_a_terminal_are_readable_and_quiet_has_none(servers: ServerThread,
                                                                      tmp_path: Path) -> None:
    site = _site(servers, pages=6)
    seeds = _seeds(tmp_path, site)
    # 7 pages 0.4 s apart on one host, a progress line every 0.2 s
    loud = _cli(seeds, tmp_path / "loud", site, "--delay", "0.4", "--per-host", "1", "--no-extract",
                "--progress", "0.2", "--max-pages", "7")
    assert loud.returncode == 0, loud.stderr
    lines = [line for line in loud.stderr.splitlines() if "crawl: " in line and "documents stored of 7" in line]
    assert len(lines) >= 3, loud.stderr
    assert not any("{" in line or "}" in line for line in lines), lines  # no Python dict reprs
    assert all("pages processed" in line and "waiting for extraction" in line and "URLs queued" in line
               for line in lines)
    assert any("ETA" in line for line in lines) and any("(200: " in line for line in lines)
    assert "7 documents stored (all runs)" in loud.stdout  # the summary, for a person
    quiet = _cli(seeds, tmp_path / "quiet", site, "--delay", "0.4", "--per-host", "1", "--no-extract",
                 "--progress", "0.2", "--quiet")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert len(documents(tmp_path / "quiet")) == 7


def test_a_job_file_sets_options_and_the_command_line_wins(servers: ServerThread, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    site = _site(servers)
    site.page("/big", "<html><body><p>" + "large " * 2000 + "</p></body></html>")
    site.article("/", "Home", ["/big", "/p0", "/p1", "/p2", "/p3"])
    job = tmp_path / "job.toml"
    job.write_text(f'[crawl]\noutput = "{tmp_path / "out"}"\ndelay = 0\nno-extract = true\nquiet = true\n'
                   f'json = true\nallow-network = ["127.0.0.0/8"]\nresolve = ["{site.name}={site.ip}"]\n'
                   f'max-body-bytes = "4KiB"\nmax-pages = 2\n', encoding="utf-8")
    status = main(["crawl", str(_seeds(tmp_path, site)), "--job", str(job), "--max-pages", "50"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    report = json.loads(captured.out)  # json = true came from the file
    assert report["documents"] == 5  # --max-pages 50 beat the file's 2
    assert outcomes(tmp_path / "out")[site.url("/big")].startswith("rejected: "), outcomes(tmp_path / "out")


# Options a generated job file may set without reaching outside the test (no output, state or worker processes).
SAFE_KEYS = ("delay", "max-pages", "max-depth", "concurrency", "per-host", "follow", "max-body-bytes", "no-robots",
             "retries", "resolve", "allow-network", "max-delay", "user-agent", "no-extract")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(key="a", value="\x7f")  # JSON that is not TOML: found by this test in CI
@given(key=st.one_of(st.sampled_from(SAFE_KEYS), st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True)),
       value=st.one_of(st.integers(-2**63, 2**63 - 1), st.text(max_size=10), st.booleans(),
                       st.sampled_from(["127.0.0.0/8", "64KiB", "any", "x.test=127.0.0.1"]),
                       st.lists(st.integers(0, 9), max_size=2)))
def test_a_bad_job_file_exits_2_naming_the_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        key: str, value: object) -> None:
    """Generated keys and values: an unknown key is a usage error naming the file and the key; a
    value the flag refuses is a usage error too; a good one goes through to a crawl of a seed nobody
    answers, which stores nothing (exit 1). Never a traceback."""
    job = tmp_path / "job.toml"
    text = f"[crawl]\n{key} = {json.dumps(value, ensure_ascii=False)}\n"  # JSON is TOML, but for DEL (0x7f)
    job.write_text(text, encoding="utf-8")
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        valid = False
    else:
        valid = True
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://127.0.0.1:9/\n", encoding="utf-8")
    status = main(["crawl", str(seeds), "-o", str(tmp_path / "out"), "--job", str(job), "--quiet", "--retries", "0",
                   "--delay", "0", "--timeout", "2"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if not valid:
        assert status == 2 and f"{job}: not a valid TOML file" in err, err
    elif key not in SAFE_KEYS:
        assert status == 2 and f"{job}: unknown option '{key}'" in err, err
    else:
        assert status in (1, 2) and err.startswith("gristmill crawl: "), err
        assert status == 1 or "nothing stored" not in err


def test_max_body_bytes_takes_units_and_the_old_spelling_still_works(servers: ServerThread, tmp_path: Path) -> None:
    site = _site(servers, pages=0)
    site.page("/big", "<html><body><p>" + "large " * 2000 + "</p></body></html>")
    site.article("/", "Home", ["/big"])
    seeds = _seeds(tmp_path, site)
    new = _cli(seeds, tmp_path / "new", site, "--delay", "0", "--no-extract", "--max-body-bytes", "4KiB", "--json")
    old = _cli(seeds, tmp_path / "old", site, "--delay", "0", "--no-extract", "--max-body-mb", "0.004", "--json")
    for result, out in ((new, tmp_path / "new"), (old, tmp_path / "old")):
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["documents"] == 1
        assert outcomes(out)[site.url("/big")].startswith("rejected: ")
    assert "--max-body-mb is deprecated; use --max-body-bytes" in old.stderr
    assert "deprecated" not in new.stderr
    bad = _cli(seeds, tmp_path / "bad", site, "--max-body-bytes", "10 parsecs")
    assert bad.returncode == 2 and "is not a size" in bad.stderr


def test_an_extraction_worker_whose_crawl_has_gone_exits_without_a_traceback() -> None:
    """The worker's side of a pool closed while it loaded: its "ready" meets a closed pipe."""
    import multiprocessing

    from gristmill.crawlers.extract import _serve

    ours, theirs = multiprocessing.Pipe()
    ours.close()
    assert _serve(theirs) is None  # before, BrokenPipeError escaped and the worker printed its traceback
    theirs.close()


@pytest.mark.parametrize("partitions", [1, 2])
def test_on_a_terminal_progress_is_a_bar_of_documents_out_of_max_pages(servers: ServerThread, tmp_path: Path,
                                                                       partitions: int) -> None:
    """stderr a pseudo-terminal (160 columns): a bar that moves, and ends at the crawl's final count;
    with partitions, one bar of the whole crawl (their reports added up), one host in each."""
    import fcntl
    import os
    import pty
    import struct
    import termios
    import threading

    sites = [_site(servers, pages=6, name=name) for name in ("cli.test", "two.test")[:partitions]]
    total = 7 * partitions
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("".join(site.url("/") + "\n" for site in sites), encoding="utf-8")
    resolve = [option for site in sites for option in ("--resolve", f"{site.name}={site.ip}")]
    master, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal side closed
                return
            if not chunk:
                return
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "gristmill.pipeline.cli", "crawl", str(seeds), "-o", str(tmp_path / "out"),
             "--allow-network", "127.0.0.0/8", *resolve, "--delay", "0.4", "--per-host", "1", "--no-extract",
             "--max-pages", str(total), "--partitions", str(partitions)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=terminal, text=True, timeout=90, check=False)
    finally:
        os.close(terminal)
        reader.join(5)
        os.close(master)
    shown = b"".join(chunks).decode("utf-8", "replace")
    assert result.returncode == 0, shown
    frames = [frame for frame in shown.split("\r") if frame.startswith("crawl: stored:")]
    assert len(frames) >= 3 and f"0/{total}" in frames[0], shown  # it moved, out of --max-pages
    counts = [int(frame.split("/")[0].split()[-1]) for frame in frames]
    assert counts == sorted(counts) and any(0 < count < total for count in counts), frames  # one bar, moving
    assert f"{total}/{total}" in frames[-1] and f"{total} pages processed, 0 queued" in frames[-1], frames[-1]
    assert "{" not in shown


@pytest.mark.parametrize("partitions", [1, 2])
def test_max_pages_is_a_hard_cap_and_a_higher_one_goes_on(servers: ServerThread, tmp_path: Path, partitions: int,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    sites = [_site(servers, pages=20, name=name) for name in ("one.test", "two.test")]
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("".join(site.url("/") + "\n" for site in sites), encoding="utf-8")
    out = tmp_path / "out"
    command = ["crawl", str(seeds), "-o", str(out), "--allow-network", "127.0.0.0/8", "--delay", "0", "--no-extract",
               "--per-host", "8", "--max-delay", "0", "--concurrency", "32", "--partitions", str(partitions), "--progress",
               "60",
               *(f"--resolve={site.name}={site.ip}" for site in sites)]
    for cap in (5, 9):
        assert main([*command, "--max-pages", str(cap)]) == 0
        shown = capsys.readouterr().out
        stored = [row["url"] for row in documents(out)]
        assert len(stored) == len(set(stored)) == cap, shown  # not one page more, none twice
        assert f"--max-pages {cap} is reached" in shown and "higher --max-pages to go on" in shown


def test_a_crawl_publishes_its_manifest_only_under_the_output_lease(servers: ServerThread, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from gristmill.pipeline.format import Lease

    site = _site(servers)
    out = tmp_path / "out"
    out.mkdir()
    dedup = Lease(str(out), "dedup-job")  # another writer of the folder, e.g. a dedup job's --overwrite
    dedup.acquire()
    try:
        status = main(["crawl", str(_seeds(tmp_path, site)), "-o", str(out), "--allow-network", "127.0.0.0/8",
                       f"--resolve={site.name}={site.ip}", "--delay", "0", "--no-extract", "--quiet"])
    finally:
        dedup.release()
    error = capsys.readouterr().err
    assert status == 2 and error.count("\n") == 1, error
    assert f"{out} is being written by another" in error
    assert not list(out.glob("*manifest.json"))
    assert main(["crawl", str(_seeds(tmp_path, site)), "-o", str(out), "--allow-network", "127.0.0.0/8",
                 f"--resolve={site.name}={site.ip}", "--delay", "0", "--no-extract", "--quiet"]) == 0
    assert len(documents(out)) == 5 and not (out / "_lease.json").exists()  # given back after publishing
