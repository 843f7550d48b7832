"""A crawl's durable side: where its frontier lives, its commits into shards, its checkpoints.

Why apart from the fetch loop: what a crawl fetches goes into the frontier and nowhere else; turning
that into something that outlives the process (the frontier's folder, its checkpoint on a store, the
commit loop writing shards and publishing their listing, in :mod:`gristmill.crawlers.commits` and
:mod:`gristmill.crawlers.state`) is one job with its own order of steps, and this object is all of it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from .commits import SHARD_PREFIX, CommitLoop, Committer
from .config import CrawlConfig
from .exchange import PartitionExchange
from .frontier import Frontier, ResultLog
from .hub import Fenced, Hub, Incarnation
from .partitions import Partition
from .state import STATE_FILE, Checkpoint, is_remote, local_folder, state_url

log = logging.getLogger("gristmill.crawl")


class Persistence:
    """The frontier of a crawl into ``output`` (a partition's own, checkpointed to the store when its
    state is remote), opened at once so URLs can be enqueued before the crawl runs; :meth:`start`
    begins committing, :meth:`close` ends it.

    A partition joins its hub here, before its frontier is restored: the join fences every earlier
    incarnation, so none can have a newer checkpoint accepted than the one restored."""

    def __init__(self, output: str, config: CrawlConfig, partition: Partition | None, hub: Hub | None) -> None:
        self.output = output
        self.config = config
        self.partition = partition
        if partition is not None:
            folder, durable = partition.folder, partition.checkpoint
        else:
            durable = state_url(output, config.state_dir)
            folder = local_folder(durable)
            durable = durable if is_remote(durable) else None
        os.makedirs(folder, exist_ok=True)
        self.state_path = os.path.join(folder, STATE_FILE)
        self.checkpoint = Checkpoint(durable, config.storage_options) if durable is not None else None
        self.incarnation: Incarnation | None = None
        if hub is not None and partition is not None:
            self.incarnation = Incarnation(hub, partition.index, self.checkpoint.latest if self.checkpoint else 0)
            if self.checkpoint is not None:
                self.checkpoint.begin(self.incarnation.generation, self.incarnation.accepted,
                                      self.incarnation.checkpointed)
        self.frontier = Frontier(self.state_path, config.synchronous,
                                 restore=self.checkpoint.restore if self.checkpoint is not None else None)
        self.exchange: PartitionExchange | None = None

    def start(self, exchange: PartitionExchange | None, on_error: Callable[[str], None]) -> CommitLoop:
        """The commit loop of this run (a partition's ``exchange`` hands its links over before each
        commit and has them acknowledged after each checkpoint); orphan shards of a crash are removed
        after the exchange has joined, as before the cut."""
        cfg, part = self.config, self.partition
        self.exchange = exchange
        self.results = ResultLog(self.state_path, cfg.synchronous)
        self.committer = Committer(self.output, self.results, shard_bytes=cfg.shard_bytes,
                                   row_group_bytes=cfg.row_group_bytes, warc=cfg.warc,
                                   storage_options=cfg.storage_options,
                                   prefix=part.shard_prefix if part else SHARD_PREFIX,
                                   segment=self.incarnation.publish if self.incarnation else None,
                                   checkpoint=self._checkpoint if self.checkpoint is not None else None)
        commits = CommitLoop(self.committer, self.frontier, cfg, on_error,
                             exchange.swap if exchange is not None else None)
        if exchange is not None:
            exchange.join()  # Fenced here, before deleting anything, if a newer incarnation joined already
        for orphan in self.committer.remove_orphans():
            log.info("removed %s: written by an interrupted commit, never listed by a manifest", orphan)
        return commits

    def _checkpoint(self) -> None:
        """Save the frontier to the store (in the commit's thread), then acknowledge the links it holds."""
        assert self.checkpoint is not None
        taken = self.exchange.checkpointing() if self.exchange is not None else []
        try:
            self.checkpoint.save(self.state_path)
        except BaseException:
            if self.exchange is not None:
                self.exchange.not_checkpointed(taken)
            raise
        if self.exchange is not None:
            self.exchange.checkpointed(taken)

    @property
    def fenced(self) -> Fenced | None:
        """The hub's refusal of this partition's calls (a newer incarnation joined), if it came."""
        return self.incarnation.fenced if self.incarnation is not None else None

    def close(self) -> None:
        """Close the frontier; a checkpointed one's local copy goes (a restart starts from the store's)."""
        self.frontier.close()
        self.results.close()
        if self.checkpoint is not None:
            self.checkpoint.close()
            self.checkpoint.discard(self.state_path)
