"""The crash-safe frontier: URL-seen set, queue, outcomes and uncommitted results in one SQLite file.

Why SQLite: every transition (queued -> done with its result row and the links it found, a retry,
a parked host) is one transaction, so a SIGKILL at any moment leaves a consistent state; the seen set
lives on disk, so memory stays flat however many URLs are known. WAL mode with ``synchronous=NORMAL``
survives the death of the process (only an OS crash could lose the last transactions); pass
``synchronous="FULL"`` to survive power loss too.

A fetched page's URL becomes ``done`` in the same transaction that stores its result row, so it is
never fetched again; the row stays here until a shard holding it is written and recorded, and the
manifest is rewritten from the recorded shards (crawlers.commits: at start-up, at most once per
commit interval, and at the end).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .locks import LOCK_WAIT_S, hold

QUEUED, DONE, PARKED = 0, 1, 2
KIND_PAGE, KIND_SITEMAP = 0, 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS hosts (
    id INTEGER PRIMARY KEY, origin TEXT UNIQUE NOT NULL, parked TEXT, admitted INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS urls (
    id INTEGER PRIMARY KEY, url TEXT UNIQUE NOT NULL, host INTEGER NOT NULL, depth INTEGER NOT NULL,
    kind INTEGER NOT NULL, state INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,
    via TEXT, hops INTEGER NOT NULL DEFAULT 0, outcome TEXT);
CREATE INDEX IF NOT EXISTS urls_queued ON urls(host, id) WHERE state = 0;
CREATE TABLE IF NOT EXISTS results (
    url_rowid INTEGER PRIMARY KEY, id TEXT NOT NULL, text TEXT NOT NULL, url TEXT, final_url TEXT,
    status INTEGER, fetch_time INTEGER, domain TEXT, language TEXT, content_hash TEXT,
    depth INTEGER, encoding TEXT, warc BLOB);
CREATE TABLE IF NOT EXISTS shards (name TEXT PRIMARY KEY, info TEXT NOT NULL, warc TEXT);
CREATE TABLE IF NOT EXISTS outcomes (kind TEXT PRIMARY KEY, count INTEGER NOT NULL, example TEXT);
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY, partition INTEGER NOT NULL, url TEXT NOT NULL, depth INTEGER NOT NULL,
    kind INTEGER NOT NULL, via TEXT, hops INTEGER NOT NULL, scoped INTEGER NOT NULL);
"""
QUEUED_KIND = "queued"

RECENT_URLS = 50_000
HOST_CACHE = 65_536  # hosts whose id and admitted count stay in memory (the recently used ones)
RESULT_COLUMNS = ("id", "text", "url", "final_url", "status", "fetch_time", "domain", "language",
                  "content_hash", "depth", "encoding")


@dataclass(slots=True)
class Request:
    """One URL to fetch, as the scheduler holds it in memory."""

    rowid: int
    url: str
    host: int
    depth: int
    kind: int
    attempts: int = 0
    via: str | None = None
    hops: int = 0
    not_before: float = 0.0


