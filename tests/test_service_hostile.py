"""The dedup service against hostile clients: a real ``gristmill serve`` on 127.0.0.1 fed generated
bodies, malformed HTTP, half-sent requests and a full disk (a file-size limit); blank tokens refused
at start.

The promises: no body gives a 5xx; every refusal is JSON with a reason; a refused request changes
neither ``/stats`` nor the insert log; a document is in the index only together with its log record,
so a restart replays exactly what was acknowledged; a stalled client is cut off after the read
timeout; a large batch lets other requests run while it is hashed.
"""

from __future__ import annotations

import asyncio
import json
import resource
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_service import Server, start_server, text

from gristmill.pipeline.cli import main
from gristmill.pipeline.format.signature_index import params_for
from gristmill.pipeline.service.client import AsyncDedupClient, DedupClient, ServiceError
from gristmill.pipeline.service.core import FINGERPRINT_SLICE_CHARS, DedupService, Doc
from gristmill.pipeline.service.server import check_token

GUARD_S = 60  # only so a broken server fails the test instead of hanging it; nothing is timed
STATE_KEYS = ("documents", "added_since_base", "checked", "new", "added", "exact_duplicates",
              "near_duplicates", "log_bytes")

# -- generated bodies ---------------------------------------------------------------------------
CHARS = st.one_of(st.characters(), st.characters(categories=["Cs"]))  # lone surrogates included
STRINGS = st.lists(CHARS, max_size=30).map("".join)  # text() would drop most surrogates
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | STRINGS,  # floats: NaN and Infinity too
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(STRINGS, inner, max_size=3),
    max_leaves=8,
)
VALID_DOCS = st.fixed_dictionaries(  # long enough texts to be new, so an add really inserts
    {"text": st.text(min_size=12, max_size=200)}, optional={"id": st.text(min_size=1, max_size=20)})
MISSING = object()
DOCS = VALID_DOCS | st.builds(  # one field of a valid document replaced or left out, as a buggy client does
    lambda doc, key, value: {**{k: v for k, v in doc.items() if k != key}, **({} if value is MISSING else {key: value})},
    VALID_DOCS, st.sampled_from(["text", "id", "id", "colour"]),
    STRINGS | JSON_VALUES | st.sampled_from(["", "i" * 1025, MISSING]),
)
REQUESTS = st.one_of(
    DOCS,
    st.fixed_dictionaries(  # a batch of valid documents and one that may not be
        {"documents": st.builds(lambda valid, doc, at: [*valid[:at], doc, *valid[at:]],
                                st.lists(VALID_DOCS, max_size=9), DOCS, st.integers(0, 9))},
        optional={"add": st.booleans() | JSON_VALUES}),
    st.fixed_dictionaries({"documents": JSON_VALUES}),
    JSON_VALUES,
)


def _encode(value: Any, escaped: bool) -> bytes:
    """JSON bytes; unescaped, a lone surrogate becomes bytes that are not UTF-8."""
    return json.dumps(value, ensure_ascii=escaped).encode("utf-8", "surrogatepass")


JSON_BODIES = st.builds(_encode, REQUESTS, st.sampled_from([True, True, True, False]))
RAW_BODIES = st.one_of(
    st.builds(lambda body, cut: body[:cut], JSON_BODIES, st.integers(0, 300)),
    st.binary(max_size=300),
    st.sampled_from(["text", "id", "documents", "add"]).map(lambda k: f'{{"{k}": "a", "{k}": "b"}}'.encode()),
    st.integers(1, 100_000).map(lambda n: b'{"text": ' + b"[" * n + b"]" * n + b"}"),
    st.integers(4_000, 10_000).map(lambda n: b'{"text": "a", "id": ' + b"7" * n + b"}"),
)


