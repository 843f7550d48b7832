"""The dedup service's HTTP front: "have we seen this text before?" answered over HTTP while a crawl runs.

One aiohttp process answers ``POST /check``, ``POST /add``, ``GET /stats`` and ``GET /healthz`` from
an index core (:class:`gristmill.pipeline.service.core.DedupService`, or the shards of ``--shards``).
docs/SERVICE.md describes the API and the scale-out path.

Why a bad request changes nothing: the whole body is parsed and validated (:func:`parse_request`)
before anything is looked up.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
from collections import Counter
from typing import Any

from aiohttp import web

from gristmill.pipeline.service.core import BadRequest, DedupService, Doc, Unavailable
from gristmill.pipeline.service.insert_log import LogError, NoSpace

log = logging.getLogger("gristmill.serve")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BATCH = 1024
MAX_ID_CHARS = 1024
DOC_KEYS = frozenset({"id", "text"})
DEFAULT_READ_TIMEOUT = 30.0
RETRY_AFTER_S = 1  # what a 503 tells a client to wait before asking again


# -- request parsing ---------------------------------------------------------------------------
_JSON_KINDS = {dict: "object", list: "array", str: "string", int: "number", float: "number", bool: "boolean",
               type(None): "null"}


def _kind(value: Any) -> str:
    """The JSON name of a parsed value's type, for reasons a client can read."""
    return _JSON_KINDS[type(value)]


def _short(text: str, limit: int = 40) -> str:
    """A client's string as a reason quotes it: never the whole of a long one."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different: with a repeated key, which value counts is a guess."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        repeated = next(key for key, n in Counter(key for key, _ in pairs).items() if n > 1)
        raise BadRequest(f"key {_short(repeated)} appears more than once in one object")
    return obj


def _no_constant(name: str) -> Any:
    raise BadRequest(f"{name} is not a JSON value")


def _check_unicode(value: str, where: str) -> None:
    """Refuse what UTF-8 cannot encode: JSON escapes can spell lone surrogates, the log and hashes cannot."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest(f"{where} is not valid Unicode: lone surrogate at character {exc.start}") from None


def _parse_doc(value: Any, where: str) -> Doc:
    if not isinstance(value, dict):
        raise BadRequest(f"{where} must be an object with a \"text\" string, not {_kind(value)}")
    unknown = sorted(set(value) - DOC_KEYS)
    if unknown:
        raise BadRequest(f"{where} has unknown keys [{', '.join(map(_short, unknown[:5]))}]; "
                         f"allowed: {sorted(DOC_KEYS)}")
    if "text" not in value:
        raise BadRequest(f"{where}.text is missing")
    text = value["text"]
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text must be a string, not {_kind(text)}")
    doc_id = value.get("id")
    if doc_id is not None and (not isinstance(doc_id, str) or not doc_id or len(doc_id) > MAX_ID_CHARS):
        raise BadRequest(f"{where}.id must be a non-empty string of at most {MAX_ID_CHARS} characters")
    _check_unicode(text, f"{where}.text")
    if doc_id is not None:
        _check_unicode(doc_id, f"{where}.id")
    return Doc(text, doc_id)


