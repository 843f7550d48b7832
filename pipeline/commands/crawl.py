"""``gristmill crawl SEEDS -o OUT``: crawl seed URLs or sitemaps into raw corpus shards; re-run to resume.

The crawler (``crawlers/``) knows nothing of the dedup service; with ``--dedup-service`` this command
plugs the service in as the crawl's duplicate oracle (:mod:`gristmill.pipeline.service.oracle`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gristmill.crawlers.config import CrawlConfig
from gristmill.pipeline.commands import options
from gristmill.pipeline.service.client import TOKEN_ENV

if TYPE_CHECKING:
    from gristmill.crawlers.config import CrawlSummary

log = logging.getLogger("gristmill.crawl")
HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node only
MAX_BODY_BYTES = CrawlConfig.max_body_bytes
USER_AGENT = CrawlConfig.user_agent

EPILOG = """exit status: 0 when the crawl holds documents (a re-run with nothing left to fetch included) or
was stopped by SIGTERM; 1 when it finished having stored nothing (stderr says why, by outcome); 2 for
bad arguments or an unreadable seed file; 130 on Ctrl-C (everything finished is committed: run the
same command again to resume)."""
# What a user can do about each outcome kind when a crawl stored nothing.
HINTS = {
    "blocked": "the address policy refused these hosts (private, loopback or reserved addresses); "
               "allow a network with --allow-network CIDR",
    "robots": "robots.txt disallows these URLs",
    "rejected": "a fetch guard refused the response (not HTML, a binary body, too large...)",
    "empty": "no main text was found; --no-extract stores the visible text instead",
    "failed": "retries ran out (network errors, 429 or 5xx)",
    "host": "their hosts were parked; --retry-parked tries them again",
    "http": "the server answered with an error status",
    "duplicate": "the dedup service already holds these documents",
    "dns": "their host names do not resolve: check them, or give an address with --resolve HOST=IP",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("seeds", help="file with one seed URL per line (# comments allowed), or '-' for stdin; "
                                       "sitemap URLs (*.xml, *.xml.gz) are expanded")
    parser.add_argument("-o", "--output", help="corpus folder, local path or fsspec URL (required, on the command "
                                                "line or in the job file)")
    parser.add_argument("--job", metavar="TOML", help="read options from this TOML file's [crawl] table (or its top "
                                                      "level); the command line wins (default: none)")
    parser.add_argument("--state-dir", help="frontier folder, or a store URL it is checkpointed to at each commit "
                                            "(default: OUTPUT/.crawl; OUTPUT/_crawl for a remote output)")
    parser.add_argument("--concurrency", type=int, default=64, help="connections overall (default: %(default)s)")
    parser.add_argument("--per-host", type=int, default=2, help="connections per host (default: %(default)s)")
    parser.add_argument("--delay", type=float, default=1.0,
                        help="minimum seconds between requests to a host (default: %(default)s)")
    parser.add_argument("--max-delay", type=float, default=60.0,
                        help="cap of the adaptive per-host delay, seconds (default: %(default)s)")
    parser.add_argument("--crawl-delay-cap", type=float, default=30.0,
                        help="cap on robots.txt Crawl-delay, seconds (default: %(default)s)")
    parser.add_argument("--no-robots", action="store_true", help="ignore robots.txt (only for your own sites)")
    parser.add_argument("--max-pages", type=int,
                        help="stop after this many documents in total, all runs (default: no limit)")
    parser.add_argument("--max-depth", type=int, default=10, help="links followed from a seed (default: %(default)s)")
    parser.add_argument("--max-pages-per-host", type=int, default=100_000,
                        help="URLs admitted per host (default: %(default)s)")
    parser.add_argument("--follow", choices=("same-host", "any"), default="same-host",
                        help="follow links only to the seeds' hosts, or anywhere (default: %(default)s)")
    parser.add_argument("--retries", type=int, default=3,
                        help="retries per URL on errors, 429 and 5xx (default: %(default)s)")
    parser.add_argument("--max-body-bytes", type=options.size, default=MAX_BODY_BYTES, metavar="SIZE",
                        help=f"largest response body, e.g. 16MiB (default: {options.format_size(MAX_BODY_BYTES)})")
    options.add_renamed(parser, "--max-body-mb", "--max-body-bytes", "max_body_bytes", convert=options.mib_to_bytes)
    parser.add_argument("--timeout", type=float, default=60.0, help="total seconds per request (default: %(default)s)")
    parser.add_argument("--no-extract", action="store_true",
                        help="store the page's visible text instead of extracted main text (faster)")
    parser.add_argument("--extract-workers", type=int, help="extraction processes (default: one per CPU)")
    parser.add_argument("--warc", action="store_true", help="also write WARC/1.1 files under OUTPUT/warc/")
    parser.add_argument("--allow-network", action="append", default=[], metavar="CIDR",
                        help="allow these private/loopback networks (e.g. 127.0.0.0/8); repeatable (default: none)")
    parser.add_argument("--resolve", action="append", default=[], metavar="HOST=IP",
                        help="resolve HOST to IP without DNS (like curl --resolve); repeatable (default: none)")
    parser.add_argument("--proxy", action="append", default=[], metavar="URL[,region=R][,hosts=GLOB|GLOB]",
                        help="add a proxy to the pool; repeatable (default: none, direct connections)")
    parser.add_argument("--route", action="append", default=[], metavar="GLOB=REGION",
                        help="send hosts matching GLOB through proxies of REGION; repeatable (default: none)")
    parser.add_argument("--retry-parked", action="store_true", help="give parked hosts another chance")
    parser.add_argument("--user-agent", help=f"User-Agent header (default: {USER_AGENT})")
    parser.add_argument("--progress", type=float, default=10.0, metavar="SECONDS",
                        help="seconds between progress lines when stderr is not a terminal (default: %(default)s)")
    options.add_output_flags(parser, json_help="print the crawl summary as JSON on stdout")
    parser.add_argument("--partitions", type=int, default=1, metavar="K",
                        help="crawler processes, each owning the hosts whose registered domain hashes to it; "
                             "a re-run must use the same K (default: %(default)s)")
    parser.add_argument("--ray-address", metavar="ADDRESS", default=os.environ.get("RAY_ADDRESS"),
                        help="run the partitions as Ray actors on this cluster (default: $RAY_ADDRESS, else "
                             "local processes); state and output on storage every node sees")
    parser.add_argument("--dedup-service", metavar="URL",
                        help=f"gristmill serve URL: skip storing documents it already has (token from {TOKEN_ENV}; "
                             "default: none)")


def _pairs(values: list[str], what: str) -> dict[str, str]:
    pairs = {}
    for value in values:
        key, sep, target = value.partition("=")
        if not sep or not key or not target:
            raise ValueError(f"{what} {value!r} is not KEY=VALUE")
        pairs[key] = target
    return pairs


def read_seeds(path: str) -> list[str]:
    """Seed URLs from a file (or stdin), one per line, blank lines and # comments ignored."""
    handle = sys.stdin if path == "-" else open(path, encoding="utf-8")  # noqa: SIM115
    try:
        return [line.strip() for line in handle if line.strip() and not line.lstrip().startswith("#")]
    finally:
        if handle is not sys.stdin:
            handle.close()


