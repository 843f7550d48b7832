"""``gristmill serve --shards K``: K index shards as Ray actors behind the one HTTP front.

Documents are partitioned by content hash: shard ``k`` holds the documents whose hash's top 64 bits
are ``k`` modulo K (their rows, band keys, ids, log and snapshots, in ``STATE/shard-k``). A near
duplicate can live on any shard, so every lookup asks every shard (scatter-gather); each shard
answers from its own complete tables.

Why "exactly one new among concurrent near-duplicates" still holds: the front is the one
serialisation point of adds. An add batch runs, under the front's add lock, (1) a lookup on every
shard, (2) the decision in request order, each document also checked against the new documents
before it in the batch, (3) the inserts on their home shards. The next add batch's lookups start
only after that, so they see every insert of the one before. An add is answered only once every
insert it relies on (its own, and those its lookups saw) is durable: on a local state folder each
insert is fsynced before the shard answers; on a store the front waits, outside the lock, for each
shard's group commit (:mod:`gristmill.pipeline.service.durable`). Checks do not take the lock: a
shard answers a lookup only once every insert it has seen is durable, so a check is never told
"duplicate of X" before X is acknowledged-durable.

A shard that dies is restarted by Ray (``max_restarts=-1``): with a local state folder on the node
that holds it (node affinity), reopening its snapshot and logs; with a state on a store on any node,
from the store. Requests meanwhile get 503. An insert is never retried by the front: a shard may
have logged it before it died, and the client was not told it was added, so it asks again and
hears "duplicate" or "new".
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from gristmill.pipeline.format.signature_index import IndexParams, params_from_dict, params_to_dict
from gristmill.pipeline.format.storage import is_local, open_fs
from gristmill.pipeline.service.columns import hash_words, return_freed_memory
from gristmill.pipeline.service.core import (
    Counters,
    DedupService,
    Doc,
    Fingerprints,
    Unavailable,
    fingerprints,
    verdict,
)
from gristmill.pipeline.service.durable import ShardStore, Shipper, Ticket, check_shard_count, read_placements
from gristmill.pipeline.service.index import MAX_NEAR_DUPLICATES
from gristmill.pipeline.service.insert_log import LogError, LogRecord
from gristmill.pipeline.service.snapshot import StateError, lock_state

log = logging.getLogger("gristmill.serve")

SHARDS_FILE = "shards.json"
NAMESPACE = "gristmill-serve"
HEAD_RESOURCE = "node:__internal_head__"  # Ray's resource of the head node alone
DEFAULT_CALL_TIMEOUT = 10.0  # seconds a request waits on a shard before it is answered 503


def shard_name(state: str, k: int) -> str:
    """The Ray actor name of shard ``k`` of the state ``state`` (a folder's absolute path, or a store URL):
    one front per state, as the name is taken once."""
    return f"{state}#shard-{k}"


def home_shard(digests: Sequence[str], shards: int) -> np.ndarray:
    """The shard of each content hash: its top 64 bits modulo the number of shards."""
    return (hash_words(list(digests))[:, 0] % np.uint64(shards)).astype(np.int64)


class Shard:
    """One shard: a :class:`DedupService` driven by the front (a Ray actor). With ``store_url`` its
    inserts are shipped to the store (:mod:`gristmill.pipeline.service.durable`) and its folder on the
    node is a scratch copy rebuilt from the store at every start, so it may start on any node."""

    def __init__(self, state: str | None, params: dict[str, Any] | None, index_url: str | None, part: tuple[int, int],
                 compact_every: int, store_url: str | None = None) -> None:
        return_freed_memory()  # the actor's process is the shard's own
        parsed = params_from_dict(params, store_url or state) if params else None
        self.scratch = None
        if store_url is None:
            assert state is not None
            self.service = DedupService(state, parsed, index_url=index_url, compact_every=compact_every, part=part)
            self.shipper: Shipper | None = None
            return
        self.scratch = scratch_folder(part[0])
        self.service, store = copy_from_store(self.scratch, parsed, index_url, part, store_url, take_over=True)
        try:
            self.shipper = Shipper(store, self.service.index, compact_every)
            store.record_placement({"node": self.node(), "host": socket.gethostname(), "pid": os.getpid()})
        except BaseException:
            self.close()
            raise
        log.info("%s: generation %d took over at segment %d with %d documents", store_url, store.generation,
                 store.last, len(self.service.index))

    def params(self) -> dict[str, Any]:
        return params_to_dict(self.service.params)

    async def lookup(self, digests: list[str], signatures: np.ndarray, bands: np.ndarray,
                     durable: bool = True) -> tuple[list[tuple[Any, list]], Ticket | None]:
        """(exact twin id, [(near id, similarity)]) per document, and the ticket that makes everything
        they rely on durable; with ``durable``, answered only once it is."""
        index = self.service.index
        found = []
        for digest, signature, row in zip(digests, signatures, bands, strict=True):
            exact, near = index.lookup(digest, row, signature)
            found.append((None if exact is None else index.ids[exact], [(index.ids[j], sim) for j, sim in near]))
        if self.shipper is None:
            await self.service.log.sync(self.service.log.written)
            return found, None
        ticket = self.shipper.ticket()
        if durable:
            await self.sync(ticket)
        return found, ticket

    async def insert(self, records: list[tuple[str, str, int, np.ndarray]]) -> tuple[int, Ticket | None]:
        """Insert documents the front found new; returns the index size and the ticket to :meth:`sync`
        (on a local state folder: returns once they are durable, with no ticket)."""
        service = self.service
        logged = [LogRecord(*r) for r in records]
        durable_at = service.commit(logged)
        written_to = service.log
        service.after_insert()
        if self.shipper is None:
            await written_to.sync(durable_at)
            return len(service.index), None
        return len(service.index), self.shipper.add(logged)

    async def sync(self, ticket: Ticket) -> None:
        """Return once every insert up to ``ticket`` is on the store."""
        assert self.shipper is not None
        try:
            await self.shipper.sync(ticket)
        except OSError as exc:
            raise LogError(f"{self.shipper.store.url}: cannot ship inserts ({exc}); retrying") from None

    def stats(self) -> dict[str, Any]:
        return self.service.stats()

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        self.service.close()
        if self.scratch is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)


def copy_from_store(scratch: str, params: IndexParams | None, index_url: str | None, part: tuple[int, int],
                    store_url: str, *, take_over: bool) -> tuple[DedupService, ShardStore]:
    """Shard ``part`` rebuilt in the local folder ``scratch`` from the store: its part of the corpus
    index, then every insert the store holds for it. With ``take_over`` the shard's log is then
    claimed by a new generation (a shard about to serve); without, nothing is written (an export).
    ``scratch`` is removed when the copy cannot be made."""
    service = None
    try:
        # the local snapshots of a scratch copy would be thrown away: only the store's count
        service = DedupService(scratch, params, index_url=index_url, compact_every=2**62, part=part)
        store = ShardStore(store_url, service.params)
        service.replay(record for batch in (store.open() if take_over else store.read()) for record in batch)
    except BaseException:
        if service is not None:
            service.close()
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return service, store


def scratch_folder(k: int) -> str:
    """A new folder on this node for a shard's scratch copy; those of shards no longer running go
    (their lock is free: a killed process leaves its folder behind). One without a lock file yet is
    another shard's, starting."""
    root = os.path.join(tempfile.gettempdir(), "gristmill-shards")
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):
        if not os.path.exists(os.path.join(root, name, "lock")):
            continue
        with contextlib.suppress(StateError, OSError):
            lock_state(os.path.join(root, name)).close()
            shutil.rmtree(os.path.join(root, name))
    return tempfile.mkdtemp(prefix=f"shard-{k}-", dir=root)


