"""``partitions=K``: K crawler processes, each owning the hosts whose registered domain hashes to it.

Against the bundled demo sites (five hosts on 127.0.0.1 ports, linking across hosts): the same URLs
are stored as by one partition, none twice, and the servers see each host's limits kept. A partition
SIGKILLed mid-crawl is restarted from its frontier, and a re-run adds nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from aiohttp import web
from sessions import kill_session

from gristmill.crawlers import crawl
from gristmill.crawlers.partitions import deal, partition_of
from gristmill.pipeline.demo.site.server import DemoSite
from gristmill.pipeline.format import Corpus

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parents[1]
MIN_DELAY = 0.12


class TimedDemoSite(DemoSite):
    """The demo sites, logging each request's arrival time and the requests open per host."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.arrivals: dict[str, list[float]] = defaultdict(list)
        self.open: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()

    def _handler(self, host: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        inner = super()._handler(host)

        async def handle(request: web.Request) -> web.StreamResponse:
            self.arrivals[host].append(time.monotonic())
            self.open[host] += 1
            self.peak[host] = max(self.peak[host], self.open[host])
            try:
                return await inner(request)
            finally:
                self.open[host] -= 1

        return handle


@pytest.fixture(scope="module")
def site() -> Iterator[TimedDemoSite]:
    with TimedDemoSite() as demo:
        yield demo


def stored_urls(out: Path) -> list[str]:
    """Every ``url`` the committed manifest's shards hold (duplicates kept, to be counted)."""
    corpus = Corpus.open(str(out))
    return [url for shard in corpus.manifest.shards
            for url in pq.read_table(out / shard.path, columns=["url"]).column("url").to_pylist()]


def _crawl(site: DemoSite, out: Path, partitions: int) -> list[str]:
    crawl(site.seeds, str(out), allow_networks=["127.0.0.0/8"], host_map=site.host_map, min_delay=MIN_DELAY,
          adaptive=False, per_host_concurrency=1, extract=False, partitions=partitions, commit_interval=0.5,
          progress_interval=60.0)
    return stored_urls(out)


def test_the_demo_sites_span_partitions_and_link_across_hosts(site: TimedDemoSite) -> None:
    """What the tests below rely on: hosts in every partition, and links that leave their host."""
    for count in (2, 3):
        assert {partition_of(seed, count, deal(site.seeds, count)) for seed in site.seeds} == set(range(count))
    hosts = {url.split("/")[2]: url.split("/")[2] for url in site.seeds}
    crossing = [url for url, page in site.pages()
                if any(h in page.body for h in hosts if h != url.split("/")[2])]
    assert crossing, "no demo page links to another host"


@pytest.fixture(scope="module")
def single(site: TimedDemoSite, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """What one crawler stores from the demo sites."""
    return _crawl(site, tmp_path_factory.mktemp("single") / "out", 1)


@pytest.mark.parametrize("partitions", [2, 3])
def test_partitions_store_what_one_crawler_stores_once_each_and_politely(site: TimedDemoSite, tmp_path: Path,
                                                                        single: list[str], partitions: int) -> None:
    site.arrivals.clear()
    site.peak.clear()
    split = _crawl(site, tmp_path / "split", partitions)
    assert len(single) == len(set(single)) > 50
    assert len(split) == len(set(split)), "a URL was stored twice"
    assert set(split) == set(single)
    shards_by_partition = {shard.path.split("-")[1] for shard in Corpus.open(str(tmp_path / "split")).manifest.shards}
    assert shards_by_partition == {f"p{i}" for i in range(partitions)}
    for host, times in site.arrivals.items():
        assert site.peak[host] == 1, f"{host} had {site.peak[host]} requests open at once"
        # the rate over any ten requests in a row (a second crawler on the host would halve the span);
        # the slack covers a busy machine delaying the first request of a span more than the last
        spans = [b - a for a, b in zip(times, times[9:])]
        assert min(spans) >= 9 * MIN_DELAY - 0.1, f"{host}: ten requests within {min(spans):.3f} s"


RUNNER = """
import json, sys
from gristmill.crawlers import crawl
seeds, out, host_map = json.loads(sys.argv[1])
summary = crawl(seeds, out, allow_networks=["127.0.0.0/8"], host_map=host_map, min_delay=0.02, adaptive=False,
                extract=False, partitions=2, commit_every=5, commit_interval=0.3, progress_interval=60.0)
print(json.dumps({"documents": summary.documents, "errors": summary.errors}))
"""


def _partition_pid(out: Path, index: int) -> int | None:
    try:
        status = json.loads((out / ".crawl" / f"p{index}" / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return int(status["epoch"].split(":")[0])


def _parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def test_a_partition_killed_mid_crawl_restarts_and_nothing_is_lost_or_stored_twice(
        site: TimedDemoSite, single: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    victim = partition_of(site.seeds[0], 2, deal(site.seeds, 2))
    argument = json.dumps([site.seeds, str(out), site.host_map])
    hits_before = len(site.hits)
    process = subprocess.Popen([sys.executable, "-c", RUNNER, argument], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while (len(site.hits) < hits_before + 30 or _partition_pid(out, victim) is None) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        killed = _partition_pid(out, victim)
        assert killed is not None and process.poll() is None, "the crawl ended before the kill"
        # the runner has no other thread, so its partitions are its own forks (no fork server between)
        assert _parent_of(killed) == process.pid
        os.kill(killed, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        kill_session(process.pid)
    assert process.returncode == 0, stderr[-2000:]
    assert "restarting it from its frontier" in stderr
    assert _partition_pid(out, victim) != killed
    first = stored_urls(out)
    assert len(first) == len(set(first)), "a URL was stored twice"
    assert set(first) == set(single), "the restarted partition lost URLs"
    hits_before = len(site.hits)
    rerun = crawl(site.seeds, str(out), allow_networks=["127.0.0.0/8"], host_map=site.host_map, min_delay=0.02,
                  extract=False, partitions=2, progress_interval=60.0)
    assert rerun.fetched_this_run == 0 and rerun.documents == len(first)
    assert all(hit.path == "/robots.txt" for hit in site.hits[hits_before:])  # nothing fetched again
    assert stored_urls(out) == first


@pytest.mark.parametrize(("before", "now"), [(3, 2), (2, 1), (1, 2)])
def test_another_number_of_partitions_is_refused_on_resume(tmp_path: Path, before: int, now: int) -> None:
    state = tmp_path / "out" / ".crawl"
    state.mkdir(parents=True)
    if before == 1:
        (state / "frontier.sqlite").write_bytes(b"")
    else:
        (state / "partitions.json").write_text(json.dumps({"partitions": before}))
    command = [sys.executable, "-m", "gristmill.pipeline.cli", "crawl", "-", "-o", str(tmp_path / "out"),
               "--partitions", str(now)]
    result = subprocess.run(command, input="http://a.test/\n", capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert f"with {before} partition" in result.stderr and f"not {now}" in result.stderr


def _session(session_id: int) -> list[int]:
    """The processes still in session ``session_id``."""
    listing = subprocess.run(["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True).stdout
    return [int(pid) for pid, sid, stat in (line.split() for line in listing.splitlines())
            if int(sid) == session_id and not stat.startswith("Z")]


def test_partitions_die_with_their_coordinator_and_a_rerun_stores_each_page_once(
        site: TimedDemoSite, single: list[str], tmp_path: Path) -> None:
    out = tmp_path / "out"
    argument = json.dumps([site.seeds, str(out), site.host_map])
    hits_before = len(site.hits)
    process = subprocess.Popen([sys.executable, "-c", RUNNER, argument], cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while (len(site.hits) < hits_before + 30 or None in (_partition_pid(out, 0), _partition_pid(out, 1))) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        partitions = [_partition_pid(out, 0), _partition_pid(out, 1)]
        assert None not in partitions and process.poll() is None, "the crawl ended before the kill"
        process.kill()  # kill -9 of the coordinator: nothing of it runs to tell its partitions
        process.wait()
        deadline = time.monotonic() + 60  # only so orphans that run on fail the test instead of hanging it
        while _session(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _session(process.pid), f"processes outlived their coordinator: {_session(process.pid)}"
    finally:
        kill_session(process.pid)
    rerun = crawl(site.seeds, str(out), allow_networks=["127.0.0.0/8"], host_map=site.host_map, min_delay=0.02,
                  extract=False, partitions=2, progress_interval=60.0)
    stored = stored_urls(out)
    assert rerun.documents == len(stored)
    assert len(stored) == len(set(stored)), "a URL was stored twice"
    assert set(stored) == set(single)


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_crawl_beside_a_live_one_is_refused_naming_it(tmp_path: Path, partitions: int) -> None:
    from gristmill.crawlers.locks import hold

    state = tmp_path / "out" / ".crawl"
    state.mkdir(parents=True)
    held = hold(str(state / ("frontier.sqlite.lock" if partitions == 1 else "coordinator.lock")))
    try:
        command = [sys.executable, "-m", "gristmill.pipeline.cli", "crawl", "-", "-o", str(tmp_path / "out"),
                   "--partitions", str(partitions), "--quiet"]
        result = subprocess.run(command, input="http://a.test/\n", capture_output=True, text=True, cwd=ROOT,
                                timeout=120)
    finally:
        held.close()
    assert result.returncode == 2, result.stderr
    assert f"in use by process {os.getpid()} on " in result.stderr and "Traceback" not in result.stderr


HANGING_RUNNER = """
import json, sys
from gristmill.crawlers import crawl
seeds, out = json.loads(sys.argv[1])
crawl(seeds, out, allow_networks=["127.0.0.0/8"], min_delay=0.0, adaptive=False, extract=False, partitions=2,
      read_timeout=600.0, total_timeout=600.0, progress_interval=60.0)
"""


def test_an_orphaned_partition_stuck_in_a_fetch_still_goes(tmp_path: Path) -> None:
    from test_crawl_support import ServerThread, Site

    servers = ServerThread()
    site = Site()

    async def hang(request: web.Request) -> web.StreamResponse:
        await asyncio.Event().wait()  # a response that never comes: a graceful stop would wait for it
        raise AssertionError("unreachable")

    site.default = hang
    site.page("/robots.txt", "User-agent: *\nAllow: /\n", content_type="text/plain")
    site.article("/", "Home", ["/stuck"])
    servers.start(site)
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-c", HANGING_RUNNER, json.dumps([[site.url("/")], str(out)])],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while (site.in_flight == 0 or None in (_partition_pid(out, 0), _partition_pid(out, 1))) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert site.in_flight and process.poll() is None, "no fetch hung before the kill"
        process.kill()
        process.wait()
        deadline = time.monotonic() + 60  # far below the fetch's 600 s timeout
        while _session(process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _session(process.pid), f"processes outlived their coordinator: {_session(process.pid)}"
    finally:
        kill_session(process.pid)
        servers.stop()
