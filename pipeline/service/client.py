"""Python clients for the dedup service (``gristmill serve``): a blocking one and an asyncio one.

Both send documents in batches no larger than the server's limit and turn the JSON answers into
:class:`CheckResult` s. This module imports only the standard library at import time (aiohttp inside
:class:`AsyncDedupClient`), so a crawler or a script pays for nothing else.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DocumentLike = str | tuple[str, str] | Mapping[str, str]
DEFAULT_BATCH = 256
TOKEN_ENV = "GRISTMILL_SERVICE_TOKEN"  # the bearer token: what gristmill serve requires, what gristmill crawl sends


class ServiceError(Exception):
    """The service refused a request or could not be reached; the message names the URL and reason."""

    def __init__(self, url: str, status: int | None, reason: str) -> None:
        super().__init__(f"{url}: {status or 'unreachable'}: {reason}")
        self.url = url
        self.status = status
        self.reason = reason


@dataclass(frozen=True)
class NearDuplicate:
    id: str
    similarity: float


@dataclass(frozen=True)
class CheckResult:
    """The service's verdict on one document."""

    id: str
    new: bool
    added: bool
    exact_duplicate_of: str | None
    near_duplicates: tuple[NearDuplicate, ...]
    content_hash: str

    @property
    def is_duplicate(self) -> bool:
        return not self.new

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckResult:
        return cls(
            id=data["id"],
            new=data["new"],
            added=data["added"],
            exact_duplicate_of=data["exact_duplicate_of"],
            near_duplicates=tuple(NearDuplicate(n["id"], n["similarity"]) for n in data["near_duplicates"]),
            content_hash=data["content_hash"],
        )


def as_document(doc: DocumentLike) -> dict[str, str]:
    """``"text"``, ``(id, text)`` or ``{"id": ..., "text": ...}`` as the service's document object."""
    if isinstance(doc, str):
        return {"text": doc}
    if isinstance(doc, tuple):
        doc_id, text = doc
        return {"id": doc_id, "text": text}
    return {k: doc[k] for k in ("id", "text") if k in doc}


def batches(docs: Iterable[DocumentLike], size: int) -> Iterator[list[dict[str, str]]]:
    """Documents in request-sized lists."""
    batch: list[dict[str, str]] = []
    for doc in docs:
        batch.append(as_document(doc))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _headers(token: str | None) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def _reason(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")


def _results(body: Mapping[str, Any]) -> list[CheckResult]:
    return [CheckResult.from_json(r) for r in body["results"]]


class _Endpoint:
    """Where a client talks to and how: shared by the blocking and the asyncio client."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0,
                 batch_size: int = DEFAULT_BATCH) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.batch_size = batch_size


class DedupClient(_Endpoint):
    """Blocking client (standard library only), for scripts and tests."""

    def _call(self, method: str, path: str, payload: Any = None) -> Any:
        data = None if payload is None else json.dumps(payload).encode("utf-8")
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method, headers=_headers(self.token))
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise ServiceError(f"{self.url}{path}", exc.code, _reason(exc.read())) from None
        except (urllib.error.URLError, OSError) as exc:
            raise ServiceError(f"{self.url}{path}", None, str(getattr(exc, "reason", exc))) from None

    def check(self, docs: Sequence[DocumentLike], add: bool = False) -> list[CheckResult]:
        """Verdicts for ``docs`` in order; with ``add`` the new ones are inserted."""
        out: list[CheckResult] = []
        for batch in batches(docs, self.batch_size):
            out.extend(_results(self._call("POST", "/check", {"documents": batch, "add": add})))
        return out

    def add(self, docs: Sequence[DocumentLike]) -> list[CheckResult]:
        return self.check(docs, add=True)

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/stats")

    def healthz(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")


class AsyncDedupClient(_Endpoint):
    """asyncio client over one aiohttp session (keep-alive); use as ``async with``."""

    _session: Any = None

    async def open(self) -> AsyncDedupClient:
        """Start the session (``async with`` does this); must run inside the event loop that uses it."""
        import aiohttp

        self._session = aiohttp.ClientSession(
            headers=_headers(self.token), timeout=aiohttp.ClientTimeout(total=self.timeout)
        )
        return self

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncDedupClient:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, path: str, payload: Any = None) -> Any:
        import aiohttp

        url = f"{self.url}{path}"
        try:
            async with self._session.request(method, url, json=payload) as response:
                body = await response.read()
                if response.status != 200:
                    raise ServiceError(url, response.status, _reason(body))
                return json.loads(body)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ServiceError(url, None, f"{type(exc).__name__}: {exc}") from None

    async def check(self, docs: Sequence[DocumentLike], add: bool = False) -> list[CheckResult]:
        out: list[CheckResult] = []
        for batch in batches(docs, self.batch_size):
            out.extend(_results(await self._call("POST", "/check", {"documents": batch, "add": add})))
        return out

    async def add(self, docs: Sequence[DocumentLike]) -> list[CheckResult]:
        return await self.check(docs, add=True)

    async def stats(self) -> dict[str, Any]:
        return await self._call("GET", "/stats")

    async def healthz(self) -> dict[str, Any]:
        return await self._call("GET", "/healthz")
