"""The dedup service as the crawler's duplicate oracle (``gristmill crawl --dedup-service URL``).

The crawler states what it asks (:mod:`gristmill.crawlers.oracle`) and knows nothing of the service; this adapter
answers with the service's asyncio client and turns its errors into the crawler's :class:`OracleError`.
"""

from __future__ import annotations

from collections.abc import Sequence

from gristmill.crawlers.oracle import OracleError, Verdict
from gristmill.pipeline.service.client import AsyncDedupClient, CheckResult, ServiceError


class ServiceOracle:
    """A :class:`gristmill.crawlers.oracle.DuplicateOracle` backed by a running ``gristmill serve``."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self._client = AsyncDedupClient(url, token)

    async def open(self) -> None:
        await self._client.open()

    async def close(self) -> None:
        await self._client.close()

    async def add(self, docs: Sequence[tuple[str, str]]) -> list[Verdict]:
        try:
            results = await self._client.add(docs)
        except ServiceError as exc:
            raise OracleError(str(exc)) from None
        return [_verdict(result) for result in results]


def _verdict(result: CheckResult) -> Verdict:
    """The service's answer as the crawler's: the ids it duplicates, the exact copy first."""
    ids = (result.exact_duplicate_of, *(near.id for near in result.near_duplicates))
    return Verdict(result.new, tuple(i for i in ids if i is not None))
