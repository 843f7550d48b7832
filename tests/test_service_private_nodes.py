"""``gristmill serve --shards 2 --state-dir s3://...`` on a Ray cluster whose worker nodes have private
disks (tests/private_nodes.py), S3 being moto behind benchmarks/shaped_store.py: the node holding a
shard is killed with acknowledged adds on it; while the shard is down every request is 503 (never
500), and once it has restarted on another node every acknowledged add is found."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs
from test_service import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from private_nodes import PrivateNodes, describe_nodes, private_nodes  # noqa: E402
from sessions import kill_session  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ACKNOWLEDGED = 40


@pytest.fixture(scope="module")
def cluster(store: object) -> Iterator[PrivateNodes]:
    # a node whose raylet is gone is declared dead after about 5 s instead of 15 (Ray's defaults); not
    # less: a node starting on two busy cores must not miss its checks
    env = {"AWS_ENDPOINT_URL": store.endpoint, "RAY_health_check_period_ms": "1000",  # type: ignore[attr-defined]
           "RAY_health_check_failure_threshold": "5", "RAY_raylet_start_wait_time_s": "120"}
    with private_nodes(env, workers=2) as nodes:
        yield nodes


def node_session(pid: int) -> int:
    """The session of the node a Ray worker runs on: its parent's (the raylet's), which ``ray start`` began."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        parent = int(handle.read().rsplit(")", 1)[1].split()[1])
    return os.getsid(parent)


def post(url: str, body: dict) -> tuple[int, dict, str | None]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read()), None
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers.get("Retry-After")


def test_a_killed_node_costs_only_503s_and_no_acknowledged_add(cluster: PrivateNodes, store: object,
                                                               tmp_path: Path) -> None:
    endpoint = store.endpoint  # type: ignore[attr-defined]
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True)
    bucket = f"serve-{uuid.uuid4().hex[:8]}"
    fs.mkdir(bucket)
    state = f"s3://{bucket}/state"
    env = {**cluster.env, "AWS_ENDPOINT_URL": endpoint}
    stderr = tmp_path / "front-stderr.txt"
    with open(stderr, "wb") as err:
        front = subprocess.Popen([sys.executable, "-m", "gristmill.pipeline.cli", "serve", "--port", "0", "--shards", "2",
                                  "--state-dir", state, "--ray-address", cluster.address, "--shard-timeout", "8"],
                                 cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert front.stdout is not None
        url = next((line.split("listening on ", 1)[1].strip() for line in front.stdout if "listening on " in line), None)
        assert url is not None, stderr.read_text()
        docs = [(f"d-{n}", text(70_000 + n)) for n in range(ACKNOWLEDGED)]
        for start in range(0, ACKNOWLEDGED, 4):
            status, answer, _ = post(f"{url}/add", {"documents": [{"id": i, "text": t} for i, t in docs[start:start + 4]]})
            assert status == 200 and all(r["added"] for r in answer["results"]), answer

        placements = [json.loads(fs.cat_file(f"{bucket}/state/shard-{k}/placement.json")) for k in range(2)]
        # shard k starts on the k-th alive node, worker nodes first: one shard on each worker node
        assert sorted(node_session(p["pid"]) for p in placements) == sorted(cluster.sessions[1:]), \
            f"shards not one per worker node: {placements}; {describe_nodes(cluster)}"
        victim = 0
        kill_session(node_session(placements[victim]["pid"]))  # the node (raylet, workers, disk) is gone

        statuses, retry_after = [], set()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            status, answer, retry = post(f"{url}/check", {"documents": [{"text": t} for _, t in docs]})
            statuses.append(status)
            if status == 503:
                retry_after.add(retry)
            if status == 200:
                break
            time.sleep(0.2)
        assert set(statuses) <= {200, 503} and statuses[-1] == 200, (statuses, stderr.read_text()[-3000:])
        assert 503 in statuses and retry_after == {"1"}  # the shard was seen down, and said so
        assert [r["exact_duplicate_of"] for r in answer["results"]] == [i for i, _ in docs]
        after = json.loads(fs.cat_file(f"{bucket}/state/shard-{victim}/placement.json"))
        assert after["generation"] == placements[victim]["generation"] + 1 and after["pid"] != placements[victim]["pid"]
        assert after["node"] != placements[victim]["node"]  # restarted on another node
        with urllib.request.urlopen(f"{url}/stats", timeout=60) as answer:  # the front shows what the store holds
            assert json.loads(answer.read())["placement"][victim] == after
        status, answer, _ = post(f"{url}/add", {"id": "after", "text": text(99_999)})  # adds go on
        assert status == 200 and answer["results"][0]["added"]
    finally:
        front.terminate()
        front.wait(timeout=60)