def run(args: argparse.Namespace) -> int:
    from gristmill.crawlers.locks import StateInUse
    from gristmill.crawlers.output import check_output_folder
    from gristmill.crawlers.partitioned import check_partitions
    from gristmill.crawlers.run import crawl
    from gristmill.crawlers.state import check_state_url, state_url
    from gristmill.pipeline.format import LeaseHeld
    from gristmill.pipeline.service.oracle import ServiceOracle

    try:
        if args.job:
            options.apply_job_file(args._parser, args, args.job, "crawl", args._argv)
        if not args.output:
            raise ValueError("the output folder is missing: give -o/--output (or output in the --job file)")
    except (OSError, ValueError) as exc:
        print(f"gristmill crawl: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        seeds = read_seeds(args.seeds)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"gristmill crawl: cannot read seeds from {args.seeds}: {exc}", file=sys.stderr)
        return 2
    if not seeds:
        print(f"gristmill crawl: {args.seeds} holds no seed URL", file=sys.stderr)
        return 2
    try:
        config = CrawlConfig(**_options(args))
        check_output_folder(args.output, config.storage_options)
        state = state_url(args.output, config.state_dir)
        check_state_url(state, config.storage_options, config.partitions)
        check_partitions(state, config.partitions, config.storage_options)
    except ValueError as exc:
        print(f"gristmill crawl: {exc}", file=sys.stderr)
        return 2
    oracle = ServiceOracle(args.dedup_service, os.environ.get(TOKEN_ENV) or None) if args.dedup_service else None
    launcher = None
    if args.ray_address and config.partitions > 1:
        launcher = RayLauncher(args.ray_address)
        try:  # on nodes that share no disk, a local folder only this node sees would never end the crawl
            launcher.check_folders({"-o": args.output, "--state-dir": state}, config.storage_options)
        except ValueError as exc:
            print(f"gristmill crawl: {exc}", file=sys.stderr)
            return 2
    progress = None if args.quiet else ProgressDisplay(config.max_pages)
    summary = None
    try:
        summary = crawl(seeds, args.output, config, oracle=oracle, launcher=launcher,
                        on_progress=progress.show if progress else None)
    except (StateInUse, LeaseHeld) as exc:  # another crawl owns this output's state, another job the output
        print(f"gristmill crawl: {exc}", file=sys.stderr)
        return 2
    finally:
        if progress is not None:
            progress.close(summary)
    if args.json:
        report = summary.to_dict()
        report.pop("hosts")
        report["errors"] = report["errors"][:20]
        print(json.dumps(report, indent=1))
    else:
        print(describe(summary, config.max_pages))
    if not summary.documents and not summary.stopped_by:
        print(nothing_stored(summary), file=sys.stderr)
        return 1
    if not summary.requests and not args.quiet:
        print(f"gristmill crawl: nothing left to fetch; {args.output} holds {summary.documents} documents",
              file=sys.stderr)
    return 0


class ProgressDisplay:
    """The crawl's progress on stderr: an updating bar on a terminal (documents stored, out of
    --max-pages when given), otherwise the crawler's plain line at each report (every --progress s)."""

    def __init__(self, max_pages: int | None) -> None:
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            tqdm.monitor_interval = 0  # no monitor thread: this bar is refreshed by hand, and a process
            # without threads forks its crawl partitions directly (crawlers.partitioned.ProcessLauncher)
            self.bar = tqdm(total=max_pages, unit="doc", desc="crawl: stored", file=sys.stderr, dynamic_ncols=True)

    def show(self, report: dict[str, Any]) -> None:
        if self.bar is None:
            print(report["line"], file=sys.stderr, flush=True)
            return
        self.bar.n = report["documents"]
        self.bar.set_postfix_str(f"{report['fetched']:,} pages processed, {report['waiting']:,} waiting for "
                                 f"extraction, {report['queued']:,} queued", refresh=False)
        self.bar.refresh()

    def close(self, summary: CrawlSummary | None) -> None:
        """End the bar at the crawl's final counts (the last periodic report may predate the end)."""
        if self.bar is not None:
            if summary is not None:
                self.bar.n = summary.documents
                self.bar.set_postfix_str(f"{summary.fetched_this_run:,} pages processed, {summary.queued:,} queued",
                                         refresh=False)
                self.bar.refresh()
            self.bar.close()


def describe(summary: CrawlSummary, max_pages: int | None = None) -> str:
    """The crawl summary for a person: what is stored, what this run did, and what became of every URL
    (and, when ``max_pages`` stopped it with URLs queued, how to go on: the same command would not)."""
    rate = f", {summary.pages_per_s:,.1f} pages/s" if summary.fetched_this_run else ""
    lines = [f"{summary.output}: {summary.documents:,} documents stored (all runs)",
             f"this run: {summary.fetched_this_run:,} pages processed in {summary.elapsed_s:,.1f} s{rate}, "
             f"{summary.requests:,} requests, {summary.bytes / 1e6:,.1f} MB",
             f"URLs admitted, by outcome: {_counts(summary.outcomes) or 'none'}"]
    if summary.status_counts:
        lines.append(f"responses this run, by HTTP status or error: {_counts(summary.status_counts)}")
    if summary.queued and max_pages is not None and summary.documents >= max_pages:
        lines.append(f"{summary.queued:,} URLs still queued: --max-pages {max_pages:,} is reached (all runs "
                     "count); run again with a higher --max-pages to go on")
    elif summary.queued:
        lines.append(f"{summary.queued:,} URLs still queued: run the same command again to go on")
    if summary.parked_hosts:
        lines.append(f"{len(summary.parked_hosts):,} hosts parked (--retry-parked tries them again)")
    if summary.dedup_service:
        lines.append(f"dedup service: {_counts(summary.dedup_service)}")
    if summary.errors:
        lines.append(f"{len(summary.errors):,} errors, the first: {summary.errors[0]}")
    if summary.stopped_by:
        lines.append(f"stopped by {summary.stopped_by}; everything finished is committed")
    return "\n".join(lines)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {value:,}" for key, value in sorted(counts.items(), key=lambda item: -item[1]))


class RayLauncher:
    """The crawl's partitions as Ray actors, one per node where the cluster has enough
    (crawlers.partitioned.PartitionLauncher), talking to the coordinator through a hub actor.

    Why a hub actor: nodes share no disk, so status, segments, links and the stop signal travel as
    calls to one actor (crawlers.hub.MemoryHub) on the head node (whose loss ends the cluster
    anyway), never as files. Why Ray's own restarts: when a node dies, Ray starts the actor again
    on another node and retries its crawl call, which resumes the partition from its last
    checkpoint on the store; the coordinator only sees a partition die once those retries are spent.
    The restarted actor joins the hub with a new generation, which fences the old one should its node
    come back (crawlers.hub.Fenced: it stops and writes nothing more). Why a placement group: SPREAD alone is best
    effort (two partitions landed on one node); STRICT_SPREAD puts each on its own node, and where
    the cluster has fewer nodes than partitions the launcher falls back to SPREAD and says so.
    A signal ends the actors at once (like a crash: a re-run resumes from the checkpoints).
    """

    def __init__(self, address: str | None = None, restarts: int = 3) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=address, log_to_driver=True)
        self._actor = ray.remote(max_restarts=restarts, max_task_retries=restarts)(_PartitionActor)
        self._calls: dict[int, tuple[Any, Any]] = {}
        self._group: Any = None
        self.hub: ActorHub | None = None

    def open(self, count: int, root: str) -> ActorHub:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from gristmill.crawlers.hub import MemoryHub

        nodes = [node for node in ray.nodes() if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) >= 1]
        strategy = "STRICT_SPREAD" if len(nodes) >= count else "SPREAD"
        if strategy == "SPREAD":
            log.warning("%d partitions on %d nodes with a CPU: placing them with SPREAD (some share a node)",
                        count, len(nodes))
        self._group = placement_group([{"CPU": 1}] * count, strategy=strategy)
        ray.get(self._group.ready(), timeout=120)
        head = next((node["NodeID"] for node in ray.nodes() if node.get("Alive")
                     and HEAD_RESOURCE in node.get("Resources", {})), ray.get_runtime_context().get_node_id())
        actor = ray.remote(num_cpus=0, max_restarts=0)(MemoryHub).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
        self.hub = ActorHub(actor)
        return self.hub

    def check_folders(self, writes: dict[str, str], storage_options: dict[str, Any]) -> None:
        """Refuse (ValueError, one line) a local folder of ``writes`` (flag -> path) some node does not see."""
        import ray

        from gristmill.pipeline.job.nodes import check_written_folders

        check_written_folders(ray, dict(writes), storage_options)

    def start(self, index: int, run: Callable[[], dict[str, Any]]) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=index)
        actor = self._actor.options(num_cpus=1, scheduling_strategy=strategy).remote()
        self._calls[index] = (actor, actor.run.remote(run))

    def running(self) -> set[int]:
        return set(self._calls)

    def poll(self) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
        import ray

        finished, died = {}, {}
        refs = {call: index for index, (_actor, call) in self._calls.items()}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        for ref in ready:
            index = refs[ref]
            del self._calls[index]
            try:
                finished[index] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                died[index] = f"{type(exc).__name__}: {str(exc)[:300]}"
        return finished, died

    def signal(self, number: int) -> None:
        self.close()

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor, _call in self._calls.values():
            ray.kill(actor, no_restart=True)
        self._calls.clear()
        if self._group is not None:
            remove_placement_group(self._group)
            self._group = None


