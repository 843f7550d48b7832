"""``gristmill serve --shards K``: K index shards as Ray actors behind the one HTTP front.

Documents are partitioned by content hash: shard ``k`` holds the documents whose hash's top 64 bits
are ``k`` modulo K (their rows, band keys, ids, log and snapshots, in ``STATE/shard-k``). A near
duplicate can live on any shard, so every lookup asks every shard (scatter-gather); each shard
answers from its own complete tables.

Why "exactly one new among concurrent near-duplicates" still holds: the front is the one
serialisation point of adds. An add batch runs, under the front's add lock, (1) a lookup on every
shard, (2) the decision in request order, each document also checked against the new documents
before it in the batch, (3) the inserts on their home shards, each of which logs and fsyncs before
it answers. The next add batch's lookups start only after that, so they see every insert of the one
before. Checks do not take the lock: a shard answers a lookup only once every insert it has seen is
durable, so a check is never told "duplicate of X" before X is acknowledged-durable.

A shard that dies is restarted by Ray (``max_restarts=-1``) on the node that holds its state folder
(node affinity) and reopens its snapshot and logs; requests meanwhile get 503. An insert is never
retried by the front: a shard may have logged it before it died, and the client was not told it
was added, so it asks again and hears "duplicate" or "new".
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from gristmill.pipeline.format.signature_index import IndexParams, params_from_dict, params_to_dict
from gristmill.pipeline.service.columns import hash_words, return_freed_memory
from gristmill.pipeline.service.index import MAX_NEAR_DUPLICATES
from gristmill.pipeline.service.server import (
    Counters,
    DedupService,
    Doc,
    Fingerprints,
    LogError,
    LogRecord,
    StateError,
    Unavailable,
    fingerprints,
    verdict,
)

SHARDS_FILE = "shards.json"
NAMESPACE = "gristmill-serve"


def shard_name(state: str, k: int) -> str:
    """The Ray actor name of shard ``k`` of the state folder ``state`` (one front per folder: it is locked)."""
    return f"{os.path.abspath(state)}#shard-{k}"


def home_shard(digests: Sequence[str], shards: int) -> np.ndarray:
    """The shard of each content hash: its top 64 bits modulo the number of shards."""
    return (hash_words(list(digests))[:, 0] % np.uint64(shards)).astype(np.int64)


class Shard:
    """One shard: a :class:`DedupService` on its own state folder, driven by the front (a Ray actor)."""

    def __init__(self, state: str, params: dict[str, Any] | None, index_url: str | None, part: tuple[int, int],
                 compact_every: int) -> None:
        return_freed_memory()  # the actor's process is the shard's own
        self.service = DedupService(state, params_from_dict(params, state) if params else None,
                                    index_url=index_url, compact_every=compact_every, part=part)

    def params(self) -> dict[str, Any]:
        return params_to_dict(self.service.params)

    async def lookup(self, digests: list[str], signatures: np.ndarray, bands: np.ndarray) -> list[tuple[Any, list]]:
        """(exact twin id, [(near id, similarity)]) per document, once everything they rely on is durable."""
        index = self.service.index
        found = []
        for digest, signature, row in zip(digests, signatures, bands, strict=True):
            exact, near = index.lookup(digest, row, signature)
            found.append((None if exact is None else index.ids[exact], [(index.ids[j], sim) for j, sim in near]))
        await self.service.log.sync(self.service.log.written)
        return found

    async def insert(self, records: list[tuple[str, str, int, np.ndarray]]) -> int:
        """Insert documents the front found new; returns once they are durable."""
        service = self.service
        durable_at = service.commit([LogRecord(*r) for r in records])
        written_to = service.log
        service.after_insert()
        await written_to.sync(durable_at)
        return len(service.index)

    def stats(self) -> dict[str, Any]:
        return self.service.stats()

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def close(self) -> None:
        self.service.close()


class ShardedService:
    """The HTTP front's side of ``serve --shards``: hashing, routing and the add lock; the same
    ``handle``/``stats``/``counters`` as :class:`DedupService`, so one HTTP app serves both."""

    def __init__(self, state: str, shards: int, params: IndexParams | None, *, index_url: str | None = None,
                 compact_every: int, nodes: Sequence[str] | None = None) -> None:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        state = os.path.abspath(state)
        os.makedirs(state, exist_ok=True)
        _check_shard_count(state, shards)
        nodes = list(nodes or [n["NodeID"] for n in ray.nodes() if n["Alive"]])
        actor = ray.remote(Shard)
        self.shards = [
            actor.options(num_cpus=0, max_restarts=-1, max_concurrency=64, namespace=NAMESPACE, name=shard_name(state, k),
                          scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[k % len(nodes)], soft=False)).remote(
                os.path.join(state, f"shard-{k}"), params_to_dict(params) if params else None, index_url, (k, shards),
                compact_every)
            for k in range(shards)
        ]
        self.params = params_from_dict(ray.get(self.shards[0].params.remote()), state)
        self.hasher = self.params.hasher()
        self.counters = Counters()
        self._documents = sum(s["documents"] for s in ray.get([s.stats.remote() for s in self.shards]))
        self._add_lock = asyncio.Lock()

    async def _call(self, method: str, per_shard: Sequence[Sequence[Any]]) -> list[Any]:
        import ray

        calls = [getattr(shard, method).remote(*args) for shard, args in zip(self.shards, per_shard, strict=True)
                 if args is not None]
        try:
            return list(await asyncio.gather(*calls))
        except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as exc:
            raise Unavailable(f"a shard is unavailable ({type(exc).__name__}); nothing of this request was "
                              "acknowledged; retry shortly") from None
        except ray.exceptions.RayTaskError as exc:  # a shard's own error (a full disk: NoSpace), without Ray's traceback
            if isinstance(exc.cause, LogError):
                raise exc.cause from None
            raise

    async def _lookup(self, prints: Fingerprints) -> list[tuple[str | None, list[tuple[str, float]]]]:
        answers = await self._call("lookup", [(prints.digests, prints.signatures, prints.bands)] * len(self.shards))
        merged = []
        for i in range(len(prints.digests)):
            exact = next((a[i][0] for a in answers if a[i][0] is not None), None)
            near = sorted((pair for a in answers for pair in a[i][1]), key=lambda pair: -pair[1])
            merged.append((exact, near[:MAX_NEAR_DUPLICATES]))
        return merged

    async def handle(self, docs: Sequence[Doc], add: bool) -> list[dict[str, Any]]:
        prints = await fingerprints(self.hasher, self.params, docs)
        ids = [d.doc_id if d.doc_id is not None else digest for d, digest in zip(docs, prints.digests, strict=True)]
        if not add:
            found = await self._lookup(prints)
            results = [verdict(i, h, False, exact, near) for i, h, (exact, near) in zip(ids, prints.digests, found,
                                                                                        strict=True)]
            self.counters.count(results)
            return results
        async with self._add_lock:
            found = await self._lookup(prints)
            results, new = self._decide(docs, ids, prints, found)
            home = home_shard([prints.digests[i] for i in new], len(self.shards)) if new else np.zeros(0, np.int64)
            records: list[list[Any]] = [[] for _ in self.shards]
            for i, k in zip(new, home.tolist(), strict=True):
                records[k].append((ids[i], prints.digests[i], len(docs[i].text), prints.signatures[i]))
            await self._call("insert", [(r,) if r else None for r in records])
            self._documents += len(new)
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
