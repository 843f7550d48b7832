"""What a crawl is told (:class:`CrawlConfig`) and what it reports (:class:`CrawlSummary`).

Why a module of its own: the crawler, its partitions, the page processor and the commit loop all
read the same settings, and the command line builds them; none of them should need the crawler to
know what a setting is.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .proxies import ProxySpec

_NON_NEGATIVE = ("min_delay", "max_delay", "crawl_delay_cap", "max_retries", "max_depth", "max_redirects",
                 "max_body_bytes", "max_decompressed_bytes", "connect_timeout", "read_timeout",
                 "total_timeout", "extract_timeout", "extract_buffer_bytes", "commit_every", "commit_interval")


@dataclass
class CrawlConfig:
    """Every knob of a crawl; the defaults are polite (see docs/CRAWL.md for each)."""

    user_agent: str = "gristmill/0.1 (+https://github.com/gristmill/gristmill)"
    robots_agent: str = "gristmill"
    obey_robots: bool = True
    robots_ttl: float = 24 * 3600.0
    robots_error_ttl: float = 60.0
    robots_sitemaps: bool = True
    concurrency: int = 64
    per_host_concurrency: int = 2
    min_delay: float = 1.0
    max_delay: float = 60.0
    crawl_delay_cap: float = 30.0
    adaptive: bool = True
    target_host_concurrency: float = 1.0
    max_retries: int = 3
    backoff_base: float = 1.0
    backoff_cap: float = 120.0
    max_retry_after: float = 300.0
    park_after: int = 10
    max_depth: int = 10
    max_url_length: int = 2048
    max_pages_per_host: int = 100_000
    max_pages: int | None = None
    max_redirects: int = 5
    follow: str = "same-host"
    max_body_bytes: int = 10 * 1024 * 1024
    max_decompressed_bytes: int = 40 * 1024 * 1024
    connect_timeout: float = 10.0
    read_timeout: float = 20.0
    total_timeout: float = 60.0
    allow_private: bool = False
    allow_networks: tuple[str, ...] = ()
    host_map: Mapping[str, str] = field(default_factory=dict)
    proxies: tuple[ProxySpec, ...] = ()
    proxy_routes: Mapping[str, str] = field(default_factory=dict)
    proxy_ban_after: int = 3
    proxy_cooldown: float = 300.0
    proxy_health_url: str | None = None
    proxy_health_interval: float = 30.0
    extract: bool = True
    extract_workers: int = os.cpu_count() or 1  # the event loop needs little CPU; extraction takes it all
    extract_timeout: float = 30.0
    extract_buffer_bytes: int = 64 * 1024 * 1024  # HTML waiting for an extraction worker, all pages together
    warc: bool = False
    commit_every: int = 1000
    commit_interval: float = 30.0
    shard_bytes: int = 256 * 1024 * 1024
    row_group_bytes: int = 4 * 1024 * 1024
    state_dir: str | None = None
    synchronous: str = "NORMAL"
    progress_interval: float = 10.0
    retry_parked: bool = False
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    partitions: int = 1  # crawler processes, each owning the hosts whose registered domain hashes to it

    def __post_init__(self) -> None:
        """Refuse bad settings here, before a crawl creates any state."""
        if self.follow not in ("same-host", "any"):
            raise ValueError(f"follow must be 'same-host' or 'any', not {self.follow!r}")
        if self.partitions < 1:
            raise ValueError(f"partitions must be at least 1, not {self.partitions}")
        if self.per_host_concurrency < 1 or self.concurrency < 1:
            raise ValueError("concurrency and per_host_concurrency must be at least 1")
        if self.max_pages is not None and self.max_pages < 1:
            raise ValueError(f"max_pages must be at least 1, not {self.max_pages}")
        for name in _NON_NEGATIVE:
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, not {getattr(self, name)}")
        self.allow_networks = tuple(self.allow_networks)
        for network in self.allow_networks:  # ValueError: "'x' does not appear to be an IPv4 or IPv6 network"
            ipaddress.ip_network(network, strict=False)
        for address in self.host_map.values():
            ipaddress.ip_address(address)
        self.proxies = tuple(ProxySpec.parse(p) if isinstance(p, str) else p for p in self.proxies)


@dataclass
class CrawlSummary:
    """What a crawl did; ``outcomes`` covers every URL ever admitted (all runs), and
    ``outcome_examples`` gives one full outcome (with its URL and reason) of each kind that has one."""

    output: str
    documents: int
    fetched_this_run: int
    requests: int
    bytes: int
    elapsed_s: float
    pages_per_s: float
    status_counts: dict[str, int]
    outcomes: dict[str, int]
    queued: int
    parked_hosts: dict[str, str]
    hosts: dict[str, dict[str, Any]]
    proxies: list[dict[str, Any]]
    errors: list[str]
    outcome_examples: dict[str, str] = field(default_factory=dict)
    dedup_service: dict[str, int] = field(default_factory=dict)  # checked / duplicates / errors
    stopped_by: str | None = None  # "SIGTERM" when a signal ended the crawl before its frontier was empty

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
