"""The dedup job on a cluster that is not one machine: worker nodes with private disks (tests/private_nodes.py)
and S3 behind a proxy that counts requests and answers 503 SlowDown on demand (benchmarks/shaped_store.py).

What a real cluster did and these tests pin down (issue 26): a throttled input object and an input
folder only the head node had each lost documents with exit 0; a local ``-o`` ran the read stage and
then died with a traceback. Now a throttle is retried, and what cannot work fails with exit 2 and one
line naming the path, before any work where it can be known before.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import s3fs

from gristmill.pipeline.format import Corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from private_nodes import PrivateNodes, private_nodes  # noqa: E402
from shaped_store import ShapedStore  # noqa: E402

pytestmark = pytest.mark.timeout(600)
GRISTMILL = str(Path(sys.executable).parent / "gristmill")
WORDS = [f"w{i}" for i in range(400)]


def documents(prefix: str, count: int, rng: random.Random) -> list[dict[str, str]]:
    """Documents with every third an exact copy and every fifth a near copy of an earlier one."""
    docs: list[dict[str, str]] = []
    for index in range(count):
        if index % 3 == 2:
            text = docs[index - 1]["text"]
        elif index % 5 == 4:
            words = docs[index - 2]["text"].split()
            words[len(words) // 2] = "changed"
            text = " ".join(words)
        else:
            text = " ".join(rng.choice(WORDS) for _ in range(60))
        docs.append({"id": f"{prefix}{index}", "text": text})
    return docs


@pytest.fixture(scope="module")
def bucket(store: ShapedStore) -> tuple[str, int, int]:
    """A bucket with three JSONL inputs under raw/, and the same files under ref/ (for a reference run that
    no fault of raw/ reaches); (its URL, the documents they hold, a split size that gives a.jsonl a split
    of its own, b.jsonl whole with the start of c.jsonl, and the rest of c)."""
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": store.endpoint}, skip_instance_cache=True)
    fs.mkdir("private-nodes")
    rng = random.Random(26)
    total, sizes = 0, []
    for name, count in (("a", 300), ("b", 100), ("c", 300)):
        docs = documents(name, count, rng)
        data = "".join(json.dumps(d) + "\n" for d in docs).encode()
        for folder in ("raw", "ref"):
            fs.pipe_file(f"private-nodes/{folder}/{name}.jsonl", data)
        total, sizes = total + len(docs), [*sizes, len(data)]
    return "s3://private-nodes", total, sizes[0] + 1024


@pytest.fixture(scope="module")
def cluster(store: ShapedStore) -> Iterator[PrivateNodes]:
    env = {"AWS_ENDPOINT_URL": store.endpoint}
    with private_nodes(env, workers=2) as nodes:
        yield nodes


@pytest.fixture()
def shaped(store: ShapedStore) -> Iterator[ShapedStore]:
    store.clear_faults()
    store.reset_stats()
    yield store
    store.clear_faults()


def start_dedup(cluster: PrivateNodes, *args: str, on_cluster: bool = True) -> subprocess.Popen:
    """``gristmill dedup`` as a user runs it, started: on the cluster (``--ray-address``) or on a private
    local Ray."""
    env = dict(cluster.env)
    command = [GRISTMILL, "dedup", *args, "--quiet", "--json"]
    if on_cluster:
        command += ["--ray-address", cluster.address]
    else:
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
            env.pop(name)
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    """A started ``gristmill dedup`` once it has exited, with what it printed."""
    stdout, stderr = process.communicate(timeout=400)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def dedup(cluster: PrivateNodes, *args: str, on_cluster: bool = True) -> subprocess.CompletedProcess:
    """``gristmill dedup`` run to its end (:func:`start_dedup`)."""
    return finish(start_dedup(cluster, *args, on_cluster=on_cluster))


def options(store: ShapedStore) -> dict:
    return {"client_kwargs": {"endpoint_url": store.endpoint}, "skip_instance_cache": True}


def kept_ids(url: str, store: ShapedStore) -> list[str]:
    return sorted(Corpus.open(url, options(store)).to_table(["id"]).column("id").to_pylist())


def the_error(result: subprocess.CompletedProcess) -> str:
    """The one line a refused job prints: exit 2, no traceback, one ``gristmill dedup:`` line."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("gristmill dedup:")]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_throttled_s3_job_on_private_nodes_keeps_the_ids_of_a_local_run(
        cluster: PrivateNodes, shaped: ShapedStore, bucket: tuple[str, int, int]) -> None:
    url, total, split_bytes = bucket
    cut = ["--split-bytes", str(split_bytes)]  # 3 splits (one per node), c.jsonl cut, b.jsonl whole
    # more 503s than the client's 6 attempts (faults.CLIENT_RETRIES): a read of b.jsonl has to try again
    shaped.fail("/private-nodes/raw/b.jsonl", 7)
    # the local run reads the same bytes under ref/, which the throttle does not reach, while the cluster
    # run waits out the client's backoff (the two one after the other took 44 s, 15 of them the local run)
    local = start_dedup(cluster, f"{url}/ref/", "-o", f"{url}/local", *cut, on_cluster=False)
    work = f"{url}/work-elsewhere"
    try:
        result = dedup(cluster, f"{url}/raw/", "-o", f"{url}/out", *cut, "--work-dir", work, "--keep-work")
    finally:
        local_result = finish(local)
    assert local_result.returncode == 0, local_result.stderr[-3000:]
    assert result.returncode == 0, result.stderr[-3000:]
    assert shaped.stats()["throttled"] == 7
    counts = json.loads(result.stdout)["documents"]
    assert counts["input"] == total and counts["rejected"] == 0
    assert counts["kept"] + counts["exact_duplicate"] + counts["near_duplicate"] == total
    assert kept_ids(f"{url}/out", shaped) == kept_ids(f"{url}/local", shaped)
    # the work folder was the one asked for, not OUTPUT/_work
    fs = s3fs.S3FileSystem(**options(shaped))
    assert fs.find(work.removeprefix("s3://")) and not fs.exists("private-nodes/out/_work")


