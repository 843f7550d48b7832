"""An object store with real latency, for tests and benchmarks: moto's S3 server behind a shaping proxy.

The proxy (aiohttp, 127.0.0.1 only) forwards every S3 request to an upstream S3-protocol server (moto's
standalone server) and shapes the answers as a cloud store would:

- ``latency``: seconds before the first byte of every response (S3's time to first byte);
- ``conn_mbps``: a bandwidth cap per connection (an HTTP/1.1 connection carries one response at a time,
  so a response is paced at this rate); ``total_mbps``: a cap on all connections together (the node's
  interface). The capacity a client can reach is ``min(total_mbps, connections x conn_mbps)``;
- ``gets_per_s`` (with ``burst``): a token bucket of GET requests per prefix (bucket plus the key's
  folder); a GET beyond it is answered ``503 SlowDown``, as S3 does beyond 5,500 GETs/s per prefix.

Object bodies are served by the proxy itself from a copy fetched once from upstream (dropped when the
object is written or deleted through the proxy): moto answers a ranged GET by copying the whole object
and slicing it (64 MiB objects: 57 MB/s of 4 MiB ranges, measured), which would make moto, not the
shaping, the limit. ``tamper`` lets a test damage bodies (short, wrong Content-Length, garbage);
``fail(pattern, count)`` answers the next ``count`` requests whose path matches a glob with ``503
SlowDown`` (or another status), as a throttling bucket does to one hot key.

Requests are counted by kind (GET, PUT, COPY, LIST, HEAD, DELETE, POST, other: a rename on an object
store is a COPY and a DELETE) in ``stats()["kinds"]``, and with ``record=True`` logged as (kind, path)
in ``log`` so a benchmark can add them up per stage by the keys they touched; the object bytes sent
are counted per path (``sent_by_path``: what a reader downloaded of each object) and the request
bodies received in all (``bytes_received``).

Settings can be changed while it runs (``store.shape(...)`` in-process, or ``POST /__shape__`` with
JSON); ``stats()`` / ``GET /__stats__`` report what it did. Run it as a process for benchmarks:

    python benchmarks/shaped_store.py --upstream http://127.0.0.1:PORT --port-file FILE
"""

from __future__ import annotations

import argparse
import asyncio
import fnmatch
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

# (object key, body about to be sent) -> (body to send, Content-Length to declare)
Tamper = Callable[[str, bytes], tuple[bytes, int]]

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "te", "trailer", "upgrade",
               "proxy-authorization", "proxy-authenticate", "content-encoding"}
_SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
              b"<Message>Please reduce your request rate.</Message></Error>")
_TICK = 0.01  # pacing granularity: a paced response writes about this many seconds' worth per chunk


@dataclass
class Shape:
    """The link's settings; None means unlimited."""

    latency: float = 0.0
    conn_mbps: float | None = None
    total_mbps: float | None = None
    gets_per_s: float | None = None
    burst: float | None = None  # GETs a prefix may send at once (default: a tenth of a second's worth, >= 1)


@dataclass
class StoreStats:
    """What the proxy did: requests, GETs, 503s sent, body bytes sent, most requests served at once."""

    requests: int = 0
    gets: int = 0
    throttled: int = 0
    bytes_sent: int = 0
    max_active: int = 0
    connections: int = 0
    upstream_object_reads: int = 0
    kinds: dict[str, int] = field(default_factory=dict)  # requests by kind(): GET, PUT, COPY, LIST, ...
    bytes_received: int = 0  # request bodies (PUT, POST)
    sent_by_path: dict[str, int] = field(default_factory=dict)  # object body bytes sent, by object path
    _active: int = field(default=0, repr=False)


def kind(method: str, path: str, query: Any, headers: Any) -> str:
    """What an S3 request does: a GET on a bucket (or with ``list-type``) is a LIST, a PUT naming a copy
    source is a COPY, a multipart part or upload is a PUT."""
    if method == "GET" and (path.strip("/").count("/") == 0 or "list-type" in query or "prefix" in query):
        return "LIST"
    if method == "PUT" and "x-amz-copy-source" in headers:
        return "COPY"
    return method if method in ("GET", "PUT", "HEAD", "DELETE", "POST") else "other"


