"""Fixtures shared by several test modules: a local Ray, a real S3-protocol server on loopback, and the
counting, fault-injecting proxy in front of it (benchmarks/shaped_store.py)."""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Iterator

import pytest

# Ray replaces 127.0.0.1 with the machine's network address unless it believes it runs on a
# single-node platform; this switch keeps every Ray process the tests start (in-process clusters,
# `ray start`, subprocess jobs, which inherit the environment) on loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that share ``ray_local`` run first, one after another, so a pytest process starts that Ray
    once rather than once per module; then the rest, most tests first (pytest-xdist's own order, which
    ``make test`` turns off for this one). Every xdist worker sorts the same collection alike."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def rank(tests: list[pytest.Item]) -> tuple[bool, int]:
        return (not any(map(_asks_for_local_ray, tests)), -len(tests))

    items[:] = [test for tests in sorted(modules.values(), key=rank) for test in tests]


def _asks_for_local_ray(item: pytest.Item) -> bool:
    return "ray_local" in getattr(item, "fixturenames", ())


@pytest.fixture(scope="module", autouse=True)
def _no_local_ray_unless_asked(request: pytest.FixtureRequest) -> None:
    """The local Ray that ``ray_local`` leaves up is shut down before a module that does not ask for it:
    such a module starts its own Ray (clusters, private nodes) or runs the job without one."""
    if "ray" in sys.modules:  # no module has started a Ray if none has imported it
        import ray

        module = request.node
        asks = any(_asks_for_local_ray(item) for item in module.session.items
                   if getattr(item, "module", None) is module.obj)
        if ray.is_initialized() and not asks:
            ray.shutdown()


@pytest.fixture(scope="session")
def _local_ray_at_exit() -> Iterator[None]:
    yield
    if "ray" in sys.modules:
        import ray

        ray.shutdown()


@pytest.fixture(scope="module")
def ray_local(_local_ray_at_exit: None, s3_server: dict) -> Iterator[None]:
    """A private local Ray with two CPUs, shared by the modules of one pytest process that ask for it one
    after another: each start costs ~6 CPU-s (a dozen processes), 25 modules ask, and CI has 2 cores.
    Started after ``s3_server``: its workers keep the environment they start with, the S3 settings too."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield


@pytest.fixture(scope="session")
def s3_server() -> Iterator[dict]:
    """moto's standalone S3 server on 127.0.0.1; yields fsspec storage options for s3fs."""
    from moto.s3.responses import S3Response
    from moto.server import ThreadedMotoServer

    mp = pytest.MonkeyPatch()
    # S3 checks a conditional PUT's If-None-Match / If-Match and stores the object as one step; moto
    # checks, then stores, with no lock between, so two racing writers could both win (seen once in
    # the eight-writer lease race). One PUT at a time makes moto as atomic as S3.
    put_object, one_put = S3Response.put_object, threading.Lock()

    def atomic_put_object(self: S3Response) -> object:
        with one_put:
            return put_object(self)

    mp.setattr(S3Response, "put_object", atomic_put_object)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
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
