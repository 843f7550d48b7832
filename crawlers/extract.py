"""Bytes to text: charset decoding, main-text extraction and offline language identification.

Why these choices: ``benchmarks/extraction_f1.py`` measures quality and CPU time on the shared
article-extraction benchmark. trafilatura's defaults with ``fast=True`` (no fallback extractors) score
F1 0.964 at ~15 ms of CPU per page, against 0.965 at ~23 ms with ``favor_precision`` (the most
accurate setting) and 0.947 at ~13 ms with both; resiliparse is far faster but scores 0.922, jusText
0.739 (see docs/BENCHMARKS.md). Extraction is what bounds a crawl's pages/s, so the setting that
keeps the F1 and cuts a third of the CPU wins. Language ids come from py3langid, whose model ships inside the
wheel, so nothing is downloaded at run time. Extraction runs in worker processes with a
per-document timeout: a pathological page costs one killed worker, never a hung crawl.
"""

from __future__ import annotations

import asyncio
import codecs
import multiprocessing
import re
import signal
from collections import deque
from dataclasses import dataclass
from functools import lru_cache
from multiprocessing.connection import Connection
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
    import numpy as np
    import py3langid.langid as langid

    identifier = langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE, norm_probs=True)
    # The feature weights ship as float16, which numpy multiplies without BLAS: a third of each call.
    # Widened once (0.1 s, +28 MB) they give bit-identical scores in three quarters of the time.
    identifier.nb_ptc = identifier.nb_ptc.astype(np.float32)
    return identifier


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


class ExtractionError(Exception):
    """A document could not be extracted: its worker raised, crashed or was killed, or none would start."""


class ExtractionTimeout(ExtractionError):
    """A document took longer than the per-document limit; its worker was killed."""


def _serve(conn: Connection) -> None:
    """A worker: load the libraries, say so, then answer documents until the pipe closes (also when
    it closes while the worker speaks: the crawl ended, and a traceback would only alarm its user).

    Ctrl-C in a terminal reaches the whole process group; the crawl owns it and closes the pipe,
    so a worker ignores SIGINT instead of dying with a KeyboardInterrupt traceback of its own.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prepare_worker()
    try:
        conn.send(None)  # ready: the first document's time limit starts only now
        while True:
            try:
                html, url = conn.recv()
            except (EOFError, ConnectionError):  # closed, or reset by a crawl that ended mid-read
                return
            try:
                answer: tuple[bool, Any] = (True, process_document(html, url))
            except Exception as exc:  # the crawl records it; the worker lives on
                answer = (False, ExtractionError(f"{url}: {type(exc).__name__}: {exc}"))
            conn.send(answer)
    except ConnectionError:  # the crawl closed the pool before this worker was done: nothing to say
        return


@dataclass(eq=False)
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False
    future: asyncio.Future[tuple[str, str]] | None = None
    url: str = ""
    timer: asyncio.TimerHandle | None = None
    documents: int = 0


MAX_FAILED_STARTS = 3


class ByteBudget:
    """A cap on the bytes of HTML held by pages waiting for an extraction worker.

    Why: a fetched page gives its connection back before extraction, so without a cap a slow pool
    lets pages pile up in memory. A page waits here while it still holds its connection slot, so a
    full budget slows fetching down instead. One page larger than the whole cap may go alone.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._changed = asyncio.Condition()

    async def acquire(self, size: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.held == 0 or self.held + size <= self.limit)
            self.held += size

    async def release(self, size: int) -> None:
        async with self._changed:
            self.held -= size
            self._changed.notify_all()