class _Store:
    """One connection to the crawl's SQLite state file, and its durable transactions."""

    def __init__(self, path: str, synchronous: str = "NORMAL") -> None:
        # The timeout covers the other connection's short transaction: Frontier and ResultLog take turns.
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60.0)
        self.db.execute(f"PRAGMA synchronous={synchronous}")
        self._in_transaction = False

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One durable transition; nested uses join the outer transaction."""
        if self._in_transaction:
            yield
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._in_transaction = True
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        else:
            self.db.execute("COMMIT")
        finally:
            self._in_transaction = False

    def close(self) -> None:
        self.db.close()


class Frontier(_Store):
    """SQLite-backed queue and seen set; all writes happen inside :meth:`transaction`.

    One process owns a frontier (``<path>.lock``, :func:`gristmill.crawlers.locks.hold`): a second crawler on
    it waits for the first to end, then gets :class:`gristmill.crawlers.locks.StateInUse` naming it.
    """

    def __init__(self, path: str, synchronous: str = "NORMAL", cache_mib: int = 16,
                 lock_wait_s: float = LOCK_WAIT_S, restore: Callable[[str], object] | None = None) -> None:
        self.path = path
        self._owner = hold(path + ".lock", lock_wait_s)  # released with the object, should opening fail
        if restore is not None:  # the file is replaced under the lock, before anyone opens it
            try:
                restore(path)
            except BaseException:
                self._owner.close()
                raise
        super().__init__(path, synchronous)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA cache_size=-{int(cache_mib) * 1024}")
        self.db.execute("PRAGMA temp_store=MEMORY")
        self.db.executescript(_SCHEMA)
        self._hosts: OrderedDict[str, list[int]] = OrderedDict()  # origin -> [id, admitted], an LRU
        self._count_existing_admissions()
        self._recent: set[str] = set()  # URLs known to be in the table: repeated links skip SQLite
        self._sent: set[str] = set()  # URLs recently handed to another partition: repeats skip SQLite
        self._count_existing_outcomes()

    def close(self) -> None:
        """Close the database, then let the next owner in."""
        try:
            super().close()
        finally:
            self._owner.close()

    # -- hosts ---------------------------------------------------------------------------------
    def _host(self, origin: str) -> list[int] | None:
        """[id, admitted] of a known host; only the recently used stay in memory, the rest are in SQLite."""
        row = self._hosts.get(origin)
        if row is not None:
            self._hosts.move_to_end(origin)
            return row
        found = self.db.execute("SELECT id, admitted FROM hosts WHERE origin = ?", (origin,)).fetchone()
        if found is None:
            return None
        return self._remember(origin, list(found))

    def _remember(self, origin: str, row: list[int]) -> list[int]:
        self._hosts[origin] = row
        if len(self._hosts) > HOST_CACHE:
            self._hosts.popitem(last=False)
        return row

    def host_id(self, origin: str) -> int:
        row = self._host(origin)
        if row is None:
            host_id = self.db.execute("INSERT INTO hosts(origin) VALUES (?) RETURNING id", (origin,)).fetchone()[0]
            row = self._remember(origin, [host_id, 0])
        return row[0]

    def origin(self, host_id: int) -> str:
        return self.db.execute("SELECT origin FROM hosts WHERE id = ?", (host_id,)).fetchone()[0]

    def admitted(self, origin: str) -> int:
        row = self._host(origin)
        return 0 if row is None else row[1]

    def _count_existing_admissions(self) -> None:
        """Give a frontier written before hosts counted their URLs the count, once (one GROUP BY)."""
        if any(column[1] == "admitted" for column in self.db.execute("PRAGMA table_info(hosts)")):
            return
        with self.transaction():
            self.db.execute("ALTER TABLE hosts ADD COLUMN admitted INTEGER NOT NULL DEFAULT 0")
            self.db.execute("UPDATE hosts SET admitted = (SELECT COUNT(*) FROM urls WHERE urls.host = hosts.id)")

    def queued_hosts(self) -> list[int]:
        """Hosts with queued URLs that are not parked (used at start-up)."""
        rows = self.db.execute(
            "SELECT DISTINCT u.host FROM urls u JOIN hosts h ON h.id = u.host "
            "WHERE u.state = 0 AND h.parked IS NULL")
        return [row[0] for row in rows]

    def parked(self, host_id: int) -> str | None:
        return self.db.execute("SELECT parked FROM hosts WHERE id = ?", (host_id,)).fetchone()[0]

    def park_host(self, host_id: int, reason: str, outcome: str | None = None) -> int:
        """Park a host: its queued URLs are set aside with ``outcome`` (a re-run with unpark retries them)."""
        outcome = outcome or f"host parked: {reason}"
        with self.transaction():
            self.db.execute("UPDATE hosts SET parked = ? WHERE id = ?", (reason, host_id))
            count = self.db.execute("UPDATE urls SET state = 2, outcome = ? WHERE host = ? AND state = 0",
                                    (outcome, host_id)).rowcount
            self._count(QUEUED_KIND, -count)
            self._count(outcome, count)
            return count

    def unpark_all(self) -> int:
        with self.transaction():
            self.db.execute("UPDATE hosts SET parked = NULL")
            for outcome, count in self.db.execute(
                    "SELECT outcome, COUNT(*) FROM urls WHERE state = 2 GROUP BY 1").fetchall():
                self._count(outcome, -count)
                self._count(QUEUED_KIND, count)
            return self.db.execute("UPDATE urls SET state = 0, attempts = 0, outcome = NULL "
                                   "WHERE state = 2").rowcount

    def parked_hosts(self) -> dict[str, str]:
        return {origin: reason for origin, reason in
                self.db.execute("SELECT origin, parked FROM hosts WHERE parked IS NOT NULL")}

    # -- urls ----------------------------------------------------------------------------------
    def add(self, url: str, origin: str, depth: int, kind: int = KIND_PAGE, via: str | None = None,
            hops: int = 0) -> Request | None:
        """Admit ``url`` if never seen; returns the new request or None if it was already known."""
        if self.recently_seen(url):
            return None
        host_id = self.host_id(origin)
        inserted = self.db.execute(
            "INSERT INTO urls(url, host, depth, kind, via, hops) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(url) DO NOTHING RETURNING id", (url, host_id, depth, kind, via, hops)).fetchone()
        if len(self._recent) >= RECENT_URLS:
            self._recent.clear()
        self._recent.add(url)
        if inserted is None:
            return None
        self._hosts[origin][1] += 1  # host_id() just put it at the recent end of the cache
        self.db.execute("UPDATE hosts SET admitted = admitted + 1 WHERE id = ?", (host_id,))
        self._count(QUEUED_KIND, 1)
        return Request(inserted[0], url, host_id, depth, kind, 0, via, hops)

    def recently_seen(self, url: str) -> bool:
        """A cheap, partial seen check (a bounded in-memory set); False means "ask the table"."""
        return url in self._recent

    def seen(self, url: str) -> bool:
        return self.db.execute("SELECT 1 FROM urls WHERE url = ?", (url,)).fetchone() is not None

    def load(self, host_id: int, after: int, limit: int) -> list[Request]:
        """Queued URLs of one host with rowid above ``after``, oldest first."""
        rows = self.db.execute(
            "SELECT id, url, depth, kind, attempts, via, hops FROM urls "
            "WHERE host = ? AND state = 0 AND id > ? ORDER BY id LIMIT ?", (host_id, after, limit))
        return [Request(r[0], r[1], host_id, r[2], r[3], r[4], r[5], r[6]) for r in rows]

    def finish(self, request: Request, outcome: str) -> None:
        """The URL will not be fetched again; ``outcome`` says why (ok, http 404, robots, ...)."""
        [previous] = self.db.execute("SELECT outcome FROM urls WHERE id = ?", (request.rowid,)).fetchone()
        self.db.execute("UPDATE urls SET state = 1, outcome = ?, attempts = ? WHERE id = ?",
                        (outcome, request.attempts, request.rowid))
        self._count(previous or QUEUED_KIND, -1)
        self._count(outcome, 1)

    def retry(self, request: Request) -> None:
        self.db.execute("UPDATE urls SET attempts = ? WHERE id = ?", (request.attempts, request.rowid))

    def queued_count(self) -> int:
        row = self.db.execute("SELECT count FROM outcomes WHERE kind = ?", (QUEUED_KIND,)).fetchone()
        return row[0] if row else 0

    def outcome_counts(self) -> dict[str, tuple[int, str | None]]:
        """Every admitted URL counted by outcome kind, each with one full outcome as an example.

        Why a table: the counts move in the transaction that changes an outcome, so reading them
        costs the same at a thousand URLs as at a billion (a GROUP BY over the URLs took 3.9 s at 4 M).
        """
        rows = self.db.execute("SELECT kind, count, example FROM outcomes WHERE count != 0")
        return {kind: (count, example) for kind, count, example in rows}

    def _count(self, outcome: str, delta: int) -> None:
        """Move ``delta`` URLs into ``outcome``'s kind (call inside the transaction changing them)."""
        kind = outcome_kind(outcome)
        example = outcome if outcome != kind else None
        self.db.execute("INSERT INTO outcomes(kind, count, example) VALUES (?, ?, ?) ON CONFLICT(kind) DO UPDATE "
                        "SET count = count + excluded.count, example = COALESCE(example, excluded.example)",
                        (kind, delta, example))

    def _count_existing_outcomes(self) -> None:
        """Fill the counter table once for a frontier written before it existed (one GROUP BY, then never)."""
        if self.db.execute("SELECT 1 FROM outcomes LIMIT 1").fetchone() is not None:
            return
        with self.transaction():
            for outcome, count in self.db.execute(
                    "SELECT COALESCE(outcome, ?), COUNT(*) FROM urls GROUP BY 1", (QUEUED_KIND,)).fetchall():
                self._count(outcome, count)

    # -- links to other partitions ----------------------------------------------------------------
    def send(self, partition: int, url: str, depth: int, kind: int, via: str | None, hops: int,
             scoped: bool) -> None:
        """Keep a link for the partition that owns its host (inside the transaction that found it)."""
        if url in self._sent:
            return
        if len(self._sent) >= RECENT_URLS:
            self._sent.clear()
        self._sent.add(url)
        self.db.execute("INSERT INTO outbox(partition, url, depth, kind, via, hops, scoped) "
                        "VALUES (?, ?, ?, ?, ?, ?, ?)", (partition, url, depth, kind, via, hops, scoped))

    def outbox(self, limit: int = 100_000) -> list[tuple[int, int, str, int, int, str | None, int, bool]]:
        """The oldest links waiting to be handed over: (id, partition, url, depth, kind, via, hops, scoped)."""
        rows = self.db.execute("SELECT id, partition, url, depth, kind, via, hops, scoped FROM outbox "
                               "ORDER BY id LIMIT ?", (limit,))
        return [(*row[:7], bool(row[7])) for row in rows]

    def handed_over(self, last_id: int) -> None:
        """Forget the links up to ``last_id``: the hub has them."""
        with self.transaction():
            self.db.execute("DELETE FROM outbox WHERE id <= ?", (last_id,))

    # -- results and shards --------------------------------------------------------------------
    def store_result(self, request: Request, row: dict[str, Any], warc: bytes | None = None) -> None:
        self.db.execute(
            f"INSERT OR REPLACE INTO results(url_rowid, {', '.join(RESULT_COLUMNS)}, warc) "
            f"VALUES (?, {', '.join('?' * len(RESULT_COLUMNS))}, ?)",
            (request.rowid, *(row[c] for c in RESULT_COLUMNS), warc))

    def documents(self) -> int:
        row = self.db.execute("SELECT count FROM outcomes WHERE kind = 'ok'").fetchone()
        return row[0] if row else 0