def parse_request(body: bytes, max_batch: int, allow_add_flag: bool) -> tuple[list[Doc], bool]:
    """Validate a whole check/add body before anything is looked up: ``{"text", "id"?}`` or
    ``{"documents": [...]}``, plus ``"add"``. Strict JSON: UTF-8, no repeated keys, no NaN."""
    try:
        data = json.loads(body.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"body is not UTF-8: byte {exc.start} is invalid") from None
    except RecursionError:
        raise BadRequest("body is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # json.JSONDecodeError, or an integer too long to convert
        raise BadRequest(f"body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadRequest(f"body must be a JSON object, not {_kind(data)}")
    add = data.pop("add", False) if allow_add_flag else False
    if not isinstance(add, bool):
        raise BadRequest(f"\"add\" must be true or false, not {_kind(add)}")
    if "documents" not in data:
        return [_parse_doc(data, "body")], add
    if set(data) != {"documents"}:
        others = sorted(set(data) - {"documents"})
        raise BadRequest(f"with \"documents\" no other keys but \"add\" are allowed, got "
                         f"[{', '.join(map(_short, others[:5]))}]")
    items = data["documents"]
    if not isinstance(items, list):
        raise BadRequest(f"\"documents\" must be a list, not {_kind(items)}")
    if not items:
        raise BadRequest("\"documents\" is empty")
    if len(items) > max_batch:
        raise BadRequest(f"batch of {len(items)} documents exceeds the limit of {max_batch}", status=413)
    return [_parse_doc(item, f"documents[{i}]") for i, item in enumerate(items)], add


# -- HTTP --------------------------------------------------------------------------------------
INTERNAL_ERROR = "internal error; the reason is in the server log"


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token(token: str, source: str) -> str:
    """``token`` if a client can send it in a header and it is not blank; ``source`` names where it came from."""
    if not token.strip():
        raise ValueError(f"{source}: the bearer token is blank")
    if not (token.isascii() and token.isprintable()) or any(c.isspace() for c in token):
        raise ValueError(f"{source}: the bearer token must be printable ASCII without spaces")
    return token


def check_bind(host: str, token: str | None) -> None:
    """The safety rule: anything but loopback needs a bearer token."""
    if not is_loopback(host) and not token:
        raise ValueError(f"refusing to bind {host} without a bearer token: set GRISTMILL_SERVICE_TOKEN "
                         "or pass --token-file")


def _one_line(text: str) -> str:
    """aiohttp's multi-line parser messages as one line of a JSON reason."""
    return " ".join(text.split())


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


def _unavailable(reason: str) -> web.Response:
    """503 with ``Retry-After``: the client may ask again shortly (a shard restarting, a store fault)."""
    response = _error(503, reason)
    response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


async def _read_body(request: web.Request, max_body_bytes: int, read_timeout: float) -> bytes:
    """The whole body, or a :class:`BadRequest` for one too large, malformed or too slow to arrive."""
    if (request.content_length or 0) > max_body_bytes:  # refused before waiting for bytes never used
        raise BadRequest(f"body of {request.content_length} bytes exceeds the limit of {max_body_bytes}", 413)
    try:
        return await asyncio.wait_for(request.read(), read_timeout)
    except asyncio.TimeoutError:
        raise BadRequest(f"the body did not arrive within {read_timeout:g} s", 408) from None
    except web.HTTPRequestEntityTooLarge:  # chunked or compressed: found while reading
        raise BadRequest(f"body exceeds the limit of {max_body_bytes} bytes", 413) from None
    except web.RequestPayloadError as exc:  # a bad chunk or compressed stream
        raise BadRequest(f"cannot read the body: {_one_line(str(exc))}") from None


def make_app(
    service: DedupService,
    *,
    token: str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
) -> web.Application:
    """The aiohttp application; ``token`` (when set) is required on every route but ``/healthz``.

    Every answer is JSON: client errors carry a reason, and anything unexpected is a 500 whose
    traceback goes to the server log.
    """
    expected = f"Bearer {check_token(token, 'token')}".encode() if token is not None else None

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        service.counters.requests += 1
        if expected is not None and request.path != "/healthz":
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                service.counters.bad_requests += 1
                response = _error(401, "missing or wrong bearer token")
                response.headers["WWW-Authenticate"] = "Bearer"
                return response
        try:
            return await handler(request)
        except BadRequest as exc:
            service.counters.bad_requests += 1
            return _error(exc.status, str(exc))
        except web.HTTPException as exc:  # 404 and 405 from the router: answer in JSON too
            service.counters.bad_requests += exc.status < 500
            return _error(exc.status, exc.reason)
        except Unavailable as exc:
            log.warning("%s %s: %s", request.method, request.path, exc)
            return _unavailable(str(exc))
        except NoSpace as exc:
            log.error("%s %s: %s", request.method, request.path, exc)
            return _error(507, f"{exc}; nothing of this request was inserted, checks are still answered")
        except LogError as exc:
            log.error("%s %s: %s", request.method, request.path, exc)
            return _unavailable(f"{exc}; nothing of this request was acknowledged")
        except ConnectionError:
            raise  # the client went away: nobody to answer
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, INTERNAL_ERROR)

    async def check_or_add(request: web.Request, add_route: bool) -> web.Response:
        body = await _read_body(request, max_body_bytes, read_timeout)
        docs, add = parse_request(body, max_batch, allow_add_flag=not add_route)
        results = await service.handle(docs, add or add_route)
        return web.json_response({"results": results})

    async def check(request: web.Request) -> web.Response:
        return await check_or_add(request, add_route=False)

    async def add(request: web.Request) -> web.Response:
        return await check_or_add(request, add_route=True)

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(await service.report())

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "documents": service.stats()["documents"]})

    async def json_errors(request: web.Request, response: web.StreamResponse) -> None:
        """An error aiohttp answers before the middleware runs (an ``Expect`` it does not know) is JSON too."""
        if response.status >= 400 and isinstance(response, web.Response) and response.content_type != "application/json":
            response.text = json.dumps({"error": response.text or response.reason})
            response.content_type = "application/json"
            # aiohttp's 417 for an unknown Expect carries an explicit Content-Length of its own text
            response.headers["Content-Length"] = str(len(response.body or b""))

    app = web.Application(middlewares=[guard], client_max_size=max_body_bytes)
    app.on_response_prepare.append(json_errors)
    app.router.add_post("/check", check)
    app.router.add_post("/add", add)
    app.router.add_get("/stats", stats)
    app.router.add_get("/healthz", healthz)
    return app


