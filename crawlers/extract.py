"""Bytes to text: charset decoding, main-text extraction and offline language identification.

Why these choices: ``benchmarks/extraction_f1.py`` measures quality and CPU time on the shared
article-extraction benchmark. trafilatura's defaults with ``fast=True`` (no fallback extractors) score
F1 0.964 at ~15 ms of CPU per page, against 0.965 at ~23 ms with ``favor_precision`` (the most
accurate setting) and 0.947 at ~13 ms with both; resiliparse is far faster but scores 0.922, jusText
0.739 (see docs/BENCHMARKS.md). Extraction is what bounds a crawl's pages/s, so the setting that
keeps the F1 and cuts a third of the CPU wins. Language ids come from py3langid, whose model ships inside the
wheel, so nothing is downloaded at run time. Extraction runs in pebble worker processes with a
per-document timeout: a pathological page costs one killed worker, never a hung crawl.
"""

from __future__ import annotations

import asyncio
import codecs
import multiprocessing
import re
from concurrent.futures import TimeoutError as FutureTimeout
from functools import lru_cache
from typing import Any

import xxhash

_BOMS = (
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9._:-]+)""", re.IGNORECASE)
MIN_LANGUAGE_CHARS = 20
LANGUAGE_SAMPLE_CHARS = 1500  # enough for a stable answer; py3langid walks the sample byte by byte
_NOT_LETTERS = re.compile(r"[\W\d_]+")
MIN_LANGUAGE_CONFIDENCE = 0.5


def _codec(name: str | None) -> str | None:
    if not name:
        return None
    try:
        return codecs.lookup(name.strip().strip("\"'")).name
    except LookupError:
        return None


def decode_html(body: bytes, header_charset: str | None = None) -> tuple[str, str]:
    """Decode a document, trying BOM, HTTP header charset, ``<meta>`` charset, then detection.

    A declared charset that does not decode the bytes cleanly is skipped, so a wrong header falls
    through to the next source; the last resort is UTF-8 with replacement characters. Never raises.
    Returns ``(text, encoding used)``.
    """
    for bom, name in _BOMS:
        if body.startswith(bom):
            return body[len(bom):].decode(name, errors="replace"), name
    candidates = [_codec(header_charset)]
    match = _META_CHARSET.search(body[:4096])
    if match:
        candidates.append(_codec(match.group(1).decode("ascii", "ignore")))
    for name in candidates:
        if name:
            try:
                return body.decode(name), name
            except (UnicodeDecodeError, LookupError):
                continue
    try:
        return body.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    matches = list(from_bytes(body[:200_000]))
    name = "utf-8"
    if matches:
        best = matches[0]
        tied = [m.encoding for m in matches if (m.chaos, m.coherence) == (best.chaos, best.coherence)]
        # Among equally plausible legacy encodings prefer windows-1252, the web's default (WHATWG).
        name = _codec("cp1252" if "cp1252" in tied else best.encoding) or "utf-8"
    return body.decode(name, errors="replace"), name


def extract_text(html: str | bytes, url: str | None = None) -> str:
    """The main text of an HTML page (boilerplate, navigation and comments removed); "" if none."""
    import trafilatura

    if isinstance(html, bytes):
        html = decode_html(html)[0]
    if not html.strip():
        return ""
    try:
        text = trafilatura.extract(html, url=url, fast=True, include_comments=False, include_tables=True)
    except (ValueError, TypeError, RecursionError):  # trafilatura's parser gives up on some inputs
        return ""
    return text or ""


@lru_cache(maxsize=1)
def _identifier() -> Any:
    import py3langid.langid as langid

    return langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE, norm_probs=True)


def detect_language(text: str) -> str:
    """ISO 639-1 code of ``text`` from the bundled py3langid model, or "und" when unsure or too short."""
    sample = text[:LANGUAGE_SAMPLE_CHARS]
    if len(_NOT_LETTERS.sub("", sample)) < MIN_LANGUAGE_CHARS:
        return "und"
    language, confidence = _identifier().classify(sample)
    return language if confidence >= MIN_LANGUAGE_CONFIDENCE else "und"


def content_hash(text: str) -> str:
    """32-hex xxh3-128 of the UTF-8 text: the ``content_hash`` column."""
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8"))


def process_document(html: str, url: str | None) -> tuple[str, str]:
    """What a worker does per page: ``(main text, language)``."""
    text = extract_text(html, url)
    return text, detect_language(text)


def prepare_worker() -> None:
    """Load trafilatura and the language model once per worker, outside any document's time limit."""
    import trafilatura  # noqa: F401

    _identifier()


class ExtractionTimeout(Exception):
    """A document took longer than the per-document limit; its worker was killed."""


class ExtractionPool:
    """Worker processes for :func:`process_document`, each task with its own time limit."""

    def __init__(self, workers: int, timeout: float) -> None:
        from pebble import ProcessPool

        self.timeout = timeout
        # Workers are recycled after many documents (parsers can leak), rarely: each restart reloads
        # trafilatura and the language model, seconds of lost extraction.
        self._pool = ProcessPool(max_workers=max(1, workers), max_tasks=20_000, initializer=prepare_worker,
                                 context=multiprocessing.get_context("forkserver"))

    async def process(self, html: str, url: str) -> tuple[str, str]:
        """Run one document; raises :class:`ExtractionTimeout` if it overruns."""
        future = self._pool.schedule(process_document, args=(html, url), timeout=self.timeout)
        try:
            return await asyncio.wrap_future(future)
        except FutureTimeout:
            raise ExtractionTimeout(f"{url}: extraction took longer than {self.timeout:g}s") from None

    def close(self) -> None:
        self._pool.stop()
        self._pool.join(timeout=10)