class ShapedStore:
    """The shaping proxy in a background thread with its own event loop; ``endpoint`` is its URL."""

    def __init__(self, upstream: str, shape: Shape | None = None, *, tamper: Tamper | None = None,
                 port: int = 0, record: bool = False) -> None:
        self.upstream = upstream.rstrip("/")
        self.settings = shape or Shape()
        self.tamper = tamper
        self.port = port
        self.counters = StoreStats()
        self.record = record
        self.log: list[tuple[str, str]] = []  # (kind, path) of every request, with record=True
        self._faults: list[list[Any]] = []  # [glob, requests left (None: all), status]
        self._objects: dict[str, tuple[bytes, dict[str, str]]] = {}
        self._filling: dict[str, asyncio.Lock] = {}
        self._buckets: dict[str, tuple[float, float]] = {}  # prefix -> (tokens, time)
        self._link_free = 0.0  # when the shared link is next free (total_mbps pacing)
        self._connections: set[int] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._session: ClientSession | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    # -- control -----------------------------------------------------------------------------------
    def shape(self, **settings: Any) -> None:
        """Change settings (``latency=0.1, conn_mbps=40, ...``); requests already sent keep theirs."""
        for name, value in settings.items():
            if not hasattr(self.settings, name):
                raise ValueError(f"no shaping setting {name!r}; settings are {list(asdict(self.settings))}")
            setattr(self.settings, name, value)
        self._buckets.clear()

    def fail(self, pattern: str, count: int | None = 1, status: int = 503) -> None:
        """Answer the next ``count`` requests (None: every one) whose path (``/bucket/key``) matches the
        glob ``pattern`` with ``status`` (503 is S3's SlowDown) instead of serving them."""
        self._faults.append([pattern, count, status])

    def clear_faults(self) -> None:
        self._faults.clear()

    def stats(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self.counters).items() if not k.startswith("_")}

    def reset_stats(self) -> None:
        self.counters = StoreStats()
        self._connections.clear()
        self.log = []

    def start(self) -> str:
        ready = threading.Event()

        def serve() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(self._start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, name="shaped-store", daemon=True)
        self._thread.start()
        ready.wait()
        return self.endpoint

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join()
        self._loop.close()
        self._loop = None

    def __enter__(self) -> ShapedStore:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _start(self) -> None:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/__shape__", self._set_shape)
        app.router.add_route("*", "/__stats__", self._get_stats)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._session = ClientSession(timeout=ClientTimeout(total=600), auto_decompress=False)

    async def _stop(self) -> None:
        assert self._session is not None and self._runner is not None
        await self._session.close()
        await self._runner.cleanup()

    async def _set_shape(self, request: web.Request) -> web.Response:
        self.shape(**(await request.json()))
        return web.json_response(asdict(self.settings))

    async def _get_stats(self, request: web.Request) -> web.Response:
        stats = self.stats()
        if request.method == "POST":
            self.reset_stats()
        return web.json_response(stats)

    # -- the data path -----------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        counters = self.counters
        counters.requests += 1
        counters._active += 1
        counters.max_active = max(counters.max_active, counters._active)
        connection = id(request.transport)
        if connection not in self._connections:
            self._connections.add(connection)
            counters.connections += 1
        try:
            return await self._answer(request)
        finally:
            counters._active -= 1

    def _fault(self, path: str) -> int | None:
        """The status an injected fault answers ``path`` with, or None (see ``fail``)."""
        for fault in self._faults:
            pattern, left, status = fault
            if (left is None or left > 0) and fnmatch.fnmatchcase(path, pattern):
                if left is not None:
                    fault[1] = left - 1
                return status
        return None

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        request_kind = kind(request.method, path, request.query, request.headers)
        self.counters.kinds[request_kind] = self.counters.kinds.get(request_kind, 0) + 1
        if self.record:
            self.log.append((request_kind, path))
        injected = self._fault(path)
        if injected is not None:
            self.counters.throttled += 1
            await asyncio.sleep(self.settings.latency)
            body = _SLOW_DOWN if injected == 503 else b""
            return web.Response(status=injected, body=body, content_type="application/xml")
        is_object = request.method == "GET" and path.count("/") >= 2 and not path.endswith("/") and set(request.query) <= {"x-id"}
        if request.method == "GET":
            self.counters.gets += 1
            if not self._admit(path):
                self.counters.throttled += 1
                await asyncio.sleep(self.settings.latency)
                return web.Response(status=503, body=_SLOW_DOWN, content_type="application/xml")
        if not is_object:
            status, headers, body = await self._forward(request)
            if request.method in ("PUT", "POST", "DELETE"):  # (a bulk delete is a POST to the bucket)
                for stale in [name for name in self._objects if name == path or name.startswith(path + "/")]:
                    del self._objects[stale]
            await asyncio.sleep(self.settings.latency)
            if request.method != "HEAD":
                return web.Response(status=status, headers=headers, body=body)
            length = int(headers.pop("Content-Length"))
            head = web.StreamResponse(status=status, headers=headers)
            head.content_length = length
            await head.prepare(request)
            await head.write_eof()
            return head
        found = await self._object(request)
        if isinstance(found, web.Response):
            await asyncio.sleep(self.settings.latency)
            return found
        data, headers = found
        status, begin, end = 200, 0, len(data)
        spec = request.headers.get("Range", "")
        if spec.startswith("bytes=") and "," not in spec:
            first, _, last = spec[6:].partition("-")
            if first:
                begin, end = int(first), min(len(data), int(last) + 1 if last else len(data))
            elif last:
                begin = max(0, len(data) - int(last))
            if begin >= end:
                return web.Response(status=416, text="InvalidRange")
            status = 206
            headers = dict(headers, **{"Content-Range": f"bytes {begin}-{end - 1}/{len(data)}"})
        body = data[begin:end]
        declared = len(body)
        if self.tamper is not None:
            body, declared = self.tamper(path, body)
        await asyncio.sleep(self.settings.latency)
        response = web.StreamResponse(status=status, headers=headers)
        response.content_length = declared
        if declared != len(body):
            response.force_close()  # a broken sender: the connection ends where its body does
        await response.prepare(request)
        await self._paced_write(response, memoryview(body)[:declared], path)
        if declared == len(body):
            await response.write_eof()
        return response

    def _admit(self, path: str) -> bool:
        """One GET from the token bucket of the path's prefix (bucket and folder of the key)."""
        rate = self.settings.gets_per_s
        if rate is None:
            return True
        burst = self.settings.burst or max(1.0, rate / 10)
        prefix = path.rpartition("/")[0]
        now = time.monotonic()
        tokens, then = self._buckets.get(prefix, (burst, now))
        tokens = min(burst, tokens + (now - then) * rate)
        if tokens < 1:
            self._buckets[prefix] = (tokens, now)
            return False
        self._buckets[prefix] = (tokens - 1, now)
        return True

    async def _paced_write(self, response: web.StreamResponse, body: memoryview, path: str) -> None:
        """Write ``body`` in chunks, each when the capped link would have finished carrying it."""
        conn, total = self.settings.conn_mbps, self.settings.total_mbps
        rates = [r * 1e6 for r in (conn, total) if r]
        chunk = max(64 * 1024, int(min(rates) * _TICK)) if rates else len(body) or 1
        began, sent = time.monotonic(), 0
        for start in range(0, len(body), chunk):
            piece = body[start:start + chunk]
            ready = began + (sent + len(piece)) / (conn * 1e6) if conn else 0.0
            if total:
                self._link_free = max(time.monotonic(), self._link_free) + len(piece) / (total * 1e6)
                ready = max(ready, self._link_free)
            delay = ready - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            # counted before the write: a client can have the bytes (and read the counters) before
            # the write's await returns here
            sent += len(piece)
            self.counters.bytes_sent += len(piece)
            by_path = self.counters.sent_by_path
            by_path[path] = by_path.get(path, 0) + len(piece)
            await response.write(piece)

    async def _object(self, request: web.Request) -> tuple[bytes, dict[str, str]] | web.Response:
        """The whole object from the proxy's copy, fetched from upstream once; an upstream error as is."""
        path = request.path
        found = self._objects.get(path)
        if found is not None:
            return found
        lock = self._filling.setdefault(path, asyncio.Lock())
        async with lock:
            found = self._objects.get(path)
            if found is not None:
                return found
            status, headers, body = await self._forward(request, drop_range=True)
            if status != 200:
                return web.Response(status=status, headers=headers, body=body)
            self.counters.upstream_object_reads += 1
            keep = {k: v for k, v in headers.items() if k.lower() in ("etag", "last-modified", "content-type")}
            keep["Accept-Ranges"] = "bytes"
            self._objects[path] = (body, keep)
            return body, keep

    async def _forward(self, request: web.Request, drop_range: bool = False) -> tuple[int, dict[str, str], bytes]:
        assert self._session is not None
        skip = _HOP_BY_HOP | ({"range"} if drop_range else set())
        headers = {k: v for k, v in request.headers.items() if k.lower() not in skip}
        data = await request.read()
        self.counters.bytes_received += len(data)
        async with self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                         data=data if data else None, allow_redirects=False) as upstream:
            body = await upstream.read()
            kept = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
            if request.method == "HEAD":  # no body: the length is the object's, and it must reach the client
                kept["Content-Length"] = upstream.headers.get("Content-Length", "0")
            return upstream.status, kept, body


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="the S3-protocol server to front, e.g. moto's")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", help="write the port here once listening")
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--conn-mbps", type=float)
    parser.add_argument("--total-mbps", type=float)
    parser.add_argument("--gets-per-s", type=float)
    args = parser.parse_args()
    store = ShapedStore(args.upstream, Shape(args.latency, args.conn_mbps, args.total_mbps, args.gets_per_s),
                        port=args.port)
    store.start()
    if args.port_file:
        with open(args.port_file, "w") as handle:
            handle.write(str(store.port))
    threading.Event().wait()


if __name__ == "__main__":
    main()
