"""The dedup service on a disk that fills up: a real tmpfs of a few MiB, ``gristmill serve`` in a
subprocess (a SIGBUS would kill it, not the test).

The promises: an add that does not fit is refused (507, naming the file) and nothing of it is
inserted; checks go on being answered; a compaction that does not fit changes nothing in the state
folder; every acknowledged document is back after a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from small_disk import fill, small_disk
from test_service import start_server, text

from gristmill.pipeline.format.signature_index import params_for
from gristmill.pipeline.service.client import DedupClient
from gristmill.pipeline.service.core import DedupService, Doc

GUARD_S = 60  # only so a dying server fails the test instead of hanging it; nothing is timed
ROWS_CAPACITY = 1024  # RowStore.GROW_ROWS: the first growth of the rows file


def add(url: str, first: int, count: int) -> tuple[int, dict]:
    """POST /add of documents ``first`` .. ``first + count - 1``: (status, answer)."""
    body = json.dumps({"documents": [{"id": f"doc-{i}", "text": text(i)} for i in range(first, first + count)]})
    req = urllib.request.Request(f"{url}/add", data=body.encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except ConnectionError as exc:  # the server died under the request
        return 0, {"error": str(exc)}


def warm_kernels(tmp_path: Path) -> None:
    """Compile (and cache) the hashing kernels off the small disk."""
    service = DedupService(str(tmp_path / "warm"), params_for(0.8, 128, 5))
    asyncio.run(service.handle([Doc("warm the kernels", None)], add=False))
    service.close()


@pytest.mark.timeout(600)
def test_a_full_disk_refuses_adds_and_keeps_serving(tmp_path: Path) -> None:
    warm_kernels(tmp_path)
    with small_disk(tmp_path / "state", "8m") as state:  # its stderr goes beside it, off the small disk
        server = start_server(state)
        try:
            for first in range(0, ROWS_CAPACITY, 128):  # the rows file's first growth, filled
                assert add(server.url, first, 128)[0] == 200
            acked = ROWS_CAPACITY
            fill(state, "filler", leave=16 * 1024)

            # rows beyond the file's end, more than the disk holds: on a sparse file written through
            # the mapping this was SIGBUS
            status, answer = add(server.url, acked, 32)
            if status == 0:
                server.proc.wait(GUARD_S)
            assert server.proc.poll() is None, f"the server died ({server.proc.returncode})"
            assert status == 507 and f"{state}/rows.u64: cannot grow" in answer["error"], answer
            client = DedupClient(server.url)
            assert client.stats()["documents"] == acked
            assert client.check([text(acked)])[0].new  # nothing of the refused batch went in

            while (answer := add(server.url, acked, 1))[0] == 200:  # one at a time, until the last block
                acked += 1
            assert answer[0] == 507 and "nothing of this request was inserted" in answer[1]["error"], answer
            assert acked > ROWS_CAPACITY  # single rows still fitted after the batch was refused
            assert server.proc.poll() is None
        finally:
            server.stop()
        assert server.proc.returncode == 0, server.stderr_path.read_text()

        fill(state, "filler-2")  # not a block left: the compaction at start cannot begin
        before = sorted(os.listdir(state))
        server = start_server(state)
        try:
            client = DedupClient(server.url)
            assert client.stats()["replayed_at_start"] == acked
            found = client.check([text(i) for i in range(acked)])
            assert [r.exact_duplicate_of for r in found] == [f"doc-{i}" for i in range(acked)]
        finally:
            server.stop()
        assert "cannot start a new insert log" in server.stderr_path.read_text()
        assert sorted(os.listdir(state)) == before  # the failed compaction renamed nothing

        os.remove(state / "filler")
        os.remove(state / "filler-2")
        server = start_server(state)  # room again: everything acknowledged is there, and adds work
        try:
            client = DedupClient(server.url)
            found = client.check([text(i) for i in range(acked)])
            assert [r.exact_duplicate_of for r in found] == [f"doc-{i}" for i in range(acked)]
            assert client.add([("late", text(acked + 1))])[0].added
        finally:
            server.stop()


def test_a_snapshot_that_does_not_fit_leaves_nothing_behind(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "4m") as disk:
        state = disk / "state"
        service = DedupService(str(state), params_for(0.8, 128, 5))
        try:
            asyncio.run(service.handle([Doc(text(i), f"doc-{i}") for i in range(200)], add=True))
            fill(disk, "filler", leave=4096)  # the next log's header fits, the snapshot does not
            with pytest.raises(OSError):
                asyncio.run(service.compact())
            assert not [name for name in os.listdir(state) if name.endswith(".tmp")]
            assert service.log.path == str(state / "inserts.log")
        finally:
            service.close()
        os.remove(disk / "filler")
        service = DedupService(str(state), params_for(0.8, 128, 5))
        try:
            assert len(service.index) == 200
            (state / "inserts.log.next").write_bytes(b"GRIST")  # a next log torn by a crash
            asyncio.run(service.compact())  # room again: the compaction goes through
            assert "snapshot.2" in os.listdir(state)
        finally:
            service.close()


def test_a_full_disk_under_a_shard_is_a_one_line_507(tmp_path: Path) -> None:
    import ray

    context = ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
                       log_to_driver=False)
    try:
        with small_disk(tmp_path / "state", "8m") as state:
            server = start_server(state, "--shards", "2", "--ray-address", context.address_info["gcs_address"])
            try:
                assert add(server.url, 0, 32)[0] == 200
                fill(state, "filler")
                first = 32
                while (answer := add(server.url, first, 4))[0] == 200:
                    first += 4
                status, refused = answer
                assert status == 507, refused
                # the shard's NoSpace as the front's own: one line naming the file, no Ray traceback
                assert "/shard-" in refused["error"] and "\n" not in refused["error"], refused
                assert DedupClient(server.url).check([text(0)])[0].exact_duplicate_of == "doc-0"
            finally:
                server.stop()
    finally:
        ray.shutdown()