class ExtractionPool:
    """Worker processes for :func:`process_document`, each document with its own time limit.

    Why not a generic process pool: per page, the pool's own bookkeeping ran in the crawl's event-loop
    process, and with two pebble threads handing every task over it cost about a fifth of that
    process's CPU. Here each worker is one pipe watched by the event loop itself: a document is one
    ``send``, its answer one callback, its time limit one timer that kills the worker and starts a
    fresh one. Must be created inside the running event loop.
    """

    def __init__(self, workers: int, timeout: float, max_documents: int = 20_000) -> None:
        self.timeout = timeout
        # Workers are recycled after many documents (parsers can leak), rarely: each restart costs a fork.
        self.max_documents = max_documents
        self._loop = asyncio.get_running_loop()
        self._context = multiprocessing.get_context("forkserver")
        # Ignored if this process's fork server already runs; each worker then loads the libraries itself.
        self._context.set_forkserver_preload(["gristmill.crawlers._preload"])
        self._workers: set[_Worker] = set()
        self._idle: list[_Worker] = []
        self._queue: deque[tuple[str, str, asyncio.Future[tuple[str, str]]]] = deque()
        self._closed = False
        self._failed_starts = 0
        self.broken: ExtractionError | None = None  # set when workers keep dying before they are ready
        for _ in range(max(1, workers)):
            self._start_worker()

    async def process(self, html: str, url: str) -> tuple[str, str]:
        """Run one document; raises :class:`ExtractionTimeout` if it overruns."""
        if self.broken is not None:
            raise self.broken
        future: asyncio.Future[tuple[str, str]] = self._loop.create_future()
        self._queue.append((html, url, future))
        self._dispatch()
        return await future

    def close(self) -> None:
        self._closed = True
        for worker in list(self._workers):
            self._stop_worker(worker, kill=False)
        self._fail_queue("extraction pool closed")

    def _fail_queue(self, reason: str) -> None:
        for _html, url, future in self._queue:
            if not future.done():
                future.set_exception(ExtractionError(f"{url}: {reason}"))
        self._queue.clear()

    def _start_worker(self) -> None:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(theirs,), daemon=True)
        process.start()
        theirs.close()
        worker = _Worker(process, ours)
        self._workers.add(worker)
        self._loop.add_reader(ours.fileno(), self._on_answer, worker)

    def _stop_worker(self, worker: _Worker, kill: bool) -> None:
        self._workers.discard(worker)
        if worker in self._idle:
            self._idle.remove(worker)
        if worker.timer is not None:
            worker.timer.cancel()
        self._loop.remove_reader(worker.conn.fileno())
        worker.conn.close()  # an idle worker reads EOF and exits
        if kill:
            worker.process.kill()
        worker.process.join(timeout=0 if kill else 5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5)

    def _on_answer(self, worker: _Worker) -> None:
        try:
            answer = worker.conn.recv()
        except (EOFError, OSError):  # the worker died: its document fails, a fresh worker takes over
            if not worker.ready:
                self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                self._closed = True  # no more replacements: they would die the same way, forever
                self._stop_worker(worker, kill=True)
                self.broken = ExtractionError(
                    f"{self._failed_starts} extraction workers died while starting; if a script starts "
                    "the crawl, it needs an `if __name__ == \"__main__\":` guard (multiprocessing imports "
                    "the main script in every new process)")
                self._fail_queue(str(self.broken))
                return
            self._retire(worker, ExtractionError(f"{worker.url}: extraction worker died"), kill=True)
            return
        future, worker.future = worker.future, None
        if future is None:
            worker.ready = True
            self._failed_starts = 0
        else:
            assert worker.timer is not None
            worker.timer.cancel()
            worker.documents += 1
            if not future.done():
                ok, value = answer
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)
            if worker.documents >= self.max_documents:
                self._retire(worker, None, kill=False)
                return
        self._idle.append(worker)
        self._dispatch()

    def _expire(self, worker: _Worker) -> None:
        self._retire(worker, ExtractionTimeout(f"{worker.url}: extraction took longer than {self.timeout:g}s"),
                     kill=True)

    def _retire(self, worker: _Worker, error: ExtractionError | None, kill: bool) -> None:
        """Replace a worker; ``error`` fails the document it held."""
        future = worker.future
        self._stop_worker(worker, kill)
        if future is not None and not future.done() and error is not None:
            future.set_exception(error)
        if not self._closed:
            self._start_worker()

    def _dispatch(self) -> None:
        while self._idle and self._queue:
            html, url, future = self._queue.popleft()
            if future.done():  # its caller was cancelled
                continue
            worker = self._idle.pop()
            worker.future, worker.url = future, url
            try:
                worker.conn.send((html, url))
            except OSError:  # died while idle: the document waits for the next worker
                worker.future = None
                self._queue.appendleft((html, url, future))
                self._retire(worker, None, kill=True)
                continue
            worker.timer = self._loop.call_later(self.timeout, self._expire, worker)
