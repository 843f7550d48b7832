"""Host partitions: which partition owns a host, and the durable outboxes that carry links between them.

Why registered domains: politeness, robots.txt and the frontier are per host, so a host must belong
to exactly one partition; hashing the registered domain (``bbc.co.uk`` for ``www.bbc.co.uk``, from
the public suffix list bundled with ``tldextract``, never fetched) also keeps a site's subdomains,
which usually share servers, in one partition. Hosts the list does not know (``*.test``, IP
literals) are keyed by themselves; an IP literal with its port, since the crawler's unit of
politeness is the origin.

Why files: a link to another partition's host is first written to the source's frontier, in the
same transaction as the page that found it (so a crash loses nothing); at its next commit the source
moves them into one file per destination under ``exchange/to-<dst>/``, written whole under a unique
name. The owner admits a file's links in one transaction and only then deletes it: a crash in
between re-admits links that are already seen, which changes nothing.
"""

from __future__ import annotations

import ipaddress
import json
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import xxhash

from gristmill.pipeline.format import open_fs

from .state import is_remote, local_folder
from .urls import BadURL, host_of, normalize_url, origin_of

EXCHANGE = "exchange"
LAYOUT_FILE = "partitions.json"


@lru_cache(maxsize=1)
def _suffix_list():  # type: ignore[no-untyped-def]
    import tldextract

    # suffix_list_urls=() and no cache folder: the snapshot inside the package, no network, no disk.
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, include_psl_private_domains=True)


def partition_key(url: str) -> str:
    """What decides a URL's partition: its registered domain, else its host (an IP with its port)."""
    return _origin_key(origin_of(url))


@lru_cache(maxsize=65536)
def _origin_key(origin: str) -> str:
    host = host_of(origin + "/")
    try:
        ipaddress.ip_address(host)
        return origin.split("//", 1)[1]
    except ValueError:
        pass
    return _suffix_list()(host).top_domain_under_public_suffix or host


def partition_of(url: str, count: int, dealt: Mapping[str, int] | None = None) -> int:
    """The partition (0..count-1) that owns ``url``'s host: the one its key was dealt to (see
    :func:`deal`), else the hash of its key."""
    if count <= 1:
        return 0
    key = partition_key(url)
    owner = dealt.get(key) if dealt else None
    return owner if owner is not None else xxhash.xxh64_intdigest(key.encode()) % count


def deal(seeds: Iterable[str], count: int, earlier: Mapping[str, int] | None = None) -> dict[str, int]:
    """The seeds' keys dealt round-robin over ``count`` partitions (in sorted order, so every process
    deals alike); keys dealt by an ``earlier`` run keep their owner, new ones are hashed.

    Why: a hash splits a few sites unevenly (16 equal sites over 2 partitions came out 10 and 6, and
    the larger partition then ran alone on one core), while the seeds' sites are known at the start;
    dealing them splits their number evenly. Sites found later are hashed, which evens out over many.
    A re-run keeps the first run's deal: a host's owner may never change (a new seed's host may
    already be queued at its hash's owner).
    """
    if earlier is not None:
        return dict(earlier)
    keys = set()
    for seed in seeds:
        try:
            keys.add(partition_key(normalize_url(seed)))
        except BadURL:
            continue  # the crawler reports it
    return {key: number % count for number, key in enumerate(sorted(keys))}


@dataclass(frozen=True)
class Link:
    """A URL on its way to the partition that owns its host, with what admission needs to know."""

    url: str
    depth: int
    kind: int
    via: str | None
    hops: int
    scoped: bool


class ExchangeError(ValueError):
    """A file in an inbox that is not what a partition wrote; the message names the file and line."""


def _link_from_json(line: str, where: str) -> Link:
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise ExchangeError(f"{where}: not JSON ({exc})") from None
    if not isinstance(data, list) or len(data) != 6:
        raise ExchangeError(f"{where}: expected [url, depth, kind, via, hops, scoped]")
    url, depth, kind, via, hops, scoped = data
    if not (isinstance(url, str) and url.startswith(("http://", "https://")) and "/" in url.split("//", 1)[1]
            and type(depth) is int and depth >= 0 and kind in (0, 1) and (via is None or isinstance(via, str))
            and type(hops) is int and hops >= 0 and isinstance(scoped, bool)):
        raise ExchangeError(f"{where}: malformed link {line[:200]!r}")
    return Link(url, depth, kind, via, hops, scoped)


