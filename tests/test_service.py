"""The dedup service end to end: a real ``gristmill serve`` subprocess on 127.0.0.1, driven over HTTP.

Covers check/add semantics, concurrent near-identical inserts, SIGKILL and restart, bad requests,
the token rule, and the round trip with the batch job's signature index.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gristmill.pipeline.cli import main
from gristmill.pipeline.format.signature_index import IndexParams, SignatureTable, load_index, write_index
from gristmill.pipeline.service.client import AsyncDedupClient, DedupClient, ServiceError
from gristmill.pipeline.service.core import DedupService
from gristmill.pipeline.service.insert_log import LogError

REPO = Path(__file__).resolve().parents[1]
WORDS = [f"w{i}" for i in range(5000)]


def text(seed: int, words: int = 200) -> str:
    """A deterministic document of ``words`` random words; different seeds share almost nothing."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


def variant(base: str, k: int) -> str:
    """``base`` with its k-th word (from the end) replaced: a near duplicate, Jaccard about 0.95."""
    words = base.split()
    words[-1 - k] = f"changed{k}"
    return " ".join(words)


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    stderr_path: Path

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)


def start_server(state: Path, *args: str, env: dict[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None) -> Server:
    """Start ``gristmill serve --port 0`` and wait for the line naming the bound address."""
    stderr_path = state.parent / f"{state.name}-stderr.txt"
    with open(stderr_path, "ab") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gristmill.pipeline.cli", "serve", "--port", "0", "--state", str(state), *args],
            cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True,
            env={**os.environ, **(env or {})}, preexec_fn=preexec_fn,
        )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on " in line:
            url = line.split("listening on ", 1)[1].strip()
            assert url.startswith("http://127.0.0.1:"), url
            return Server(proc, url, stderr_path)
    proc.wait(timeout=20)
    raise AssertionError(f"server exited {proc.returncode}: {stderr_path.read_text()}")


# -- one shared server for the request-level tests ----------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    state = tmp_path_factory.mktemp("service") / "state"
    srv = start_server(state, "--max-batch", "16", "--max-body-mb", "0.25")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def client(server: Server) -> DedupClient:
    return DedupClient(server.url)


def post_raw(url: str, body: bytes, headers: dict[str, str] | None = None, method: str = "POST") -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body if method == "POST" else None, method=method,
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_check_and_add_semantics(client: DedupClient) -> None:
    base = text(1)
    [first] = client.add([("doc-1", base)])
    assert (first.new, first.added, first.id) == (True, True, "doc-1")

    exact, near, other = client.check([base.upper() + " !", variant(base, 3), text(2)])
    assert exact.exact_duplicate_of == "doc-1" and not exact.new and not exact.added
    assert not near.new and near.exact_duplicate_of is None
    assert [n.id for n in near.near_duplicates] == ["doc-1"] and 0.8 <= near.near_duplicates[0].similarity < 1.0
    assert other.new and not other.added and other.near_duplicates == ()

    # a check does not insert: the same unseen text is still new, and gets its content hash as id
    [again] = client.check([text(2)])
    assert again.new and again.id == other.content_hash

    # in one add batch, each document is checked against the ones before it
    a, b, c = client.add([("b-1", text(3)), ("b-2", variant(text(3), 5)), ("b-3", text(3))])
    assert a.added and not b.added and not c.added
    assert [n.id for n in b.near_duplicates] == ["b-1"] and c.exact_duplicate_of == "b-1"

    stats = client.stats()
    assert stats["documents"] == 2 and stats["added"] == 2 and stats["params"]["threshold"] == 0.8


def test_single_document_body_and_add_flag(server: Server) -> None:
    status, body = post_raw(f"{server.url}/check", json.dumps({"id": "single", "text": text(4), "add": True}).encode())
    assert status == 200 and body["results"][0]["added"] is True
    status, body = post_raw(f"{server.url}/check", json.dumps({"text": text(4)}).encode())
    assert status == 200 and body["results"][0]["exact_duplicate_of"] == "single"


def test_concurrent_near_identical_adds_yield_exactly_one_new(server: Server) -> None:
    base = text(10)
    docs = [(f"race-{k}", variant(base, k)) for k in range(40)]

    async def race() -> list:
        async with AsyncDedupClient(server.url) as c:
            return await asyncio.gather(*(c.add([d]) for d in docs))

    results = [r for [r] in asyncio.run(race())]
    winners = [r for r in results if r.new]
    assert len(winners) == 1 and winners[0].added
    for r in results:
        if r is not winners[0]:
            assert not r.added and winners[0].id in {n.id for n in r.near_duplicates}


