"""A partitioned crawl on a Ray cluster whose worker nodes have private disks (tests/private_nodes.py),
output and state on S3 (moto): what issue 29 found and these tests pin down.

There the crawl never ended and published no manifest (partitions reported their status, segments
and links as files on their own node's disk, which the coordinator never saw), and
``--state-dir s3://...`` wrote a local folder named ``s3:``. Now partitions talk to the coordinator
through a hub actor, each checkpoints its frontier to the store at every commit, and a partition
whose node is killed mid-crawl resumes on another node from its last checkpoint: every page is
stored once, none is lost.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import s3fs

from gristmill.crawlers import crawl
from gristmill.crawlers.state import scratch_folder
from gristmill.pipeline.demo.site.server import DemoSite
from gristmill.pipeline.format import Corpus

from private_nodes import PrivateNodes, private_nodes  # isort: skip
from sessions import kill_session  # isort: skip

pytestmark = pytest.mark.timeout(600)
GRISTMILL = str(Path(sys.executable).parent / "gristmill")
SETTINGS = dict(allow_networks=["127.0.0.0/8"], adaptive=False, extract=False, commit_every=3, commit_interval=0.3,
                progress_interval=60.0)


@pytest.fixture(scope="module")
def site() -> Iterator[DemoSite]:
    with DemoSite() as served:
        yield served


@pytest.fixture(scope="module")
def single(site: DemoSite, tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The URLs one local crawler stores from the demo sites: what every partitioned crawl must store."""
    out = tmp_path_factory.mktemp("single")
    crawl(site.seeds, str(out), host_map=site.host_map, min_delay=0.0, **SETTINGS)
    return set(_stored(str(out), {}))


@pytest.fixture(scope="module")
def cluster(s3_server: dict) -> Iterator[PrivateNodes]:
    """A head and two worker nodes on private disks; this process is the driver connected to them."""
    import ray
    from ray._private.authentication_test_utils import reset_auth_token_state

    # Ray's own failure detection: a killed node's raylet refuses the health check at once, so it is
    # marked dead after five checks 3 s apart; shorter timeouts marked live nodes dead at load 34 here
    with private_nodes({"AWS_ENDPOINT_URL": s3_server["endpoint_url"]}, workers=2) as nodes:
        patch = pytest.MonkeyPatch()
        for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
            patch.setenv(key, nodes.env[key])
        reset_auth_token_state()  # Ray reads the token once per process: this driver joins with the nodes' one
        try:
            ray.init(address=nodes.address, logging_level="ERROR", log_to_driver=False)
            yield nodes
        finally:
            ray.shutdown()
            patch.undo()
            reset_auth_token_state()


def _stored(output: str, options: dict) -> list[str]:
    """Every URL the published manifest's shards hold (a URL twice if it was stored twice)."""
    corpus = Corpus.open(output, storage_options=options)
    fs = s3fs.S3FileSystem(**options) if output.startswith("s3://") else None
    urls = []
    for shard in corpus.manifest.shards:
        path = f"{output}/{shard.path}"
        if fs is not None:
            with fs.open(path, "rb") as handle:
                urls += pq.read_table(handle, columns=["url"]).column("url").to_pylist()
        else:
            urls += pq.read_table(path, columns=["url"]).column("url").to_pylist()
    return urls


def _session_of(pid: int) -> int | None:
    result = subprocess.run(["ps", "-o", "sid=", "-p", str(pid)], capture_output=True, text=True)
    return int(result.stdout) if result.stdout.strip() else None


def test_a_partitioned_crawl_on_private_disks_publishes_every_page_once(cluster: PrivateNodes, site: DemoSite,
                                                                         single: set[str], s3_bucket: str,
                                                                         s3_server: dict) -> None:
    from gristmill.pipeline.commands.crawl import RayLauncher

    options = s3_server["storage_options"]
    output = f"{s3_bucket}/out"
    launcher = RayLauncher()
    sessions: dict[int, int | None] = {}
    done = threading.Event()

    def note_where_the_partitions_run() -> None:
        while not done.wait(0.05) and len(sessions) < 2:
            statuses = launcher.hub.statuses([0, 1]) if launcher.hub is not None else {}
            for index, status in statuses.items():
                sessions.setdefault(index, _session_of(int(status["epoch"].split(":")[0])))

    watcher = threading.Thread(target=note_where_the_partitions_run, daemon=True)
    watcher.start()
    summary = crawl(site.seeds, output, host_map=site.host_map, partitions=2, launcher=launcher,
                    storage_options=options, min_delay=0.0, **SETTINGS)
    done.set()
    watcher.join()
    assert len(set(sessions.values())) == 2, f"the partitions shared a node: {sessions}"  # STRICT_SPREAD
    stored = _stored(output, options)
    assert len(stored) == len(set(stored)), "a page was stored twice"
    assert set(stored) == single
    assert summary.documents == len(stored)
    fs = s3fs.S3FileSystem(**options)
    assert all(fs.glob(f"{output}/_crawl/p{index}/frontier-*.sqlite") for index in (0, 1))


