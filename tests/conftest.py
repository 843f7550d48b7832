"""Fixtures shared by several test modules: a local Ray, a real S3-protocol server on loopback, and the
counting, fault-injecting proxy in front of it (benchmarks/shaped_store.py)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

# Ray replaces 127.0.0.1 with the machine's network address unless it believes it runs on a
# single-node platform; this switch keeps every Ray process the tests start (in-process clusters,
# `ray start`, subprocess jobs, which inherit the environment) on loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    """A private local Ray with two CPUs for one test module (started once, shut down after it)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict]:
    """moto's standalone S3 server on 127.0.0.1; yields fsspec storage options for s3fs."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    mp = pytest.MonkeyPatch()
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }.items():
        mp.setenv(key, value)
    try:
        yield {"endpoint_url": endpoint, "storage_options": {"client_kwargs": {"endpoint_url": endpoint}}}
    finally:
        mp.undo()
        server.stop()


@pytest.fixture()
def s3_bucket(s3_server: dict) -> str:
    """A fresh, empty bucket on the loopback S3 server; returns its s3:// URL."""
    import s3fs

    name = f"test-{uuid.uuid4().hex[:10]}"
    fs = s3fs.S3FileSystem(**s3_server["storage_options"])
    fs.mkdir(name)
    return f"s3://{name}"


@pytest.fixture(scope="module")
def store(s3_server: dict) -> Iterator[object]:
    """moto behind benchmarks/shaped_store.py for one test module: it counts (and logs) every request by
    kind and injects faults on demand; a test that shapes or fails it undoes that itself."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from shaped_store import ShapedStore

    with ShapedStore(s3_server["endpoint_url"], record=True) as shaped:
        yield shaped