class ResultLog(_Store):
    """Result rows waiting for a shard, and the shards written so far, over a connection of their own.

    Why a second connection: a commit (read the waiting rows, write a shard, record it) runs in a
    thread beside the event loop, and a SQLite transaction belongs to its connection. The two writers
    take turns on the database lock, each for a short transaction; WAL lets reads go on meanwhile.
    Open it after :class:`Frontier`, which creates the schema and sets WAL mode.
    """

    def unsharded(self, limit: int) -> list[tuple[int, dict[str, Any], bytes | None]]:
        rows = self.db.execute(
            f"SELECT url_rowid, {', '.join(RESULT_COLUMNS)}, warc FROM results "
            "ORDER BY url_rowid LIMIT ?", (limit,)).fetchall()
        return [(r[0], dict(zip(RESULT_COLUMNS, r[1:-1], strict=True)), r[-1]) for r in rows]

    def unsharded_count(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM results").fetchone()[0]

    def record_shards(self, infos: list[dict[str, Any]], rowids: Iterable[int], warc: str | None) -> None:
        """Record written shards and drop the result rows they now hold. The manifest comes next; a
        restart rewrites it from this table, so a crash in between loses nothing."""
        with self.transaction():
            self.db.executemany("DELETE FROM results WHERE url_rowid = ?", ((rowid,) for rowid in rowids))
            self.db.executemany("INSERT INTO shards(name, info, warc) VALUES (?, ?, ?)",
                                ((info["path"], json.dumps(info), warc) for info in infos))

    def shards(self) -> list[tuple[str, dict[str, Any], str | None]]:
        rows = self.db.execute("SELECT name, info, warc FROM shards ORDER BY rowid")
        return [(name, json.loads(info), warc) for name, info, warc in rows]


def outcome_kind(outcome: str) -> str:
    """The category of an outcome string (``"http 404"`` -> ``"http"``), for the summary."""
    return outcome.split(":")[0].split(" ")[0]


def now_ms() -> int:
    return int(time.time() * 1000)
