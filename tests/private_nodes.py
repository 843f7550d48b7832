"""A Ray cluster on this machine whose worker nodes do not share the head's disk, for tests.

``ray.cluster_utils.Cluster`` puts every node on one file system, so a job that wrote a local path on
one node and read it on another passed there and failed on a real cluster. Here the head starts with
``ray start --head`` in the test's own mount namespace; each worker node starts in a mount namespace
of its own (``unshare --mount --propagation private``, which needs root, as CI has) with a private
tmpfs mounted over ``data``: a file the head (or the test) writes under ``data`` is invisible to
every worker, as a folder on the head's local disk is on a real cluster.

Every node has explicit free ports on 127.0.0.1 and its own ``--temp-dir`` (so nothing is written
to /tmp/ray, whose ``ray_current_cluster`` would make another test's ``ray.init()`` join this
cluster), starts in a session of its own, and is stopped by killing that session's processes
(``sessions.kill_session``), never by ``ray stop``, which stops every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sessions import kill_session

from gristmill.pipeline.service.shards import HEAD_RESOURCE

RAY = [sys.executable, "-m", "ray.scripts.scripts"]
# `ray start` for a worker node with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (tests/conftest.py: it keeps
# every Ray address on loopback) refuses to join a head; this lets it join and keeps its addresses on
# 127.0.0.1 (Ray would otherwise put a worker node on the machine's network address).
JOIN = [sys.executable, "-c", "import sys; import ray._private.ray_constants as constants; "
        "import ray._private.services as services; constants.ENABLE_RAY_CLUSTER = True; "
        "services.resolve_ip_for_localhost = lambda host: host; from ray.scripts.scripts import main; "
        "sys.argv[0] = 'ray'; main()"]
ADDRESS_FILE = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
NODE_FIELDS = ("NodeID", "Alive", "NodeManagerPort", "DeathReasonMessage")  # of ray.nodes(), for _nodes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class PrivateNodes:
    """A running cluster: ``address`` for ``--ray-address``; ``data`` is private to the head (and the
    test); ``env`` is what the nodes run with (a job's driver should use it too)."""

    address: str
    data: Path
    env: dict[str, str]
    sessions: list[int] = field(default_factory=list)
    # each worker node's session (kill_session ends the node) -> its raylet's port (ray.nodes()'s NodeManagerPort)
    workers: dict[int, int] = field(default_factory=dict)


def _node_ports() -> list[str]:
    """Every port a node would otherwise take at a fixed default (two nodes on one machine collide)."""
    return [f"--node-manager-port={free_port()}", f"--object-manager-port={free_port()}",
            f"--metrics-export-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}"]


def _start(command: list[str], env: Mapping[str, str], sessions: list[int], attempts: int = 3) -> None:
    """Run a ``ray start`` (it returns once its daemons run) in a new session whose id goes to
    ``sessions`` (for the clean-up, even when the start fails). One at a time: a node's raylet has 30 s
    to register, which two starting at once on two busy cores missed, and which one alone missed at a
    load average of 25: then its processes are killed and it starts again, ``attempts`` times in all."""
    for attempt in range(attempts):
        process = subprocess.Popen(command, env=dict(env), start_new_session=True, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        sessions.append(process.pid)
        output, _ = process.communicate(timeout=240)
        if process.returncode == 0:
            return
        if "timed out during startup" not in output or attempt == attempts - 1:
            raise RuntimeError(f"{' '.join(command[:6])}... failed ({process.returncode}):\n{output[-3000:]}")
        kill_session(sessions.pop())


def _nodes(address: str, env: Mapping[str, str]) -> tuple[list[dict], str]:
    """Every node the cluster's GCS knows, dead ones too (Ray's fields in ``NODE_FIELDS`` and whether it
    is the head), asked by a driver of its own; or no nodes and why."""
    probe = ("import json, ray, sys\n"
             "ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n"
             f"print(json.dumps([{{k: n.get(k) for k in {NODE_FIELDS!r}}} | {{'head': {HEAD_RESOURCE!r} in n['Resources']}}"
             " for n in ray.nodes()]))")
    result = subprocess.run([sys.executable, "-c", probe, address], env=dict(env), capture_output=True, text=True,
                            timeout=120)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1]), ""
    except (IndexError, ValueError):
        return [], result.stderr[-2000:]


def _wait_for_nodes(address: str, count: int, env: Mapping[str, str]) -> None:
    """Until the cluster has ``count`` alive nodes (a worker registers shortly after its start returns)."""
    deadline = time.monotonic() + 120
    while True:
        nodes, error = _nodes(address, env)
        alive = sum(node["Alive"] for node in nodes)
        if alive >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{alive} of {count} nodes came up: {error}")
        time.sleep(1)


def describe_nodes(cluster: PrivateNodes) -> str:
    """Every node the cluster's GCS knows (dead ones too, with Ray's reason), which of this cluster's
    sessions each is, and the load: what a failed placement assertion needs to say which node was which."""
    nodes, error = _nodes(cluster.address, cluster.env)
    if not nodes:
        return f"ray.nodes() failed: {error}"
    sessions = {port: session for session, port in cluster.workers.items()}
    for node in nodes:
        node["session"] = sessions.get(node["NodeManagerPort"], "head" if node["head"] else None)
    return f"load {os.getloadavg()}; nodes {nodes}"


@contextlib.contextmanager
def private_nodes(env: Mapping[str, str] | None = None, workers: int = 2) -> Iterator[PrivateNodes]:
    """A head and ``workers`` worker nodes (one CPU each), the workers on private disks; always stopped."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        raise RuntimeError("private nodes need root and unshare(1) (CI runs as root)")
    root = Path(tempfile.mkdtemp(prefix="gm-pn-", dir="/tmp"))  # short: Unix socket paths cap near 108 bytes
    data = root / "data"
    data.mkdir()
    # recent Ray guards a cluster started by `ray start` with a bearer token: nodes and drivers share one
    node_env = {**os.environ, **(env or {}), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                "RAY_AUTH_TOKEN": secrets.token_hex(32),
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    node_env.pop("RAY_ADDRESS", None)
    port = free_port()
    cluster = PrivateNodes(f"127.0.0.1:{port}", data, node_env)
    common = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats"]
    try:
        _start([*RAY, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--include-dashboard=false",
                f"--ray-client-server-port={free_port()}", f"--temp-dir={root / 'head'}", *common, *_node_ports()],
               node_env, cluster.sessions)
        # the tmpfs hides data/ from each worker node; its daemons keep the namespace alive after start
        script = 'mount -t tmpfs -o size=16m gm-private "$0" && exec "$@"'
        for index in range(workers):
            ports = _node_ports()
            _start(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(data),
                    *JOIN, "start", f"--address={cluster.address}", "--node-ip-address=127.0.0.1",
                    f"--temp-dir={root / f'w{index}'}", *common, *ports], node_env, cluster.sessions)
            cluster.workers[cluster.sessions[-1]] = int(ports[0].split("=")[1])
        _wait_for_nodes(cluster.address, 1 + workers, node_env)
        yield cluster
    finally:
        for session in reversed(cluster.sessions):
            kill_session(session)
        shutil.rmtree(root, ignore_errors=True)
        # never leave another test's ray.init() this cluster to join (other Rays on the machine may
        # write the file too: only this cluster's address is ours to find there)
        if _address_file() == cluster.address:
            ADDRESS_FILE.unlink()
            raise AssertionError(f"the private cluster wrote its address in {ADDRESS_FILE}")


def _address_file() -> str | None:
    try:
        return ADDRESS_FILE.read_text().strip()
    except OSError:
        return None