def test_a_node_killed_mid_crawl_loses_no_page_and_stores_none_twice(cluster: PrivateNodes, site: DemoSite,
                                                                     single: set[str], s3_bucket: str,
                                                                     s3_server: dict) -> None:
    from gristmill.pipeline.commands.crawl import RayLauncher

    options = s3_server["storage_options"]
    output = f"{s3_bucket}/out"
    fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
    launcher = RayLauncher()
    killed: list[tuple[int, int]] = []
    # every node is 127.0.0.1, so this driver may have joined through a worker node's raylet: never kill that one
    import ray

    mine = ray.get_runtime_context().get_node_id()
    port = next(node["NodeManagerPort"] for node in ray.nodes() if node["NodeID"] == mine)
    victims = {session for session, raylet in cluster.workers.items() if raylet != port}

    def kill_a_worker_node_once_its_partition_checkpointed() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            time.sleep(0.1)
            if launcher.hub is None:
                continue
            for index, status in launcher.hub.statuses([0, 1]).items():
                session = _session_of(int(status["epoch"].split(":")[0]))
                if session in victims and fs.glob(f"{output}/_crawl/p{index}/frontier-*.sqlite"):
                    fs.invalidate_cache()
                    kill_session(session)
                    killed.append((index, session))
                    return
            fs.invalidate_cache()

    watcher = threading.Thread(target=kill_a_worker_node_once_its_partition_checkpointed, daemon=True)
    watcher.start()
    summary = crawl(site.seeds, output, host_map=site.host_map, partitions=2, launcher=launcher,
                    storage_options=options, min_delay=0.3, **SETTINGS)
    watcher.join()
    assert killed, "no worker node was killed mid-crawl"
    stored = _stored(output, options)
    assert len(stored) == len(set(stored)), "a page was stored twice"
    assert set(stored) == single, f"lost: {sorted(single - set(stored))[:5]}"
    assert summary.documents == len(stored)


@pytest.mark.parametrize("partitions", [1, 2])
def test_a_state_dir_on_s3_is_checkpointed_there_not_in_a_local_folder(site: DemoSite, s3_bucket: str,
                                                                         s3_server: dict, tmp_path: Path,
                                                                         partitions: int) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("".join(seed + "\n" for seed in site.seeds[:2]))
    state = f"{s3_bucket}/state"
    command = [GRISTMILL, "crawl", str(seeds), "-o", str(tmp_path / "out"), "--state-dir", state, "--delay", "0",
               "--allow-network", "127.0.0.0/8", "--no-extract", "--extract-workers", "1", "--max-pages", "6",
               "--partitions", str(partitions), "--quiet", "--json"] + [
                   f"--resolve={host}={ip}" for host, ip in site.host_map.items()]
    first = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert not (tmp_path / "s3:").exists()
    fs = s3fs.S3FileSystem(**s3_server["storage_options"])
    folders = [state] if partitions == 1 else [f"{state}/p{i}" for i in (0, 1)]
    assert all(fs.glob(f"{folder}/frontier-*.sqlite") for folder in folders)
    left = [path.name for path in Path(scratch_folder(state)).rglob("frontier.sqlite*")]
    assert set(left) <= {"frontier.sqlite.lock"}, left  # the node's copy is gone after the run (not its lock)
    stored = _stored(str(tmp_path / "out"), {})
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert _stored(str(tmp_path / "out"), {}) == stored  # resumed from the store: nothing fetched again


@pytest.mark.parametrize("state", ["http://127.0.0.1:9/state", "nosuchscheme://x/state"])
def test_a_state_dir_that_cannot_hold_a_frontier_is_refused(state: str, tmp_path: Path) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://127.0.0.1:9/\n")
    result = subprocess.run([GRISTMILL, "crawl", str(seeds), "-o", str(tmp_path / "out"), "--state-dir", state],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and state in result.stderr
    assert not any(tmp_path.glob("*:"))


def test_a_local_state_dir_the_worker_nodes_do_not_see_is_refused(cluster: PrivateNodes, tmp_path: Path,
                                                                  s3_bucket: str) -> None:
    seeds = tmp_path / "seeds.txt"
    seeds.write_text("http://127.0.0.1:9/\n")
    state = cluster.data / "state"
    result = subprocess.run([GRISTMILL, "crawl", str(seeds), "-o", f"{s3_bucket}/out", "--state-dir", str(state),
                             "--partitions", "2", "--ray-address", cluster.address],
                            env=cluster.env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert f"--state-dir {state} is a local path that node" in result.stderr
