"""What the crawler asks a dedup service, as an interface of its own: "have you seen this text before?"

Why an interface here: the crawler sits below the dedup service (``crawlers/`` imports only
``gristmill.pipeline.format``, DESIGN.md), so it states what it needs and the code that starts a crawl plugs an
implementation in (``gristmill crawl --dedup-service URL`` passes ``gristmill.pipeline.service.oracle``'s).
The oracle is advisory: when it cannot answer it raises :class:`OracleError`, and the crawl stores
the page and counts the error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


class OracleError(Exception):
    """The oracle could not answer; the message says why (and names the service)."""


@dataclass(frozen=True)
class Verdict:
    """The answer for one document: ``new`` when the oracle did not hold it, and the ids of the documents
    it duplicates (an exact copy first, then near copies)."""

    new: bool
    duplicate_of: tuple[str, ...] = ()


class DuplicateOracle(Protocol):
    """A store of documents the crawl checks each page against, adding the new ones in the same step."""

    async def open(self) -> None:
        """Get ready; called inside the crawl's event loop before the first :meth:`add`."""

    async def add(self, docs: Sequence[tuple[str, str]]) -> Sequence[Verdict]:
        """Verdicts for ``(id, text)`` documents, in order; the new ones are added. :class:`OracleError`
        when it cannot answer."""

    async def close(self) -> None:
        """Let go of what :meth:`open` took; called once the crawl is done."""