def request(url: str, body: bytes | None = None) -> tuple[int, str, bytes]:
    """Status, content type and body of one request (POST when there is a body)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=GUARD_S) as response:
            return response.status, response.headers.get_content_type(), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get_content_type(), exc.read()


def state_of(server: Server, log: Path) -> tuple[dict[str, Any], int]:
    """What a request may change (``/stats`` without the traffic counters) and the log's size."""
    stats = json.loads(request(f"{server.url}/stats")[2])
    return {key: stats[key] for key in STATE_KEYS}, log.stat().st_size


@pytest.mark.timeout(300)
def test_generated_bodies_never_give_500_and_refusals_change_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = state / "inserts.log"
    server = start_server(state, "--max-batch", "8", "--max-body-mb", "0.25")
    accepted: list[tuple[str, bytes, list[dict[str, Any]]]] = []

    def requests_change_nothing_unless_accepted(bodies: st.SearchStrategy[bytes], examples: int) -> None:
        @settings(max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck))
        @given(body=bodies, route=st.sampled_from(["/check", "/add"]))
        def one_request(body: bytes, route: str) -> None:
            before = state_of(server, log)
            status, content_type, answer = request(f"{server.url}{route}", body)
            assert content_type == "application/json", (status, answer[:200])
            data = json.loads(answer)
            if status == 200:
                accepted.append((route, body, data["results"]))
                return
            assert status in (400, 413), (status, data)
            assert isinstance(data["error"], str) and data["error"]
            assert state_of(server, log) == before  # refused: neither the index nor the log changed

        one_request()

    try:
        requests_change_nothing_unless_accepted(JSON_BODIES, 200)
        requests_change_nothing_unless_accepted(RAW_BODIES, 100)
        assert server.proc.poll() is None
        documents = state_of(server, log)[0]["documents"]
    finally:
        server.stop()
    assert accepted, "no generated body was valid: the property tested refusals only"

    # a restart replays exactly what was acknowledged
    server = start_server(state)
    try:
        stats = json.loads(request(f"{server.url}/stats")[2])
        assert stats["documents"] == stats["replayed_at_start"] == documents
        for route, body, results in accepted:
            status, _, answer = request(f"{server.url}{route}", body)
            assert status == 200
            for first, now in zip(results, json.loads(answer)["results"], strict=True):
                if first["added"]:
                    assert now["exact_duplicate_of"] == first["id"] and not now["added"]
    finally:
        server.stop()


# -- a log append that fails ---------------------------------------------------------------------
def test_a_failed_log_append_inserts_nothing(tmp_path: Path) -> None:
    # compile (and cache) the hashing kernels here, so the limited server only reads the cache
    service = DedupService(str(tmp_path / "warm"), params_for(0.8, 128, 5))
    asyncio.run(service.handle([Doc("warm the kernels", None)], add=False))
    service.close()

    def limit_file_size() -> None:  # runs in the server process: a file system that fills up
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        # 64 KiB: the log (records of ~1,070 bytes) fills before the rows file (rows of 1,048 bytes)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))

    state = tmp_path / "state"
    server = start_server(state, preexec_fn=limit_file_size)
    acked: list[int] = []
    try:
        client = DedupClient(server.url)
        with pytest.raises(ServiceError) as refused:  # adds until the log is full
            for i in range(100):
                client.add([(f"doc-{i}", text(i))])
                acked.append(i)
        assert refused.value.status == 507 and "inserts.log: cannot append" in refused.value.reason
        assert 0 < len(acked) < 100
        size = (state / "inserts.log").stat().st_size
        stats = client.stats()
        assert stats["documents"] == stats["added"] == len(acked) and stats["log_bytes"] == size
        [refused_doc] = client.check([text(len(acked))])
        assert refused_doc.new  # the document whose record did not fit is not in the index
        with pytest.raises(ServiceError, match="507"):
            client.add([("again", text(len(acked)))])
        assert (state / "inserts.log").stat().st_size == size  # the partial write was cut back off
    finally:
        server.stop()

    server = start_server(state)  # room again: everything acknowledged is back, and adds work
    try:
        client = DedupClient(server.url)
        results = client.check([text(i) for i in acked])
        assert [r.exact_duplicate_of for r in results] == [f"doc-{i}" for i in acked]
        assert client.stats()["replayed_at_start"] == len(acked)
        assert client.add([("late", text(len(acked)))])[0].added
    finally:
        server.stop()