class _Connection(web.RequestHandler):
    """aiohttp's handler of one connection, which also answers what its HTTP parser refuses in JSON
    and closes the connection if its first request head is not complete ``head_timeout`` after it
    opened. aiohttp's keep-alive timer bounds the wait for every later head; only from 3.14.4 on
    does it also start with the connection, and before that a client sending nothing, or half a
    head, held its connection forever.
    """

    def __init__(self, *args: Any, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timeout = head_timeout
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_tail = b""  # the last bytes received, for a head end split across two reads

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._head_deadline = asyncio.get_running_loop().call_later(self._head_timeout, self.force_close)

    def data_received(self, data: bytes) -> None:
        if self._head_deadline is not None:
            seen = self._head_tail + data
            if b"\n\r\n" in seen or b"\n\n" in seen:  # the blank line that ends a head
                self._head_deadline.cancel()
                self._head_deadline = None
            self._head_tail = seen[-2:]
        super().data_received(data)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        super().connection_lost(exc)

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs; refuses once a response has started
        reason = f"malformed HTTP request: {_one_line(message)}" if status < 500 and message else INTERNAL_ERROR
        response = _error(status, reason)
        response.force_close()
        return response


async def serve_forever(
    service: DedupService,
    host: str,
    port: int,
    *,
    token: str | None = None,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    read_timeout: float = DEFAULT_READ_TIMEOUT,
    ready: Any = None,
) -> None:
    """Bind, report the bound address through ``ready(url)``, and serve until cancelled.

    ``read_timeout`` bounds every wait on a client: a connection without a complete request head
    that long after it opened (or after its last answer) is closed, a body not complete that long
    after its head gets 408, and the rest of a refused body is read for at most that long.
    """
    check_bind(host, token)
    app = make_app(service, token=token, max_batch=max_batch, max_body_bytes=max_body_bytes,
                   read_timeout=read_timeout)
    runner = web.AppRunner(app)
    await runner.setup()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Connection(runner.server, loop=loop, access_log=None, head_timeout=read_timeout,
                            keepalive_timeout=read_timeout, lingering_time=read_timeout),
        host, port,
    )
    port = server.sockets[0].getsockname()[1]  # port 0 picks a free port; report the real one
    if ready is not None:
        ready(f"http://{host if ':' not in host else f'[{host}]'}:{port}")
    service.start()
    try:
        await asyncio.Event().wait()
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await runner.cleanup()
        service.close()
