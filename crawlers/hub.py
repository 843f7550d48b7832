"""How a crawl's partitions and their coordinator talk: status, progress, segments, links, the stop.

Why an interface with two implementations: partitions on one machine share its disk, and files
(:class:`FolderHub`) survive the coordinator's death for a rerun to find; partitions on a cluster
share no disk, so there they talk to one object all of them reach through calls
(:class:`MemoryHub`, which the top floor runs as a Ray actor: ``crawlers/`` does not import Ray).

Links between partitions are handed over at least once: the sender marks them handed over in its
frontier only after :meth:`Hub.post` returned; the receiver :meth:`Hub.take`s them, admits them,
and :meth:`Hub.acknowledge`s them once they are durable (at once on a local frontier, after the
next checkpoint on a store); until then they stay in the hub and are taken again by a partition
that :meth:`Hub.join`s after a restart. A link taken twice is admitted once (the frontier's seen set).

Why generations: on a cluster a partition whose node was cut off (not dead) is restarted elsewhere
while its old incarnation, a zombie, may still run; without a fence both publish segments, take and
acknowledge links and checkpoint the same frontier, so pages are lost or stored twice. Each
:meth:`Hub.join` gives the partition a new generation (above any the caller found on the store), and
every call that changes shared state carries it: :class:`MemoryHub` refuses a stale one with
:class:`Fenced`, and :class:`Incarnation` (the partition's side) then stops its crawl. The hub also
records the checkpoint it last accepted from the current generation, the one a restart restores.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .partitions import Exchange, ExchangeError, Link, read_json, write_json
from .state import Fenced

log = logging.getLogger("gristmill.crawl")
Taken = tuple[Any, list["Link | ExchangeError"]]  # (what to acknowledge, the links and bad lines)
Joined = tuple[int, "str | None"]  # (the new generation, the name of the checkpoint last accepted)


class Hub(Protocol):
    """What partitions call (report ... checkpointed, each with the generation :meth:`join` gave them),
    what both call (join), and what the coordinator calls (begin ... finish)."""

    def report(self, index: int, generation: int, idle: bool, epoch: str) -> None: ...

    def progress(self, index: int, generation: int, report: dict[str, Any]) -> None: ...

    def publish(self, index: int, generation: int, segment: dict[str, Any]) -> None: ...

    def post(self, sender: int, generation: int, destination: int, links: list[Link], last_id: int) -> None: ...

    def take(self, index: int, generation: int) -> Taken: ...

    def acknowledge(self, index: int, generation: int, token: Any) -> None: ...

    def checkpointed(self, index: int, generation: int, name: str) -> None: ...

    def stopped(self) -> bool: ...

    def join(self, index: int, stored: int = 0) -> Joined: ...

    def begin(self) -> None: ...

    def statuses(self, indexes: Iterable[int]) -> dict[int, dict[str, Any]]: ...

    def reports(self) -> list[dict[str, Any]]: ...

    def segments(self) -> tuple[Any, list[dict[str, Any]]]: ...

    def waiting(self, indexes: Iterable[int]) -> int: ...

    def finish(self) -> None: ...


class MemoryHub:
    """The hub as one object in memory (a Ray actor on a cluster); status times are its own clock's.
    It is the authority on generations: a call from any but a partition's latest is :class:`Fenced`."""

    def __init__(self) -> None:
        self._generations: dict[int, int] = {}  # partition -> its current generation
        self._accepted: dict[int, str] = {}  # partition -> the checkpoint last accepted from it
        self._status: dict[int, dict[str, Any]] = {}
        self._reports: dict[int, dict[str, Any]] = {}
        self._segments: dict[int, dict[str, Any]] = {}
        self._version = 0
        self._inbox: dict[int, list[tuple[int, list[Link]]]] = {}  # destination -> (number, links), oldest first
        self._taken: dict[int, int] = {}  # destination -> the highest number it took
        self._posted = 0
        self._done = False

    def _current(self, index: int, generation: int) -> None:
        """Refuse (:class:`Fenced`) a call from anything but partition ``index``'s current generation."""
        current = self._generations.get(index, 0)
        if generation != current:
            raise Fenced(index, generation, current)

    def report(self, index: int, generation: int, idle: bool, epoch: str) -> None:
        self._current(index, generation)
        self._status[index] = {"idle": idle, "epoch": epoch, "at": time.time()}

    def progress(self, index: int, generation: int, report: dict[str, Any]) -> None:
        self._current(index, generation)
        self._reports[index] = report

    def publish(self, index: int, generation: int, segment: dict[str, Any]) -> None:
        self._current(index, generation)
        self._segments[index] = segment
        self._version += 1

    def post(self, sender: int, generation: int, destination: int, links: list[Link], last_id: int) -> None:
        self._current(sender, generation)
        self._posted += 1
        self._inbox.setdefault(destination, []).append((self._posted, links))

    def take(self, index: int, generation: int) -> Taken:
        self._current(index, generation)
        after = self._taken.get(index, 0)
        batches = [(number, links) for number, links in self._inbox.get(index, []) if number > after]
        if not batches:
            return None, []
        self._taken[index] = batches[-1][0]
        return batches[-1][0], [link for _number, links in batches for link in links]

    def acknowledge(self, index: int, generation: int, token: Any) -> None:
        self._current(index, generation)
        self._inbox[index] = [(number, links) for number, links in self._inbox.get(index, []) if number > token]

    def checkpointed(self, index: int, generation: int, name: str) -> None:
        """Accept checkpoint ``name`` as the one a restart of partition ``index`` restores."""
        self._current(index, generation)
        self._accepted[index] = name

    def stopped(self) -> bool:
        return self._done

    def join(self, index: int, stored: int = 0) -> Joined:
        """A partition (re)starts: a new generation above the last one and above ``stored`` (the highest
        its caller found on the store, for a fresh hub), which fences every earlier one; forget its
        status, give it again what it took and did not acknowledge; and name the checkpoint to restore."""
        generation = max(self._generations.get(index, 0), stored) + 1
        self._generations[index] = generation
        self._status.pop(index, None)
        self._taken.pop(index, None)
        return generation, self._accepted.get(index)

    def begin(self) -> None:
        self._done = False
        self._reports.clear()

    def statuses(self, indexes: Iterable[int]) -> dict[int, dict[str, Any]]:
        return {index: self._status[index] for index in indexes if index in self._status}

    def reports(self) -> list[dict[str, Any]]:
        return list(self._reports.values())

    def segments(self) -> tuple[Any, list[dict[str, Any]]]:
        return self._version, list(self._segments.values())

    def waiting(self, indexes: Iterable[int]) -> int:
        return sum(1 for index in indexes for number, _ in self._inbox.get(index, [])
                   if number > self._taken.get(index, 0))

    def finish(self) -> None:
        self._done = True