class ActorHub:
    """A crawlers.hub.Hub whose calls go to a MemoryHub actor: partitions and coordinator share it
    wherever they run (it pickles as its actor handle). The actor's refusal of a stale generation
    comes back as the crawlers.hub.Fenced it raised (not wrapped), so its one-line message is kept."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or name == "actor":  # pickle's probes, and before __dict__ is back
            raise AttributeError(name)
        method = getattr(self.actor, name)

        def call(*args: Any) -> Any:
            import ray

            from gristmill.crawlers.hub import Fenced

            try:
                return ray.get(method.remote(*args))
            except ray.exceptions.RayTaskError as exc:
                if isinstance(exc.cause, Fenced):
                    raise exc.cause from None
                raise

        return call


class _PartitionActor:
    """One crawl partition on a Ray worker (the call it runs is crawlers.partitioned.run_partition)."""

    def run(self, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        return run()


def nothing_stored(summary: CrawlSummary) -> str:
    """Why a finished crawl holds no document: its outcomes by kind, each with a hint and an example."""
    lines = ["gristmill crawl: the crawl finished and stored no document"]
    for kind, count in sorted(summary.outcomes.items(), key=lambda item: -item[1]):
        hint = HINTS.get(kind)
        lines.append(f"  {count} {kind}" + (f": {hint}" if hint else ""))
        if kind in summary.outcome_examples:
            lines.append(f"    e.g. {summary.outcome_examples[kind]}")
    if not summary.outcomes:
        lines.append("  no seed URL was admitted")
    lines.extend(f"  error: {error}" for error in summary.errors[:5])
    return "\n".join(lines)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """CrawlConfig fields from the command line; ValueError names a malformed one."""
    options: dict[str, Any] = {
        "state_dir": args.state_dir, "concurrency": args.concurrency, "per_host_concurrency": args.per_host,
        "min_delay": args.delay, "max_delay": args.max_delay, "crawl_delay_cap": args.crawl_delay_cap,
        "obey_robots": not args.no_robots, "max_pages": args.max_pages, "max_depth": args.max_depth,
        "max_pages_per_host": args.max_pages_per_host, "follow": args.follow, "max_retries": args.retries,
        "max_body_bytes": args.max_body_bytes, "total_timeout": args.timeout,
        "extract": not args.no_extract, "warc": args.warc, "allow_networks": tuple(args.allow_network),
        "host_map": _pairs(args.resolve, "--resolve"), "proxies": tuple(args.proxy),
        "proxy_routes": _pairs(args.route, "--route"), "retry_parked": args.retry_parked,
        # On a terminal the bar moves every second; elsewhere a line every --progress seconds.
        "progress_interval": 1.0 if sys.stderr.isatty() else args.progress,
        "partitions": args.partitions,
    }
    if args.extract_workers:
        options["extract_workers"] = args.extract_workers
    if args.user_agent:
        options["user_agent"] = args.user_agent
    return options
