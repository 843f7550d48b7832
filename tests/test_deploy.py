"""deploy/: the manifests parse and agree with the code (entry point, image, ports, Ray version)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import yaml
from ray._private import ray_constants

from gristmill.pipeline.cli import COMMANDS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
IMAGE = f"ghcr.io/gristmill/gristmill:{PROJECT['version']}"
# `ray start --head` binds the Ray client server here unless told otherwise (ray/scripts/scripts.py);
# Ray exports no constant for it.
RAY_CLIENT_PORT = 10001


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def containers(cluster_spec: dict) -> list[dict]:
    groups = [cluster_spec["headGroupSpec"], *cluster_spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


def test_console_script_is_the_entry_point_the_manifests_call() -> None:
    assert PROJECT["scripts"]["gristmill"] == "gristmill.pipeline.cli:main"
    entry = shlex.split(load("kuberay-rayjob.yaml")["spec"]["entrypoint"])
    assert entry[:2] == ["gristmill", "dedup"] and entry[1] in COMMANDS
    sbatch = (DEPLOY / "slurm-gristmill.sbatch").read_text()
    assert re.search(r"ray job submit .*-- \\\n\s+gristmill dedup ", sbatch)


@pytest.mark.parametrize("name", ["kuberay-rayjob.yaml", "kuberay-raycluster.yaml"])
def test_kuberay_manifests_use_our_image_and_rays_ports(name: str) -> None:
    doc = load(name)
    assert doc["apiVersion"] == "ray.io/v1"
    spec = doc["spec"]["rayClusterSpec"] if doc["kind"] == "RayJob" else doc["spec"]
    assert spec["rayVersion"] == ray.__version__
    for container in containers(spec):
        assert container["image"] == IMAGE
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports["gcs"] == ray_constants.DEFAULT_PORT
    assert ports["dashboard"] == ray_constants.DEFAULT_DASHBOARD_PORT
    assert ports["client"] == RAY_CLIENT_PORT


def test_cluster_launcher_and_dockerfile_agree() -> None:
    launcher = load("ray-cluster-aws.yaml")
    assert launcher["docker"]["image"] == IMAGE
    assert launcher["head_node_type"] in launcher["available_node_types"]
    start = " ".join(launcher["head_start_ray_commands"])
    assert f"--port={ray_constants.DEFAULT_PORT}" in start
    assert f"--dashboard-port={ray_constants.DEFAULT_DASHBOARD_PORT}" in start
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert f"ARG RAY_VERSION={ray.__version__}" in dockerfile
    assert f"-t {IMAGE} ." in dockerfile
    for package in ("pipeline", "crawlers", "dedup", "loaders"):
        assert f"COPY --chown=ray:users {package} ./{package}" in dockerfile
    from gristmill.pipeline.job.driver import WORKER_ALLOCATOR_ENV

    assert "ENV " + " ".join(f"{k}={v}" for k, v in WORKER_ALLOCATOR_ENV.items()) in dockerfile
    exposed = re.search(r"^EXPOSE (.+)$", dockerfile, re.M)
    assert exposed is not None
    assert {int(p) for p in exposed.group(1).split()} == {
        ray_constants.DEFAULT_PORT, ray_constants.DEFAULT_DASHBOARD_PORT, RAY_CLIENT_PORT}


def test_slurm_script_is_valid_bash_with_rays_ports() -> None:
    path = DEPLOY / "slurm-gristmill.sbatch"
    subprocess.run(["bash", "-n", str(path)], check=True)
    text = path.read_text()
    assert f"RAY_PORT={ray_constants.DEFAULT_PORT}" in text
    assert f"DASHBOARD_PORT={ray_constants.DEFAULT_DASHBOARD_PORT}" in text