class Exchange:
    """One partition's view of the exchange folder: its outboxes to the others and its inbox."""

    def __init__(self, root: str, index: int, count: int) -> None:
        self.root = root
        self.index = index
        self.count = count
        self.inbox = os.path.join(root, EXCHANGE, f"to-{index}")
        for destination in range(count):
            folder = os.path.join(root, EXCHANGE, f"to-{destination}")
            os.makedirs(folder, exist_ok=True)
            for name in os.listdir(folder):  # half-written by this partition before a crash: never posted
                if name.startswith(f"from-{index}-") and name.endswith(".tmp"):
                    os.remove(os.path.join(folder, name))

    def post(self, destination: int, links: list[Link], last_id: int) -> str:
        """Write ``links`` for ``destination`` as one file that appears whole (temp name, then rename)."""
        name = f"from-{self.index}-{last_id:016d}-{uuid.uuid4().hex[:8]}.jsonl"
        path = os.path.join(self.root, EXCHANGE, f"to-{destination}", name)
        temporary = path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as handle:
            for link in links:
                handle.write(json.dumps([link.url, link.depth, link.kind, link.via, link.hops, link.scoped]) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        return path

    def received(self) -> list[str]:
        """Files waiting in this partition's inbox, oldest name first."""
        return sorted(os.path.join(self.inbox, name) for name in os.listdir(self.inbox) if name.endswith(".jsonl"))

    @staticmethod
    def read(path: str) -> Iterator[Link | ExchangeError]:
        """The links of one inbox file; a bad line yields an error naming file and line, the rest go on."""
        with open(path, encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, 1):
                if not line.strip():
                    continue
                try:
                    yield _link_from_json(line, f"{path}:{number}")
                except ExchangeError as exc:
                    yield exc



def _layout_path(root: str) -> str:
    return root.rstrip("/") + "/" + LAYOUT_FILE if "://" in root else os.path.join(root, LAYOUT_FILE)


def read_layout(root: str, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The partition layout of a crawl's state folder or URL (``{"partitions": K, "dealt": {key: owner}}``),
    None when it has none; ValueError naming the file when it is not one a crawl wrote."""
    path = _layout_path(root)
    fs, where = open_fs(path, storage_options)
    try:
        with fs.open(where, "rb") as handle:
            layout = json.loads(handle.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        layout = None
    count = layout.get("partitions") if isinstance(layout, dict) else None
    dealt = layout.get("dealt", {}) if isinstance(layout, dict) else None
    if type(count) is not int or count < 1 or not isinstance(dealt, dict) or not all(
            isinstance(key, str) and type(owner) is int and 0 <= owner < count for key, owner in dealt.items()):
        raise ValueError(f"{path}: not a partition layout (expected partitions and dealt owners); it belongs to "
                         "the crawl's state, so resume with the state a crawl wrote or start a new output")
    return {"partitions": count, "dealt": dealt}


def write_layout(root: str, layout: dict[str, Any], storage_options: Mapping[str, Any] | None = None) -> None:
    """Record the partition layout in the crawl's state folder or URL (one whole write)."""
    if "://" not in root:
        write_json(_layout_path(root), layout)
        return
    fs, where = open_fs(_layout_path(root), storage_options)
    fs.pipe_file(where, json.dumps(layout).encode())


def write_json(path: str, value: object) -> None:
    """Replace a small JSON file whole (readers see the old or the new one, never half)."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(value, handle)
    os.replace(temporary, path)


def read_json(path: str) -> object | None:
    """A small JSON file, or None when it is missing or not JSON (a reader never trusts it further)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class Partition:
    """Which partition a crawler is (``index`` of ``count``), the crawl's state (a local folder every
    partition sees, or a URL on a store), and the seeds' keys dealt to partitions (:func:`deal`)."""

    index: int
    count: int
    state: str
    dealt: Mapping[str, int] = field(default_factory=dict)

    def owner(self, url: str) -> int:
        """The partition owning ``url``'s host."""
        return partition_of(url, self.count, self.dealt)

    @property
    def folder(self) -> str:
        """The folder of this partition's frontier on the node it runs on (evaluated there)."""
        return os.path.join(local_folder(self.state), f"p{self.index}")

    @property
    def checkpoint(self) -> str | None:
        """Where this partition's frontier is checkpointed, when its folder is not durable itself."""
        return self.state.rstrip("/") + f"/p{self.index}" if is_remote(self.state) else None

    @property
    def shard_prefix(self) -> str:
        return f"crawl-p{self.index}"
