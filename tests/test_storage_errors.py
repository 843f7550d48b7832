"""A failing store is one line naming the object and the operation, exit 2, never a Ray traceback or a
bare ``[Errno 16]`` (issue 27): `gristmill` commands in a subprocess against moto's S3 behind the
fault-injecting proxy (benchmarks/shaped_store.py), on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from shaped_store import ShapedStore  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(300)


@pytest.fixture()
def store(s3_server: dict) -> Iterator[ShapedStore]:
    with ShapedStore(s3_server["endpoint_url"]) as shaped:
        yield shaped


def _gristmill(store: ShapedStore, *args: str) -> subprocess.CompletedProcess:
    """The command in a subprocess whose S3 is the proxy, with botocore's retries off (s3fs still
    retries a few times itself, with backoff) so a persistent fault ends the command soon."""
    env = dict(os.environ, AWS_ENDPOINT_URL=store.endpoint, AWS_MAX_ATTEMPTS="1", AWS_RETRY_MODE="standard")
    return subprocess.run([sys.executable, "-m", "gristmill.pipeline.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=280)


def _one_line(result: subprocess.CompletedProcess, command: str) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"gristmill {command}: cannot "), result.stderr
    assert "Errno" not in lines[0] and "Traceback" not in result.stderr
    return lines[0]


def _inputs(tmp_path: Path) -> str:
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "text": f"document {i} with a few words in it"}) + "\n"
                            for i in range(30)))
    return str(path)


def test_a_failing_write_inside_a_ray_task_is_one_line_naming_the_object(
        store: ShapedStore, s3_bucket: str, tmp_path: Path) -> None:
    bucket = s3_bucket.removeprefix("s3://")
    store.fail(f"/{bucket}/out/_work/docs/*", None, 500)
    line = _one_line(_gristmill(store, "dedup", _inputs(tmp_path), "-o", f"{s3_bucket}/out", "-q"), "dedup")
    assert f"{s3_bucket}/out/_work/docs/" in line and "(PUT): Internal Server Error" in line


def test_a_failing_commit_is_one_line_naming_the_object(store: ShapedStore, s3_bucket: str, tmp_path: Path) -> None:
    bucket = s3_bucket.removeprefix("s3://")
    store.fail(f"/{bucket}/out/_blocks/*", None, 403)  # refused (a 503 is retried with backoff for minutes first)
    line = _one_line(_gristmill(store, "dedup", _inputs(tmp_path), "-o", f"{s3_bucket}/out", "-q"), "dedup")
    assert f"cannot write {s3_bucket}/out/_blocks (PUT): " in line


def test_a_failing_manifest_read_is_one_line_in_inspect_stats_and_gc(store: ShapedStore, s3_bucket: str) -> None:
    bucket = s3_bucket.removeprefix("s3://")
    store.fail(f"/{bucket}/c/_manifest.json", None, 503)
    for command in ("inspect", "stats", "gc"):
        line = _one_line(_gristmill(store, command, f"{s3_bucket}/c"), command)
        assert f"cannot read {s3_bucket}/c/_manifest.json (GET): " in line