class ShardedService:
    """The HTTP front's side of ``serve --shards``: hashing, routing and the add lock; the same
    ``handle``/``stats``/``report``/``counters`` as :class:`DedupService`, so one HTTP app serves both.

    ``state`` on a store (``s3://...``): the shard count and each shard's log live there, shard ``k``
    starts on the ``k``-th alive node (worker nodes first, the head last) and restarts on any node.
    A local folder: each shard's folder is on the node it is pinned to (a cluster whose nodes share
    that disk)."""

    def __init__(self, state: str, shards: int, params: IndexParams | None, *, index_url: str | None = None,
                 compact_every: int, nodes: Sequence[str] | None = None,
                 call_timeout: float = DEFAULT_CALL_TIMEOUT) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.call_timeout = call_timeout
        fs, _ = open_fs(state)
        self.durable = not is_local(fs)
        actor = ray.remote(Shard)
        # one byte of Ray's logical memory, not nothing: Ray 2.60 places an actor that asks for no resource
        # on a random node whatever its soft node affinity says (12 of 15 misplaced on 3 nodes; 0 of 15 so)
        options = {"num_cpus": 0, "memory": 1, "max_restarts": -1, "max_concurrency": 64, "namespace": NAMESPACE}
        config = (params_to_dict(params) if params else None, index_url)
        state = self.state = state.rstrip("/") if self.durable else os.path.abspath(state)
        if self.durable:
            check_shard_count(state, shards)
            # a soft affinity, not Ray's SPREAD: that is best effort, and on a busy cluster it put both
            # shards of a test on the head; soft, so a shard whose node is gone restarts on another
            alive = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: HEAD_RESOURCE in n["Resources"])
            self.shards = [actor.options(**options, name=shard_name(state, k),
                                         scheduling_strategy=NodeAffinitySchedulingStrategy(
                                             alive[k % len(alive)]["NodeID"], soft=True)).remote(
                None, *config, (k, shards), compact_every, f"{state}/shard-{k}") for k in range(shards)]
        else:
            os.makedirs(state, exist_ok=True)
            _check_shard_count(state, shards)
            nodes = list(nodes or [n["NodeID"] for n in ray.nodes() if n["Alive"]])
            self.shards = [
                actor.options(**options, name=shard_name(state, k), scheduling_strategy=NodeAffinitySchedulingStrategy(
                    nodes[k % len(nodes)], soft=False)).remote(
                    os.path.join(state, f"shard-{k}"), *config, (k, shards), compact_every)
                for k in range(shards)
            ]
        self.params = params_from_dict(ray.get(self.shards[0].params.remote()), state)
        self.hasher = self.params.hasher()
        self.counters = Counters()
        self._documents = sum(s["documents"] for s in ray.get([s.stats.remote() for s in self.shards]))
        self._add_lock = asyncio.Lock()

    async def _call(self, method: str, per_shard: Sequence[Sequence[Any] | None]) -> list[Any]:
        """``method`` on every shard given arguments (None: not called), answers in shard order (None for
        those not called). A shard down, restarting or slower than ``call_timeout``: :class:`Unavailable`."""
        import ray

        calls = {k: getattr(shard, method).remote(*args)
                 for k, (shard, args) in enumerate(zip(self.shards, per_shard, strict=True)) if args is not None}
        try:
            answers = await asyncio.wait_for(asyncio.gather(*calls.values()), self.call_timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError,
                ray.exceptions.ActorUnschedulableError, asyncio.TimeoutError) as exc:
            raise Unavailable(f"a shard is unavailable ({type(exc).__name__}); nothing of this request was "
                              "acknowledged; retry shortly") from None
        except ray.exceptions.RayTaskError as exc:  # a shard's own error (a full disk: NoSpace), without Ray's traceback
            if isinstance(exc.cause, LogError):
                raise exc.cause from None
            raise
        by_shard = dict(zip(calls, answers, strict=True))
        return [by_shard.get(k) for k in range(len(self.shards))]

    async def _lookup(self, prints: Fingerprints, durable: bool) -> tuple[list[tuple[str | None, list[tuple[str, float]]]],
                                                                         list[Ticket | None]]:
        answers = await self._call("lookup", [(prints.digests, prints.signatures, prints.bands, durable)]
                                   * len(self.shards))
        merged = []
        for i in range(len(prints.digests)):
            exact = next((a[i][0] for a, _ in answers if a[i][0] is not None), None)
            near = sorted((pair for a, _ in answers for pair in a[i][1]), key=lambda pair: -pair[1])
            merged.append((exact, near[:MAX_NEAR_DUPLICATES]))
        return merged, [ticket for _, ticket in answers]

    async def handle(self, docs: Sequence[Doc], add: bool) -> list[dict[str, Any]]:
        """Check, or add under the add lock; an add is answered once every insert it relies on (its own
        and those its lookups saw, on every shard) is durable, a wait taken outside the lock so that
        the adds arriving meanwhile share the shards' next group commit."""
        prints = await fingerprints(self.hasher, self.params, docs)
        ids = [d.doc_id if d.doc_id is not None else digest for d, digest in zip(docs, prints.digests, strict=True)]
        if not add:
            found, _ = await self._lookup(prints, durable=True)
            results = [verdict(i, h, False, exact, near) for i, h, (exact, near) in zip(ids, prints.digests, found,
                                                                                        strict=True)]
            self.counters.count(results)
            return results
        async with self._add_lock:
            found, tickets = await self._lookup(prints, durable=False)
            results, new = self._decide(docs, ids, prints, found)
            home = home_shard([prints.digests[i] for i in new], len(self.shards)) if new else np.zeros(0, np.int64)
            records: list[list[Any]] = [[] for _ in self.shards]
            for i, k in zip(new, home.tolist(), strict=True):
                records[k].append((ids[i], prints.digests[i], len(docs[i].text), prints.signatures[i]))
            inserted = await self._call("insert", [(r,) if r else None for r in records])
            tickets = [answer[1] if answer is not None else ticket for answer, ticket in zip(inserted, tickets,
                                                                                              strict=True)]
            self._documents += len(new)
        await self._call("sync", [(t,) if t is not None else None for t in tickets])
        self.counters.count(results)
        self.counters.added += len(new)
        return results

    def _decide(self, docs: Sequence[Doc], ids: list[str], prints: Fingerprints,
                found: list[tuple[str | None, list[tuple[str, float]]]]) -> tuple[list[dict[str, Any]], list[int]]:
        """Verdicts in request order, each document also checked against the batch's new ones before it."""
        results, new = [], []
        threshold = self.params.threshold
        for i, (exact, near) in enumerate(found):
            if exact is None:
                exact = next((ids[j] for j in new if prints.digests[j] == prints.digests[i]), None)
            if new:
                earlier = np.asarray(new)
                shares = np.any(prints.bands[earlier] == prints.bands[i], axis=1)
                sims = (prints.signatures[earlier] == prints.signatures[i]).mean(axis=1)
                close = [(ids[j], float(s)) for j, s, hit in zip(earlier, sims, shares, strict=True)
                         if hit and s >= threshold and prints.digests[j] != prints.digests[i]]
                near = sorted(near + close, key=lambda pair: -pair[1])[:MAX_NEAR_DUPLICATES]
            results.append(verdict(ids[i], prints.digests[i], True, exact, near))
            if results[-1]["new"]:
                new.append(i)
        return results, new

    def stats(self) -> dict[str, Any]:
        c = self.counters
        return {"documents": self._documents, "shards": len(self.shards), "requests": c.requests,
                "checked": c.checked, "new": c.new, "added": c.added, "exact_duplicates": c.exact_duplicates,
                "near_duplicates": c.near_duplicates, "bad_requests": c.bad_requests,
                "params": params_to_dict(self.params)}

    async def report(self) -> dict[str, Any]:
        """:meth:`stats`, and with a state on a store each shard's generation and placement as the store
        records them (read at each call, off the event loop): what a front started anywhere sees."""
        report = self.stats()
        if self.durable:
            try:
                report["placement"] = await asyncio.get_running_loop().run_in_executor(
                    None, read_placements, self.state, len(self.shards))
            except (OSError, StateError) as exc:
                raise Unavailable(f"cannot read the shards' placement from the store ({exc})") from None
        return report

    def start(self) -> None:
        """Nothing to start: each shard compacts its own state."""

    def close(self) -> None:
        """Close every shard's files, then end its actor (so Ray does not restart it)."""
        import ray

        ray.get([shard.close.remote() for shard in self.shards])
        for shard in self.shards:
            ray.kill(shard, no_restart=True)


def _check_shard_count(state: str, shards: int) -> None:
    """A state folder keeps the shard count it was made with: documents are placed by it."""
    path = os.path.join(state, SHARDS_FILE)
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as handle:
            json.dump({"shards": shards}, handle)
        return
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)["shards"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StateError(f"{path}: unreadable ({exc})") from None
    if found != shards:
        raise StateError(f"{path}: this state was built with --shards {found}, not {shards}")
