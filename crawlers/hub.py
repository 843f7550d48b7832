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
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any, Protocol

from .partitions import Exchange, ExchangeError, Link, read_json, write_json

Taken = tuple[Any, list["Link | ExchangeError"]]  # (what to acknowledge, the links and bad lines)


class Hub(Protocol):
    """What partitions call (report ... stopped) and what the coordinator calls (join ... finish)."""

    def report(self, index: int, idle: bool, epoch: str) -> None: ...

    def progress(self, index: int, report: dict[str, Any]) -> None: ...

    def publish(self, index: int, segment: dict[str, Any]) -> None: ...

    def post(self, sender: int, destination: int, links: list[Link], last_id: int) -> None: ...

    def take(self, index: int) -> Taken: ...

    def acknowledge(self, index: int, token: Any) -> None: ...

    def stopped(self) -> bool: ...

    def join(self, index: int) -> None: ...

    def begin(self) -> None: ...

    def statuses(self, indexes: Iterable[int]) -> dict[int, dict[str, Any]]: ...

    def reports(self) -> list[dict[str, Any]]: ...

    def segments(self) -> tuple[Any, list[dict[str, Any]]]: ...

    def waiting(self, indexes: Iterable[int]) -> int: ...

    def finish(self) -> None: ...


class MemoryHub:
    """The hub as one object in memory (a Ray actor on a cluster); status times are its own clock's."""

    def __init__(self) -> None:
        self._status: dict[int, dict[str, Any]] = {}
        self._reports: dict[int, dict[str, Any]] = {}
        self._segments: dict[int, dict[str, Any]] = {}
        self._version = 0
        self._inbox: dict[int, list[tuple[int, list[Link]]]] = {}  # destination -> (number, links), oldest first
        self._taken: dict[int, int] = {}  # destination -> the highest number it took
        self._posted = 0
        self._done = False

    def report(self, index: int, idle: bool, epoch: str) -> None:
        self._status[index] = {"idle": idle, "epoch": epoch, "at": time.time()}

    def progress(self, index: int, report: dict[str, Any]) -> None:
        self._reports[index] = report

    def publish(self, index: int, segment: dict[str, Any]) -> None:
        self._segments[index] = segment
        self._version += 1

    def post(self, sender: int, destination: int, links: list[Link], last_id: int) -> None:
        self._posted += 1
        self._inbox.setdefault(destination, []).append((self._posted, links))

    def take(self, index: int) -> Taken:
        after = self._taken.get(index, 0)
        batches = [(number, links) for number, links in self._inbox.get(index, []) if number > after]
        if not batches:
            return None, []
        self._taken[index] = batches[-1][0]
        return batches[-1][0], [link for _number, links in batches for link in links]

    def acknowledge(self, index: int, token: Any) -> None:
        self._inbox[index] = [(number, links) for number, links in self._inbox.get(index, []) if number > token]

    def stopped(self) -> bool:
        return self._done

    def join(self, index: int) -> None:
        """A partition (re)starts: forget its status, and give it again what it took and did not acknowledge."""
        self._status.pop(index, None)
        self._taken.pop(index, None)

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
    ``p<i>/progress.json``, ``p<i>/segment.json``, ``exchange/to-<i>/`` and ``done``."""

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

    def report(self, index: int, idle: bool, epoch: str) -> None:
        write_json(self._file(index, "status.json"), {"idle": idle, "epoch": epoch, "at": time.time()})

    def progress(self, index: int, report: dict[str, Any]) -> None:
        write_json(self._file(index, "progress.json"), report)

    def publish(self, index: int, segment: dict[str, Any]) -> None:
        write_json(self._file(index, "segment.json"), segment)

    def post(self, sender: int, destination: int, links: list[Link], last_id: int) -> None:
        self._exchange(sender).post(destination, links, last_id)

    def take(self, index: int) -> Taken:
        files = self._exchange(index).received()
        return files, [link for path in files for link in Exchange.read(path)]

    def acknowledge(self, index: int, token: Any) -> None:
        for path in token or ():
            os.remove(path)

    def stopped(self) -> bool:
        return os.path.exists(os.path.join(self.root, "done"))

    def join(self, index: int) -> None:
        os.makedirs(os.path.join(self.root, f"p{index}"), exist_ok=True)
        status = self._file(index, "status.json")
        if os.path.exists(status):
            os.remove(status)  # a status left by a dead process must not count as idle
        self._exchanges.pop(index, None)

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
