"""``crawl()``: one crawler, or K partitions under a coordinator, chosen by ``partitions``.

Why a module of its own: the crawler (:mod:`gristmill.crawlers.crawler`) knows nothing of partitions
running beside it, and the coordinator (:mod:`gristmill.crawlers.partitioned`) starts crawlers; the
entry point that picks one of them sits above both, so neither imports the other's caller.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

from .config import CrawlConfig, CrawlSummary
from .crawler import Crawler, run_until_signalled
from .oracle import DuplicateOracle
from .output import check_output_folder
from .partitioned import Coordinator, PartitionLauncher, check_partitions
from .state import check_state_url, state_url

log = logging.getLogger("gristmill.crawl")


def crawl(seeds: list[str], output: str, config: CrawlConfig | None = None, *,
          on_progress: Callable[[dict[str, Any]], None] | None = None, oracle: DuplicateOracle | None = None,
          launcher: PartitionLauncher | None = None, **options: Any) -> CrawlSummary:
    """Crawl ``seeds`` (page or sitemap URLs) into the corpus folder ``output``; re-running resumes.

    Options are :class:`CrawlConfig` fields, e.g. ``crawl(seeds, "out", allow_networks=["127.0.0.0/8"])``.
    With an ``oracle`` (:mod:`gristmill.crawlers.oracle`), pages whose text it already holds are not stored.
    SIGINT and SIGTERM stop the crawl gracefully (in-flight pages finish, results are committed; a
    second signal cancels the pages in flight). After SIGTERM the summary is returned; after SIGINT
    (Ctrl-C) :class:`KeyboardInterrupt` is raised once everything is committed, as Python code
    expects of Ctrl-C, and the crawl resumes when run again.
    With ``partitions=K`` (K > 1) the crawl runs as K partitions (:mod:`gristmill.crawlers.partitioned`), local
    processes unless a ``launcher`` runs them elsewhere (``gristmill crawl --ray-address``: Ray
    actors); ``on_progress`` then gets the partitions' reports added up.
    """
    cfg = config or CrawlConfig(**options)
    check_output_folder(output, cfg.storage_options)  # before any state is made
    state = state_url(output, cfg.state_dir)
    check_state_url(state, cfg.storage_options, cfg.partitions)
    check_partitions(state, cfg.partitions, cfg.storage_options)
    if cfg.partitions > 1:
        merged, received = Coordinator(seeds, output, cfg, oracle, launcher, on_progress).run()
        summary = CrawlSummary(**merged)
    else:
        summary, received = run_until_signalled(Crawler(seeds, output, cfg, on_progress, oracle))
    if signal.SIGINT in received:
        log.warning("interrupted: %d documents stored in %s so far, %d URLs still queued; everything "
                    "finished is committed", summary.documents, output, summary.queued)
        raise KeyboardInterrupt
    if received:
        summary.stopped_by = received[0].name
    return summary