BAD_BODIES = [
    (b"{", "not valid JSON"),
    (b"\xff\xfe", "body is not UTF-8: byte 0"),
    (b"[1, 2]", "must be a JSON object"),
    (b'{"id": "x"}', "body.text is missing"),
    (b'{"text": 5}', "body.text must be a string"),
    (b'{"text": "a", "id": 7}', "body.id must be a non-empty string"),
    (b'{"text": "a", "id": ""}', "body.id must be a non-empty string"),
    (b'{"text": "a", "colour": "red"}', "unknown keys ['colour']"),
    (b'{"documents": "a"}', '"documents" must be a list'),
    (b'{"documents": []}', '"documents" is empty'),
    (b'{"documents": [5]}', "documents[0] must be an object"),
    (b'{"documents": [{"text": "a"}], "extra": 1}', "no other keys"),
    (b'{"text": "a", "add": "yes"}', '"add" must be true or false'),
    (b'{"text": "\\ud800"}', "not valid Unicode"),
    (b'{"text": "a text never seen", "id": "\\udc00", "add": true}', "body.id is not valid Unicode"),
]


@pytest.mark.parametrize(("body", "reason"), BAD_BODIES)
def test_bad_requests_answer_400_with_a_reason(server: Server, body: bytes, reason: str) -> None:
    status, answer = post_raw(f"{server.url}/check", body)
    assert status == 400 and reason in answer["error"]


def test_limits_and_unknown_routes(server: Server) -> None:
    too_many = json.dumps({"documents": [{"text": "x"}] * 17}).encode()
    status, answer = post_raw(f"{server.url}/check", too_many)
    assert status == 413 and "exceeds the limit of 16" in answer["error"]
    status, answer = post_raw(f"{server.url}/add", json.dumps({"text": "y" * 300_000}).encode())
    assert status == 413 and "error" in answer
    status, answer = post_raw(f"{server.url}/add", json.dumps({"text": "a", "add": False}).encode())
    assert status == 400 and "unknown keys ['add']" in answer["error"]
    assert post_raw(f"{server.url}/nope", b"{}")[0] == 404
    assert post_raw(f"{server.url}/check", b"", method="GET")[0] == 405
    # none of it hurt the service
    assert DedupClient(server.url).healthz()["ok"] is True
    assert server.proc.poll() is None
    with pytest.raises(ServiceError, match="400"):
        DedupClient(server.url).check([{"text": 5}])  # type: ignore[list-item]


# -- the token rule -----------------------------------------------------------------------------
def test_refuses_non_loopback_without_a_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv("GRISTMILL_SERVICE_TOKEN", raising=False)
    assert main(["serve", "--state", str(tmp_path / "state"), "--host", "0.0.0.0"]) == 2
    assert "refusing to bind 0.0.0.0 without a bearer token" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()  # refused before touching anything