# -- clients that stall or do not speak HTTP -----------------------------------------------------
@pytest.fixture(scope="module")
def impatient_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("impatient") / "state", "--read-timeout", "0.5")
    try:
        yield server
    finally:
        server.stop()


async def connect(server: Server, first: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A raw connection to ``server`` that has sent ``first``."""
    address = urlsplit(server.url)
    reader, writer = await asyncio.open_connection(address.hostname, address.port)
    writer.write(first)
    await writer.drain()
    return reader, writer


@pytest.mark.timeout(120)
def test_stalled_clients_are_cut_off_while_others_are_served(impatient_server: Server) -> None:
    server = impatient_server
    documents = DedupClient(server.url).stats()["documents"]

    async def trickle(writer: asyncio.StreamWriter) -> None:
        """A head that never ends, one byte at a time: the slow-loris client."""
        try:
            while True:
                writer.write(b"a")
                await writer.drain()
                await asyncio.sleep(0.05)
        except ConnectionError:
            pass

    async def scenario() -> tuple[bytes, bytes, bytes]:
        half_head = await connect(server, b"POST /add HTTP/1.1\r\nHost: x\r\nContent-Le")
        half_body = await connect(server, b'POST /add HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"text": "n')
        slow = await connect(server, b"POST /add HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        dripping = asyncio.create_task(trickle(slow[1]))
        async with AsyncDedupClient(server.url) as client:  # another client is not held up
            [served] = await client.add([("served", text(1))])
        assert served.added
        async def answer(reader: asyncio.StreamReader) -> bytes:
            """What the server sent before closing; a reset (it closed with our bytes unread) is a close."""
            try:
                return await reader.read()
            except ConnectionResetError:
                return b""

        answers = await asyncio.wait_for(
            asyncio.gather(answer(half_head[0]), answer(half_body[0]), answer(slow[0])), GUARD_S)
        dripping.cancel()
        for _, writer in (half_head, half_body, slow):
            writer.close()
        return answers

    head_answer, body_answer, slow_answer = asyncio.run(scenario())
    assert head_answer == b"" and slow_answer == b""  # closed: no complete head in time
    status, _, answer = first_response(body_answer)
    assert status == 408 and answer == {"error": "the body did not arrive within 0.5 s"}
    assert DedupClient(server.url).stats()["documents"] == documents + 1


def first_response(raw: bytes) -> tuple[int, bytes, Any]:
    """Status, content type and parsed JSON body of the first final response in ``raw``."""
    while raw.startswith(b"HTTP/1.1 100 "):  # an interim answer to Expect: 100-continue
        raw = raw.split(b"\r\n\r\n", 1)[1]
    head, _, rest = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.split(b"\r\n")
    headers = dict(line.lower().split(b": ", 1) for line in lines)
    body = rest[: int(headers[b"content-length"])]
    return int(status_line.split()[1]), headers[b"content-type"], json.loads(body)


def http_request(method: bytes, path: bytes, version: bytes, headers: list[bytes], declare_length: bool,
                 body: bytes) -> bytes:
    """The bytes of one request, closing the connection after it (so a read ends with the answer)."""
    headers = [b"Host: x", *headers, *([b"Content-Length: %d" % len(body)] if declare_length else [])]
    return b"%s %s %s\r\n%sConnection: close\r\n\r\n%s" % (
        method, path, version, b"".join(h + b"\r\n" for h in headers), body)


MALFORMED = st.binary(max_size=200) | st.builds(  # repeated entries: well-formed parts come more often
    http_request,
    st.sampled_from([b"POST"] * 4 + [b"GET"] * 2 + [b"PUT", b"G@T", b"PRI", b"\x16\x03\x01", b""]),
    st.sampled_from([b"/check"] * 3 + [b"/add", b"/stats", b"/%zz", b"*", b"", b"/nope", b"/check?a=%00"]),
    st.sampled_from([b"HTTP/1.1"] * 4 + [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1", b""]),
    st.lists(st.sampled_from([
        b"Host: y", b"Content-Length: 5", b"Content-Length: -1", b"Content-Length: abc",
        b"Content-Length: 99999999999", b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip",
        b"Content-Encoding: gzip", b"Content-Encoding: br", b"Expect: 100-continue", b"Expect: weird",
        b"X: " + b"a" * 9000, b"no colon", b" folded", b"\x00\xff: \x7f",
    ]) | st.binary(max_size=20), max_size=3),
    st.booleans(),
    st.sampled_from([b"{}", b'{"text": 1}', b'{"documents": []}', b"\x1f\x8b\x08\x00junk"]) | st.binary(max_size=30),
)


@pytest.mark.timeout(120)
def test_malformed_http_is_answered_in_json(impatient_server: Server) -> None:
    server = impatient_server

    async def exchange(raw: bytes) -> bytes:
        reader, writer = await connect(server, raw)
        try:
            return await asyncio.wait_for(reader.read(), GUARD_S)
        finally:
            writer.close()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(MALFORMED)
    def one_connection(raw: bytes) -> None:
        answer = asyncio.run(exchange(raw))
        if answer:  # nothing only when no complete head arrived before the read timeout
            status, content_type, body = first_response(answer)
            assert content_type.startswith(b"application/json") and status < 500, (status, body)
            assert status < 400 or body["error"]

    documents = DedupClient(server.url).stats()["documents"]
    one_connection()
    assert DedupClient(server.url).stats()["documents"] == documents


# -- large batches ---------------------------------------------------------------------------------
def test_a_large_batch_lets_other_work_run_while_it_is_hashed(tmp_path: Path) -> None:
    service = DedupService(str(tmp_path), params_for(0.8, 128, 5))
    docs = [Doc(text(i, words=3000), None) for i in range(200)]
    slices = sum(len(d.text) for d in docs) // FINGERPRINT_SLICE_CHARS
    assert slices >= 4

    async def race() -> tuple[int, list[dict[str, Any]]]:
        batch = asyncio.create_task(service.handle(docs, add=False))  # a check: no fsync to wait for
        turns = 0
        while not batch.done():  # every turn here is a moment another request could have had
            turns += 1
            await asyncio.sleep(0)
        return turns, batch.result()

    turns, results = asyncio.run(race())
    service.close()
    assert len(results) == len(docs) and all(r["new"] for r in results)
    assert turns >= slices


# -- tokens -----------------------------------------------------------------------------------------
@given(st.text(st.characters(categories=["Zs", "Zl", "Zp", "Cc"]), max_size=6)
       | st.sampled_from(["two words", "tab\there", "tökén"]))
def test_check_token_refuses_blank_and_unsendable_tokens(token: str) -> None:
    with pytest.raises(ValueError, match=r"^SOURCE: the bearer token (is blank|must be printable ASCII)"):
        check_token(token, "SOURCE")


@pytest.mark.parametrize("env_token", ["", "   ", "\t\n"])
def test_a_blank_token_in_the_environment_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, env_token: str
) -> None:
    monkeypatch.setenv("GRISTMILL_SERVICE_TOKEN", env_token)
    assert main(["serve", "--state", str(tmp_path / "state")]) == 2
    assert "GRISTMILL_SERVICE_TOKEN: the bearer token is blank" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()


def test_a_blank_token_file_is_refused_at_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture) -> None:
    monkeypatch.delenv("GRISTMILL_SERVICE_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(" \n\t\n")
    assert main(["serve", "--state", str(tmp_path / "state"), "--token-file", str(token_file)]) == 2
    assert f"{token_file}: the bearer token is blank" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()
