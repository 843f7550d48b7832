"""One partition's side of the hub (:mod:`gristmill.crawlers.hub`): links out and in, status, the stop.

Why apart from the crawl loop: the fetch loop (:mod:`gristmill.crawlers.fetch_loop`) fetches and stores
whatever its frontier holds; what a partition adds is talking to the others, and this object is all
of it: it hands the frontier's outbox to the hub, admits the links handed to it (through the
crawl's :mod:`gristmill.crawlers.admission`, passed in), reports idle or busy with an epoch, and says when the
coordinator has stopped the crawl. Links taken from the hub are acknowledged only after they are
admitted and the partition has reported itself busy (so the coordinator never sees them gone while
the partition looks idle), and with the state on a store only after the next checkpoint holds them.
Every call goes through the partition's :class:`~gristmill.crawlers.hub.Incarnation`, so a zombie's is
refused (:class:`~gristmill.crawlers.hub.Fenced`); on the fetch loop's path (:meth:`swap`,
:meth:`report`) the refusal has halted the crawl already, and this side then says nothing more.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .frontier import Frontier
from .hub import Fenced, Incarnation
from .partitions import ExchangeError, Link

HEARTBEAT_S = 0.5  # an idle partition renews its status this often (the coordinator's proof it lives)


class PartitionExchange:
    """What a partition's ``incarnation`` says to and takes from the hub; ``admit`` takes one received
    link inside the frontier transaction; ``deferred``: acknowledge received links only at checkpoints."""

    def __init__(self, incarnation: Incarnation, frontier: Frontier, admit: Callable[[Link], None],
                 on_error: Callable[[str], None], deferred: bool) -> None:
        self.hub, self.frontier = incarnation, frontier
        self.admit, self.on_error, self.deferred = admit, on_error, deferred
        self._unacknowledged: list[Any] = []  # links taken and admitted since the last checkpoint
        self._epoch = 0  # bumped whenever this partition gets work: the coordinator's proof of quiet
        self._reported_idle: bool | None = None
        self._reported_at = 0.0

    def join(self) -> None:
        """At start (the incarnation has joined, so links taken before a restart and never acknowledged
        come again): report busy; :class:`Fenced` if a newer incarnation joined meanwhile."""
        self._report(idle=False)

    def swap(self) -> bool:
        """Hand the outbox over, then admit what was handed to this partition; whether any arrived
        (False once fenced)."""
        try:
            return self._swap()
        except Fenced:
            return False

    def _swap(self) -> bool:
        while rows := self.frontier.outbox():
            by_destination: dict[int, list[Link]] = {}
            for _id, destination, *link in rows:
                by_destination.setdefault(destination, []).append(Link(*link))
            for destination, links in by_destination.items():
                self.hub.post(destination, links, rows[-1][0])
            self.frontier.handed_over(rows[-1][0])
        token, links = self.hub.take()
        if not token:
            return False
        with self.frontier.transaction():
            for link in links:
                if isinstance(link, ExchangeError):
                    self.on_error(str(link))
                else:
                    self.admit(link)
        self._report(idle=False)
        if self.deferred:
            self._unacknowledged.append(token)
        else:
            self.hub.acknowledge(token)
        return True

    def checkpointing(self) -> list[Any]:
        """Before a checkpoint's copy begins: the links it will hold (every one taken so far was admitted
        in a transaction the copy includes); give them to :meth:`checkpointed` after it, or back to
        :meth:`not_checkpointed` if it failed."""
        taken, self._unacknowledged = self._unacknowledged, []
        return taken

    def checkpointed(self, taken: list[Any]) -> None:
        for token in taken:
            self.hub.acknowledge(token)

    def not_checkpointed(self, taken: list[Any]) -> None:
        self._unacknowledged[:0] = taken

    def report(self, idle: bool) -> None:
        """Tell the coordinator whether this partition is idle (nothing, once fenced)."""
        try:
            self._report(idle)
        except Fenced:
            return

    def _report(self, idle: bool) -> None:
        """Every busy report is a new epoch, and an idle one is renewed every :data:`HEARTBEAT_S` (a
        dead partition's status goes stale)."""
        now = time.time()
        if idle and self._reported_idle and now - self._reported_at < HEARTBEAT_S:
            return
        self._epoch += not idle
        self._reported_idle, self._reported_at = idle, now
        self.hub.report(idle, f"{os.getpid()}:{self._epoch}")

    def stopped(self) -> bool:
        """Whether the coordinator has found every partition idle and ended the crawl."""
        return self.hub.stopped()