def test_token_is_required_when_set(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    srv = start_server(tmp_path / "state", "--token-file", str(token_file))
    try:
        body = json.dumps({"text": "hello"}).encode()
        assert post_raw(f"{srv.url}/check", body)[0] == 401
        assert post_raw(f"{srv.url}/check", body, {"Authorization": "Bearer wrong"})[0] == 401
        assert post_raw(f"{srv.url}/stats", b"", method="GET")[0] == 401
        assert post_raw(f"{srv.url}/healthz", b"", method="GET")[0] == 200
        assert DedupClient(srv.url, token="s3cret-token").check(["hello"])[0].new
        with pytest.raises(ServiceError, match="401"):
            DedupClient(srv.url, token="wrong").stats()
    finally:
        srv.stop()


# -- durability ---------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_every_acknowledged_insert_survives_sigkill(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    state = tmp_path / "state"
    srv = start_server(state)
    acked: dict[str, str] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def writer(worker: int) -> None:
        client = DedupClient(srv.url, timeout=10)
        n = 0
        while not stop.is_set():
            doc_id, body = f"w{worker}-{n}", text(100_000 + worker * 10_000 + n)
            try:
                [result] = client.add([(doc_id, body)])
            except ServiceError:
                return  # the server died under us: this insert was never acknowledged
            assert result.added
            with lock:
                acked[doc_id] = body
            n += 1

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    while len(acked) < 60:
        assert srv.proc.poll() is None
        threading.Event().wait(0.05)
    # the live server holds the log: an export (or a second server) is refused, not let in to cut it
    assert main(["serve", "--state", str(state), "--export", str(tmp_path / "export")]) == 2
    assert "in use by another gristmill serve" in capsys.readouterr().err
    srv.stop(signal.SIGKILL)  # while the writers still have requests in flight
    stop.set()
    for t in threads:
        t.join(timeout=30)
    # a torn record at the end, as a crash in the middle of a write leaves it
    with open(state / "inserts.log", "ab") as log:
        log.write(b"\x99\x00\x00\x00torn")

    srv = start_server(state)
    try:
        client = DedupClient(srv.url)
        ids = list(acked)
        results = client.check([acked[i] for i in ids])
        assert [r.exact_duplicate_of for r in results] == ids
        assert client.stats()["replayed_at_start"] >= len(ids)
    finally:
        srv.stop()
    assert "cutting 8 bytes" in srv.stderr_path.read_text()


def params() -> IndexParams:
    return IndexParams(num_perm=64, ngram=3, bands=8, rows=8, seed=7, threshold=0.7)


def test_log_written_with_other_parameters_is_refused(tmp_path: Path) -> None:
    DedupService(str(tmp_path), params()).close()
    other = IndexParams(num_perm=64, ngram=3, bands=8, rows=8, seed=8, threshold=0.7)
    with pytest.raises(LogError, match="inserts.log: written for index parameters"):
        DedupService(str(tmp_path), other)


# -- the batch job's index ----------------------------------------------------------------------
def test_serves_an_index_and_exports_one_that_loads_back(tmp_path: Path) -> None:
    p = params()
    hasher = p.hasher()
    from gristmill.dedup.lsh import band_hashes
    from gristmill.dedup.normalize import content_hashes

    texts = [text(200 + i) for i in range(5)]
    sigs = hasher.signatures(texts)
    base = SignatureTable(ids=[f"base-{i}" for i in range(5)], content_hashes=content_hashes(texts),
                          lengths=np.array([len(t) for t in texts]), signatures=sigs,
                          bands=band_hashes(sigs, p.bands, p.rows))
    write_index(str(tmp_path / "corpus"), p, base)

    srv = start_server(tmp_path / "state", "--index", str(tmp_path / "corpus"))
    try:
        client = DedupClient(srv.url)
        found, near, fresh = client.add([texts[2], variant(texts[4], 1), ("new-1", text(300))])
        assert found.exact_duplicate_of == "base-2" and near.near_duplicates[0].id == "base-4"
        assert fresh.added and client.stats()["base_documents"] == 5
    finally:
        srv.stop()

    assert main(["serve", "--state", str(tmp_path / "state"), "--index", str(tmp_path / "corpus"),
                 "--export", str(tmp_path / "out")]) == 0
    loaded_params, table = load_index(str(tmp_path / "out"))
    assert loaded_params == p
    row = {doc_id: i for i, doc_id in enumerate(table.ids)}  # the export is sorted by content hash
    assert sorted(row) == sorted([f"base-{i}" for i in range(5)] + ["new-1"])
    assert np.array_equal(table.signatures[[row[f"base-{i}"] for i in range(5)]], sigs)
    assert table.lengths[row["new-1"]] == len(text(300))
    assert np.array_equal(table.signatures[row["new-1"]], hasher.signatures([text(300)])[0])

    # the batch job's own --against code accepts the export (checks the parameters, reads the files)
    from gristmill.pipeline.job.config import DedupConfig, index_params
    from gristmill.pipeline.job.plan import against_index_files
    from gristmill.pipeline.job.read import read_index_file

    config = DedupConfig(inputs=[], output=str(tmp_path / "next"), against=str(tmp_path / "out"), num_perm=64,
                         ngram=3, bands=8, rows=8, seed=7, threshold=0.7)
    job = SimpleNamespace(config=config, params=index_params(config))
    [index_file] = against_index_files(config, job.params)
    assert read_index_file(job, index_file.url)["id"].to_pylist() == table.ids and index_file.bands_url


def test_export_replaces_only_an_earlier_export(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Exporting again replaces the earlier export (its index file is retired after the commit); a folder
    holding a corpus or someone's files is refused before the index is even loaded."""
    import pyarrow as pa

    from gristmill.pipeline.format import CORPUS_SCHEMA, Corpus, ShardWriter

    state, out = str(tmp_path / "state"), tmp_path / "out"
    for _ in range(2):
        assert main(["serve", "--state", state, "--export", str(out)]) == 0
    # the earlier export's index and band file are retired, kept for its readers until gc removes them
    assert len(list((out / "_index").iterdir())) == 4
    assert main(["gc", str(out), "--now"]) == 0
    assert len(list((out / "_index").iterdir())) == 2  # one index file and its band file
    corpus = tmp_path / "corpus"
    writer = ShardWriter(str(corpus), CORPUS_SCHEMA)
    writer.write(pa.Table.from_pylist([{"id": "a", "text": "kept"}], schema=CORPUS_SCHEMA))
    writer.commit()
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "notes.txt").write_text("mine")
    for target, reason in ((corpus, "not a service export"), (tmp_path / "home", "holds no gristmill corpus")):
        capsys.readouterr()
        assert main(["serve", "--state", state, "--export", str(target)]) == 2
        assert reason in capsys.readouterr().err
    assert Corpus.open(str(corpus)).num_rows == 1 and (tmp_path / "home" / "notes.txt").read_text() == "mine"


def test_export_takes_the_output_lease(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An export is a writer of its output folder like gristmill dedup: refused while another job holds
    the folder's lease (pipeline/format/lease.py), which it leaves as it found it."""
    from gristmill.pipeline.format.lease import LEASE_NAME, Lease

    state, out = str(tmp_path / "state"), tmp_path / "out"
    assert main(["serve", "--state", state, "--export", str(out)]) == 0
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    other = Lease(str(out), "a gristmill dedup job")
    other.acquire()
    try:
        capsys.readouterr()
        assert main(["serve", "--state", state, "--export", str(out)]) == 2
        assert "being written by another job" in capsys.readouterr().err
        assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == sorted([*before, LEASE_NAME])  # nothing written
    finally:
        other.release()
    assert main(["serve", "--state", state, "--export", str(out)]) == 0  # given back: the next export runs
    assert not (out / LEASE_NAME).exists()