class FolderHub:
    """The hub as files in the crawl's local state folder (partitions on one machine): ``p<i>/status.json``,
    ``p<i>/progress.json``, ``p<i>/segment.json``, ``exchange/to-<i>/`` and ``done``.

    Generations are given (they name checkpoints) but not checked: on one machine no zombie exists.
    The coordinator restarts a partition only once its process has ended, each frontier is held by an
    ``flock`` that the kernel drops only when its process is gone (:mod:`gristmill.crawlers.locks`),
    and partitions die with their coordinator; so two incarnations of a partition never run at once.
    """

    def __init__(self, root: str, count: int) -> None:
        self.root = root
        self.count = count
        self._exchanges: dict[int, Exchange] = {}

    def _file(self, index: int, name: str) -> str:
        return os.path.join(self.root, f"p{index}", name)

    def _exchange(self, index: int) -> Exchange:
        if index not in self._exchanges:
            self._exchanges[index] = Exchange(self.root, index, self.count)
        return self._exchanges[index]

    def report(self, index: int, generation: int, idle: bool, epoch: str) -> None:
        write_json(self._file(index, "status.json"), {"idle": idle, "epoch": epoch, "at": time.time()})

    def progress(self, index: int, generation: int, report: dict[str, Any]) -> None:
        write_json(self._file(index, "progress.json"), report)

    def publish(self, index: int, generation: int, segment: dict[str, Any]) -> None:
        write_json(self._file(index, "segment.json"), segment)

    def post(self, sender: int, generation: int, destination: int, links: list[Link], last_id: int) -> None:
        self._exchange(sender).post(destination, links, last_id)

    def take(self, index: int, generation: int) -> Taken:
        files = self._exchange(index).received()
        return files, [link for path in files for link in Exchange.read(path)]

    def acknowledge(self, index: int, generation: int, token: Any) -> None:
        for path in token or ():
            os.remove(path)

    def checkpointed(self, index: int, generation: int, name: str) -> None:
        """Nothing to record: with one writer the newest checkpoint on the store is the accepted one."""

    def stopped(self) -> bool:
        return os.path.exists(os.path.join(self.root, "done"))

    def join(self, index: int, stored: int = 0) -> Joined:
        os.makedirs(os.path.join(self.root, f"p{index}"), exist_ok=True)
        status = self._file(index, "status.json")
        if os.path.exists(status):
            os.remove(status)  # a status left by a dead process must not count as idle
        self._exchanges.pop(index, None)
        return stored + 1, None

    def begin(self) -> None:
        for stale in [os.path.join(self.root, "done")] + [self._file(i, "progress.json") for i in range(self.count)]:
            if os.path.exists(stale):
                os.remove(stale)

    def statuses(self, indexes: Iterable[int]) -> dict[int, dict[str, Any]]:
        found = {}
        for index in indexes:
            status = read_json(self._file(index, "status.json"))
            if isinstance(status, dict):
                found[index] = status
        return found

    def reports(self) -> list[dict[str, Any]]:
        reports = (read_json(self._file(index, "progress.json")) for index in range(self.count))
        return [report for report in reports if isinstance(report, dict)]

    def segments(self) -> tuple[Any, list[dict[str, Any]]]:
        paths = [self._file(index, "segment.json") for index in range(self.count)]
        stamps = {path: os.path.getmtime(path) for path in paths if os.path.exists(path)}
        segments = [segment for path in stamps if isinstance(segment := read_json(path), dict)]
        return stamps, segments

    def waiting(self, indexes: Iterable[int]) -> int:
        return sum(len(self._exchange_folder(index)) for index in indexes)

    def _exchange_folder(self, index: int) -> list[str]:
        folder = os.path.join(self.root, "exchange", f"to-{index}")
        return [name for name in os.listdir(folder) if name.endswith(".jsonl")] if os.path.isdir(folder) else []

    def finish(self) -> None:
        write_json(os.path.join(self.root, "done"), {})