def test_an_input_on_one_nodes_disk_is_refused_naming_it(
        cluster: PrivateNodes, shaped: ShapedStore, bucket: tuple[str, int, int]) -> None:
    url, _, _ = bucket
    folder = cluster.data / "head-only"
    folder.mkdir()
    docs = documents("h", 50, random.Random(1))
    (folder / "input.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    result = dedup(cluster, str(folder), "-o", f"{url}/out-head-only")
    line = the_error(result)
    assert f"input {folder / 'input.jsonl'} is a local path" in line and "does not see" in line
    assert not s3fs.S3FileSystem(**options(shaped)).exists("private-nodes/out-head-only")


def test_a_local_output_is_refused_before_any_work(
        cluster: PrivateNodes, shaped: ShapedStore, bucket: tuple[str, int, int]) -> None:
    url, _, _ = bucket
    output = cluster.data / "corpus"
    result = dedup(cluster, f"{url}/raw/a.jsonl", "-o", str(output))
    line = the_error(result)
    assert f"-o {output} is a local path" in line
    assert not output.exists()  # the check's marker and the folder it made are gone
    assert not [path for kind, path in shaped.log if kind == "GET" and path.startswith("/private-nodes/raw/")]


def test_an_input_that_stays_unreadable_fails_the_job_naming_it(
        cluster: PrivateNodes, shaped: ShapedStore, bucket: tuple[str, int, int], tmp_path: Path) -> None:
    url, _, _ = bucket
    shaped.fail("/private-nodes/raw/c.jsonl", None)  # every request, for as long as the job tries
    job = tmp_path / "job.toml"  # the client tries once a request: the job's own retries are what is left
    job.write_text("[storage_options.config_kwargs.retries]\nmode = \"standard\"\nmax_attempts = 1\n")
    result = dedup(cluster, f"{url}/raw/", "-o", f"{url}/out-unreadable", "--job", str(job))
    line = the_error(result)
    assert f"input {url}/raw/c.jsonl could not be read after 4 attempts" in line
    assert "SlowDown" in line or "Service Unavailable" in line
    assert not s3fs.S3FileSystem(**options(shaped)).exists("private-nodes/out-unreadable/manifest.json")
