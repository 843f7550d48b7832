"""Page processing: a fetched HTML response becomes a page row, the links it holds, and its outcome.

Why a module of its own: what happens to a page once its connection is done (decoding, link
parsing, main-text extraction in worker processes, the WARC payload, the duplicate oracle's verdict)
is independent of how the crawl schedules hosts or commits shards. The crawler only writes the
:class:`Page` this returns into its frontier, in one transaction.

Pages waiting for an extraction worker hold their HTML under a byte cap (:class:`ByteBudget`): the
caller reserves a page's bytes while it still holds its connection slot, so a full budget slows
fetching down instead of piling pages up in memory.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .extract import (
    ByteBudget,
    ExtractionError,
    ExtractionPool,
    ExtractionTimeout,
    content_hash,
    decode_html,
    detect_language,
)
from .fetch import Response
from .frontier import Request, now_ms
from .oracle import DuplicateOracle, OracleError
from .output import warc_payload
from .urls import host_of, parse_page, url_id

OK = "ok"
EMPTY = "empty: no main text"


@dataclass
class Page:
    """What became of one fetched page: ``outcome`` (``ok`` with a ``row`` to store, empty, a
    duplicate, rejected) and the links to admit."""

    outcome: str
    links: list[str] = field(default_factory=list)
    row: dict[str, Any] | None = None
    warc: bytes | None = None


class PageProcessor:
    """Turns responses into :class:`Page` results; ``config`` is a :class:`~gristmill.crawlers.config.CrawlConfig`.

    The extraction workers start only when :meth:`start` is called (the crawl's first dispatch), so a
    re-run of a finished crawl starts none. :meth:`process` raises :class:`ExtractionError` only when
    no worker can start at all: the crawl should stop, leaving the page queued.
    """

    def __init__(self, config: Any, oracle: DuplicateOracle | None, on_error: Callable[[str], None]) -> None:
        self.config = config
        self.oracle = oracle
        self.on_error = on_error
        self.pool: ExtractionPool | None = None
        self.dedup_counts = Counter[str]()  # checked / duplicates / errors
        self.waiting = 0  # pages fetched and not yet processed (most wait for an extraction worker)
        self._extract_slots = asyncio.Semaphore(max(4, 4 * config.extract_workers))
        self._html_budget = ByteBudget(config.extract_buffer_bytes)

    def start(self) -> None:
        """Start the extraction workers (inside the running event loop); later calls do nothing."""
        if self.config.extract and self.pool is None:
            self.pool = ExtractionPool(self.config.extract_workers, self.config.extract_timeout)

    async def open(self) -> None:
        if self.oracle is not None:
            await self.oracle.open()

    async def close(self) -> None:
        if self.oracle is not None:
            await self.oracle.close()
        if self.pool is not None:
            self.pool.close()

    async def reserve(self, response: Response) -> int:
        """Wait until the page's HTML fits the budget of pages waiting for extraction; returns the bytes
        reserved, which :meth:`process` gives back. Call it while still holding the connection slot."""
        held = len(response.body) if self.config.extract else 0
        await self._html_budget.acquire(held)
        return held

    async def process(self, request: Request, response: Response, reserved: int) -> Page:
        """The page of ``response`` (fetched for ``request``), after :meth:`reserve` returned ``reserved``."""
        self.waiting += 1
        try:
            return await self._process(request, response)
        finally:
            self.waiting -= 1
            await self._html_budget.release(reserved)

    async def _process(self, request: Request, response: Response) -> Page:
        html, encoding = decode_html(response.body, response.charset)
        links, plain = parse_page(html, response.url, want_text=not self.config.extract)
        if self.config.extract:
            self.start()
            assert self.pool is not None
            try:
                async with self._extract_slots:
                    text, language = await self.pool.process(html, response.url)
            except ExtractionError as exc:  # a timeout, or a worker that crashed on this page
                if self.pool.broken is not None:
                    raise self.pool.broken from None
                self.on_error(str(exc))
                return Page("rejected: extraction timed out" if isinstance(exc, ExtractionTimeout)
                            else "rejected: extraction failed")
        else:
            text, language = plain, detect_language(plain)
        if not text:
            return Page(EMPTY, links)
        final = response.url
        row = {"id": url_id(final), "text": text, "url": request.via or request.url, "final_url": final,
               "status": response.status, "fetch_time": now_ms(), "domain": host_of(final),
               "language": language, "content_hash": content_hash(text), "depth": request.depth,
               "encoding": encoding}
        duplicate_of = await self._known_to_oracle(row) if self.oracle is not None else None
        if duplicate_of is not None:
            return Page(f"duplicate: of {duplicate_of} (dedup service)", links)
        blob = None
        if self.config.warc:
            blob = warc_payload(response.request_headers, response.status, "OK", list(response.headers.items()),
                                response.body, {"language": language, "encoding": encoding,
                                                "links": len(links), "depth": request.depth})
        return Page(OK, links, row, blob)

    async def _known_to_oracle(self, row: dict[str, Any]) -> str | None:
        """Ask the oracle (checking and adding in one step) whether it already holds this text.

        Returns the id of the document it duplicates, or None to store it. The oracle is advisory:
        when it cannot answer, the page is stored and the error counted. A match with this page's own
        id (it was added before a crash kept it from being stored) does not count as a duplicate.
        """
        assert self.oracle is not None
        try:
            [verdict] = await self.oracle.add([(row["id"], row["text"])])
        except OracleError as exc:
            self.dedup_counts["errors"] += 1
            self.on_error(f"{row['final_url']}: dedup service: {exc}")
            return None
        self.dedup_counts["checked"] += 1
        others = [i for i in verdict.duplicate_of if i != row["id"]]
        if verdict.new or not others:
            return None
        self.dedup_counts["duplicates"] += 1
        return others[0]