class Incarnation:
    """One run of partition ``index``: it joins ``hub`` once (``stored``: the highest generation its
    checkpoint folder holds), and every call it makes that changes shared state carries the generation
    it was given. The first :class:`Fenced` refusal is kept and ``on_fenced`` told (the crawl halts);
    every later call raises it again without reaching the hub, so a zombie writes nothing more."""

    def __init__(self, hub: Hub, index: int, stored: int = 0) -> None:
        self.hub, self.index = hub, index
        self.generation, self.accepted = hub.join(index, stored)
        self.fenced: Fenced | None = None
        self.on_fenced: Callable[[Fenced], None] | None = None

    def _call(self, name: str, *args: Any) -> Any:
        if self.fenced is not None:
            raise self.fenced
        try:
            return getattr(self.hub, name)(self.index, self.generation, *args)
        except Fenced as exc:
            self.fenced = exc
            log.error("%s", exc)
            if self.on_fenced is not None:
                self.on_fenced(exc)
            raise

    def report(self, idle: bool, epoch: str) -> None:
        self._call("report", idle, epoch)

    def progress(self, report: dict[str, Any]) -> None:
        self._call("progress", report)

    def publish(self, segment: dict[str, Any]) -> None:
        self._call("publish", segment)

    def post(self, destination: int, links: list[Link], last_id: int) -> None:
        self._call("post", destination, links, last_id)

    def take(self) -> Taken:
        result: Taken = self._call("take")
        return result

    def acknowledge(self, token: Any) -> None:
        self._call("acknowledge", token)

    def checkpointed(self, name: str) -> None:
        self._call("checkpointed", name)

    def stopped(self) -> bool:
        return self.hub.stopped()
