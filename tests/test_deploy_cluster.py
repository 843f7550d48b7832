"""The dedup job on a real Ray head through the Jobs API, and against an S3-protocol server."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import s3fs

from gristmill.loaders import StreamingLoader
from gristmill.pipeline.format import Corpus

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LICENCES = sorted(Path("/usr/share/doc").glob("*/copyright"))[:120]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def licence_jsonl() -> tuple[str, int]:
    """Real near-duplicate text: Debian licence files, each twice (one exact copy per file)."""
    lines = []
    for index, path in enumerate(LICENCES):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines.append(json.dumps({"id": f"a{index}", "text": text}))
        lines.append(json.dumps({"id": f"b{index}", "text": text}))
    return "\n".join(lines) + "\n", len(lines)


def kept_ids(corpus: Corpus) -> set[str]:
    return set(corpus.to_table(["id"]).column("id").to_pylist())


def assert_accounted(corpus: Corpus, documents: int) -> None:
    """Every input document is in the run's statistics, and the kept ones are the corpus rows."""
    counts = corpus.stats["documents"]
    assert counts["input"] == documents
    assert counts["kept"] + counts["exact_duplicate"] + counts["near_duplicate"] + counts["rejected"] == documents
    # Every b-copy is an exact duplicate of its a-twin, so at most one of each pair survives.
    assert counts["exact_duplicate"] >= documents // 2
    assert counts["kept"] == corpus.num_rows == len(kept_ids(corpus))


@pytest.mark.timeout(420)
def test_dedup_submitted_through_the_ray_jobs_api(tmp_path: Path) -> None:
    payload, documents = licence_jsonl()
    (tmp_path / "input.jsonl").write_text(payload)
    output = tmp_path / "corpus"
    dashboard = free_port()
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Recent Ray guards the Jobs API with a bearer token: head and client share one, as on a cluster.
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
    }
    env.pop("RAY_ADDRESS", None)
    # A short private temp dir (Unix socket paths are capped near 108 bytes) that names every process
    # of this head, so the test stops exactly its own cluster and no other Ray on the machine.
    temp_dir = tempfile.mkdtemp(prefix="gm-ray-", dir="/tmp")
    start = [
        str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={free_port()}",
        "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}", f"--metrics-export-port={free_port()}",
        "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={temp_dir}",
    ]
    submit = [str(BIN / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{dashboard}", "--",
              "gristmill", "dedup", str(tmp_path / "input.jsonl"), "-o", str(output)]
    subprocess.run(start, check=True, env=env, capture_output=True, text=True, timeout=180)
    try:
        deadline = time.monotonic() + 300
        while True:  # the head's job agent comes up a few seconds after `ray start` returns
            job = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=300)
            if "No available agent" not in job.stdout + job.stderr or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "succeeded" in job.stdout
    finally:
        subprocess.run(["pkill", "-9", "-f", temp_dir], capture_output=True)
        shutil.rmtree(temp_dir, ignore_errors=True)

    corpus = Corpus.open(str(output))
    assert_accounted(corpus, documents)
    assert all(r.ok for r in corpus.verify())


@pytest.mark.timeout(300)
def test_dedup_reads_and_writes_s3_and_the_loader_streams_it_back(s3_bucket: str, s3_server: dict) -> None:
    payload, documents = licence_jsonl()
    fs = s3fs.S3FileSystem(**s3_server["storage_options"])
    fs.pipe_file(f"{s3_bucket}/raw/input.jsonl", payload.encode())
    output = f"{s3_bucket}/corpus"
    # Credentials and the endpoint come from the environment only (the fixture sets AWS_*).
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    result = subprocess.run(
        [str(BIN / "gristmill"), "dedup", f"{s3_bucket}/raw/input.jsonl", "-o", output],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert fs.exists(f"{output}/_manifest.json")

    options = s3_server["storage_options"]
    corpus = Corpus.open(output, storage_options=options)
    assert_accounted(corpus, documents)
    loader = StreamingLoader(output, batch_size=16, shuffle=True, seed=3, storage_options=options,
                             columns=["id", "text"])
    streamed = [doc_id for batch in loader for doc_id in batch["id"]]
    assert sorted(streamed) == sorted(kept_ids(corpus))
    # Blocks came as ranged reads: the loader fetched about the row groups' bytes, not more files.
    total_blocks = sum(len(s.row_groups) for s in corpus.shards)
    assert loader.counters.blocks_fetched == total_blocks
    assert loader.counters.bytes_read <= corpus.manifest.num_bytes
