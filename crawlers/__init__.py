"""gristmill crawlers: a polite, crash-safe async crawler that writes raw corpus shards.

``crawl(seeds, output, **options)`` runs a crawl (re-running resumes; ``oracle=`` plugs in a store of
known texts, :mod:`gristmill.crawlers.oracle`); ``extract_text`` and ``detect_language`` are the text tools the
pipeline shares. Importing this package loads neither aiohttp nor trafilatura until they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .extract import detect_language, extract_text

if TYPE_CHECKING:
    from .config import CrawlConfig, CrawlSummary
    from .crawler import Crawler

__all__ = ["CrawlConfig", "CrawlSummary", "Crawler", "crawl", "detect_language", "extract_text"]


def __getattr__(name: str) -> Any:
    if name in ("CrawlConfig", "CrawlSummary", "Crawler"):
        from . import crawler

        return getattr(crawler, name)
    raise AttributeError(f"module 'crawlers' has no attribute {name!r}")


def crawl(seeds: list[str], output: str, **options: Any) -> CrawlSummary:
    """Crawl ``seeds`` into ``output``; see :func:`gristmill.crawlers.run.crawl`."""
    from .run import crawl as _crawl

    return _crawl(seeds, output, **options)
