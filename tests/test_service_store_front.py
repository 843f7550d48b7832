"""``gristmill serve --shards 2 --state-dir s3://...`` (moto on loopback), each front a process of its
own with its own working and temporary folder: a front of an older generation left running while
its shards were taken over (a node back from a partition) acknowledges nothing; a front started
afterwards elsewhere finds every shard's generation and placement in the store and serves every
acknowledged add; each shard's log on the store stays one line (issue #29)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import s3fs
from test_service import text

from gristmill.pipeline.cli import main
from gristmill.pipeline.format.signature_index import load_index, params_for
from gristmill.pipeline.service.client import DedupClient, ServiceError
from gristmill.pipeline.service.durable import decode_segment, read_placements

ADDED = 16
PARAMS = params_for(0.8, 128, 5)  # what serve uses without --index


@dataclass
class Front:
    proc: subprocess.Popen
    url: str
    started: dict[str, Any]  # the start-up summary (--json)
    home: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)


@pytest.fixture()
def start_front(s3_server: dict) -> Iterator[Callable[[str, str], Front]]:
    """Start ``gristmill serve --shards 2`` on a state URL and a Ray address in a fresh folder of its
    own (its working folder and ``TMPDIR``)."""
    fronts: list[Front] = []

    def start(state: str, ray_address: str) -> Front:
        home = Path(tempfile.mkdtemp(prefix="gm-front-"))
        (home / "tmp").mkdir()
        with open(home / "stderr.txt", "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gristmill.pipeline.cli", "serve", "--port", "0", "--shards", "2",
                 "--state-dir", state, "--ray-address", ray_address, "--json"],
                cwd=home, env={**os.environ, "TMPDIR": str(home / "tmp")}, stdout=subprocess.PIPE, stderr=stderr,
                text=True)
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:
            lines.append(json.loads(line))
            if "listening" in lines[-1]:
                front = Front(proc, lines[-1]["listening"], lines[0], home)
                fronts.append(front)
                return front
        proc.wait(timeout=60)
        raise AssertionError(f"serve exited {proc.returncode}: {(home / 'stderr.txt').read_text()[-3000:]}")

    try:
        yield start
    finally:
        for front in fronts:
            front.stop()
            shutil.rmtree(front.home, ignore_errors=True)


def logs(state: str) -> dict[int, list[dict[str, Any]]]:
    """Each shard's log segments on the store, in order: head and document ids."""
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    found = {}
    for k in range(2):
        paths = sorted(fs.ls(f"{state}/shard-{k}/log", detail=False))
        found[k] = []
        for path in paths:
            head, records = decode_segment(fs.cat_file(path), path, PARAMS)
            found[k].append({**head, "ids": [r.doc_id for r in records], "name": os.path.basename(path)})
    return found


def test_fronts_find_the_state_in_the_store_and_an_older_one_acknowledges_nothing(
        s3_bucket: str, tmp_path: Path, ray_local: None, start_front: Callable[[str, str], Front]) -> None:
    import ray

    from gristmill.pipeline.format.signature_index import params_to_dict
    from gristmill.pipeline.service.shards import Shard

    address = ray.get_runtime_context().gcs_address
    state = f"{s3_bucket}/state"
    docs = [(f"d-{n}", text(80_000 + n)) for n in range(ADDED)]
    first = start_front(state, address)
    assert all(r.added for r in DedupClient(first.url, batch_size=4).add(docs))
    before = read_placements(state, 2)
    assert DedupClient(first.url).stats()["placement"] == before == first.started["placement"]
    assert [p["generation"] for p in before] == [1, 1]

    # both shards start again as generation 2 while the first front's are still up (cut off, then back)
    takers = [ray.remote(Shard).options(num_cpus=0).remote(None, params_to_dict(PARAMS), None, (k, 2), 10**6,
                                                           f"{state}/shard-{k}") for k in range(2)]
    ray.get([t.params.remote() for t in takers])
    assert [p["generation"] for p in read_placements(state, 2)] == [2, 2]
    late = [(f"late-{n}", text(82_000 + n)) for n in range(4)]
    for doc in [*late, late[0], late]:  # each alone (both shards), one again, all together
        with pytest.raises(ServiceError) as refused:
            DedupClient(first.url).add(doc if isinstance(doc, list) else [doc])
        assert refused.value.status == 503 and "newer generation" in refused.value.reason, refused.value
    first.stop()
    for taker in takers:
        ray.kill(taker)
    shutil.rmtree(first.home)  # nothing of the first front's folders is left for the next

    # a front started afterwards, elsewhere (another process, other folders)
    second = start_front(state, address)
    assert [r.exact_duplicate_of for r in DedupClient(second.url).check(docs)] == [i for i, _ in docs]
    assert all(r.new for r in DedupClient(second.url).check(late))  # nothing of the first's late adds
    now = read_placements(state, 2)
    assert DedupClient(second.url).stats()["placement"] == now == second.started["placement"]
    assert [p["generation"] for p in now] == [3, 3]
    assert all(p["pid"] != q["pid"] for p, q in zip(now, before, strict=True))
    assert DedupClient(second.url).add([("after", text(82_999))])[0].added
    second.stop()

    ids = []
    for segments in logs(state).values():  # one line per shard: numbers without gaps, generations in order
        assert [s["seq"] for s in segments] == list(range(1, len(segments) + 1))
        assert [s["name"] for s in segments] == [f"{s['seq']:016d}.seg" for s in segments]
        generations = [s["generation"] for s in segments]
        assert generations == sorted(generations) and set(generations) == {1, 2, 3}
        ids += [i for s in segments for i in s["ids"]]
    assert sorted(ids) == sorted([i for i, _ in docs] + ["after"])

    # the state is exported straight from the store, with no front or shard running
    assert main(["serve", "--state-dir", state, "--shards", "2", "--export", str(tmp_path / "out")]) == 0
    _, table = load_index(str(tmp_path / "out"))
    assert sorted(table.ids) == sorted(ids)
