"""Generation fencing (issue 29, "one writer"): a partition restarted elsewhere while its old incarnation
still runs (its node was cut off, not dead) must not fork its state.

The hub gives every join a new generation; a call from an older one is refused (:class:`Fenced`) and
changes nothing, the zombie halts and writes nothing more, its checkpoints cannot replace the one the
hub accepted, and the new incarnation restores exactly that one: no page lost, none stored twice.
Against real parts: moto's S3 server on loopback (tests/conftest.py), a real :class:`MemoryHub`, and
the demo sites on 127.0.0.1 for a whole partition's crawl.
"""

from __future__ import annotations

import asyncio
import copy
import pickle
import posixpath
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import s3fs
from hypothesis import given, settings
from hypothesis import strategies as st

from gristmill.crawlers import crawl
from gristmill.crawlers.commits import CommitLoop, Committer, crawl_stats, publish_segments
from gristmill.crawlers.config import CrawlConfig
from gristmill.crawlers.crawler import Crawler
from gristmill.crawlers.frontier import Frontier, ResultLog
from gristmill.crawlers.hub import Fenced, MemoryHub
from gristmill.crawlers.partitions import Link, Partition
from gristmill.crawlers.persistence import Persistence
from gristmill.crawlers.state import Checkpoint
from gristmill.pipeline.demo.site.server import DemoSite
from gristmill.pipeline.format import Corpus

from frontier_pages import store_pages  # isort: skip

pytestmark = pytest.mark.timeout(120)
LINK = Link("http://a.test/x", 1, 0, None, 0, True)
# Every call a partition makes that changes shared state, with arguments after (index, generation).
STALE_CALLS: dict[str, tuple[Any, ...]] = {
    "report": (True, "zombie:9"),
    "progress": ({"documents": 99},),
    "publish": ({"shards": [{"path": "crawl-p0-zombie.parquet"}], "stats": {}, "warc_files": []},),
    "post": (1, [LINK], 7),
    "take": (),
    "acknowledge": (1,),
    "checkpointed": ("frontier-1-9.sqlite",),
}


def _hub_with_a_restarted_partition() -> MemoryHub:
    """Partition 0 joined (generation 1), took a link, published, checkpointed; then rejoined (2)."""
    hub = MemoryHub()
    assert hub.join(0) == (1, None) and hub.join(1) == (1, None)
    hub.post(1, 1, 0, [LINK], 1)
    assert hub.take(0, 1)[0] == 1
    hub.publish(0, 1, {"shards": [], "stats": {}, "warc_files": []})
    hub.checkpointed(0, 1, "frontier-1-1.sqlite")
    assert hub.join(0) == (2, "frontier-1-1.sqlite")  # the restart restores what generation 1 had accepted
    return hub


@pytest.mark.parametrize("call", sorted(STALE_CALLS))
def test_every_call_from_a_stale_generation_is_refused_and_changes_nothing(call: str) -> None:
    hub = _hub_with_a_restarted_partition()
    before = copy.deepcopy(vars(hub))
    with pytest.raises(Fenced, match="partition 0 generation 1 is fenced: generation 2 joined since") as refused:
        getattr(hub, call)(0, 1, *STALE_CALLS[call])
    assert vars(hub) == before
    again = pickle.loads(pickle.dumps(refused.value))  # how it crosses from a Ray actor
    assert (again.index, again.generation, again.current, str(again)) == (0, 1, 2, str(refused.value))
    getattr(hub, call)(0, 2, *STALE_CALLS[call])  # the current generation's call goes through


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50)), max_size=30))
def test_generations_only_grow_and_a_fresh_hub_starts_above_the_store(joins: list[tuple[int, int]]) -> None:
    """Joins with any generation found on the store (a rerun's fresh hub knows nothing else): each
    partition's generations strictly increase, each above what the store held."""
    hub = MemoryHub()
    last: dict[int, int] = {}
    for index, stored in joins:
        generation, _accepted = hub.join(index, stored)
        assert generation > max(last.get(index, 0), stored)
        last[index] = generation
        for older in range(generation):
            with pytest.raises(Fenced):
                hub.report(index, older, True, "x")


def _checkpoints(fs: s3fs.S3FileSystem, folder: str) -> set[str]:
    fs.invalidate_cache()
    return {posixpath.basename(path) for path in fs.ls(folder, detail=False) if path.endswith(".sqlite")}


def _stored_urls(output: str, options: dict) -> list[str]:
    """Every URL the published manifest's shards hold (a URL twice if it was stored twice)."""
    urls: list[str] = Corpus.open(output, storage_options=options).to_table(["url"])["url"].to_pylist()
    return urls


@pytest.fixture()
def nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``on(name)``: what runs next runs on node ``name``, whose scratch disk is its own."""
    def on(name: str) -> None:
        (tmp_path / name).mkdir(exist_ok=True)
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / name))

    yield on


def test_a_zombies_checkpoint_is_refused_and_its_successor_restores_the_accepted_one(
        s3_server: dict, s3_bucket: str, nodes: Any) -> None:
    options = s3_server["storage_options"]
    output, fs = f"{s3_bucket}/raw", s3fs.S3FileSystem(**options)
    config = CrawlConfig(storage_options=options)
    part, hub = Partition(0, 2, f"{output}/_crawl"), MemoryHub()
    folder = part.checkpoint
    assert folder is not None

    nodes("a")
    zombie = Persistence(output, config, part, hub)
    zombie.start(None, pytest.fail)
    store_pages(zombie.frontier, 0, 3)
    zombie.committer.flush(crawl_stats(zombie.frontier))  # shard, checkpoint accepted, segment published
    assert _checkpoints(fs, folder) == {"frontier-1-1.sqlite"}
    published = hub.segments()

    store_pages(zombie.frontier, 3, 3)  # fetched after its last checkpoint, when its node dropped out
    assert hub.join(0)[0] == 2  # the partition is restarted elsewhere: generation 2 fences generation 1
    with pytest.raises(Fenced, match="partition 0 generation 1 is fenced: generation 2"):
        zombie.committer.flush(crawl_stats(zombie.frontier))  # its shard is written, its checkpoint refused
    assert hub.segments() == published  # nor is its listing published
    assert _checkpoints(fs, folder) == {"frontier-1-1.sqlite"}  # the refused copy is gone, the accepted intact
    with pytest.raises(Fenced):
        zombie.incarnation.publish({"shards": [], "stats": {}, "warc_files": []})
    zombie.close()

    nodes("b")
    successor = Persistence(output, config, part, hub)
    assert successor.incarnation.generation == 3
    assert successor.frontier.documents() == 3  # exactly generation 1's accepted checkpoint
    successor.start(None, pytest.fail)  # the zombie's unlisted shard is an orphan: removed
    store_pages(successor.frontier, 3, 3)  # fetched again
    successor.committer.flush(crawl_stats(successor.frontier))
    successor.close()
    publish_segments(output, hub.segments()[1], options)
    urls = _stored_urls(output, options)
    assert sorted(urls) == sorted(f"http://a.test/{n}" for n in range(6))  # none lost, none twice
    assert _checkpoints(fs, folder) == {"frontier-3-1.sqlite"}  # superseded copies removed

    nodes("c")  # a rerun: a fresh hub knows nothing; the newest copy on the store, above its generation
    rerun = Persistence(output, config, part, MemoryHub())
    assert (rerun.incarnation.generation, rerun.frontier.documents()) == (4, 6)
    rerun.frontier.close()


class CommitsDuringTheNextJoin(MemoryHub):
    """A hub where ``before_join`` runs inside the next join: the old incarnation commits once more
    after the new one listed the store and before it joined (the race a restart always has)."""

    before_join: Any = None

    def join(self, index: int, stored: int = 0) -> tuple[int, str | None]:
        if self.before_join is not None:
            self.before_join()
            self.before_join = None
        return super().join(index, stored)


def test_a_restart_restores_the_copy_accepted_last_not_the_newest_it_listed(
        s3_server: dict, s3_bucket: str, nodes: Any) -> None:
    options = s3_server["storage_options"]
    output, config = f"{s3_bucket}/raw", CrawlConfig(storage_options=options)
    part, hub = Partition(0, 2, f"{output}/_crawl"), CommitsDuringTheNextJoin()
    nodes("a")
    old = Persistence(output, config, part, hub)
    old.start(None, pytest.fail)
    store_pages(old.frontier, 0, 2)
    old.committer.flush(crawl_stats(old.frontier))

    def one_more_commit() -> None:  # accepted and published: its shard must survive the restart
        store_pages(old.frontier, 2, 2)
        old.committer.flush(crawl_stats(old.frontier))

    hub.before_join = one_more_commit
    nodes("b")
    new = Persistence(output, config, part, hub)  # listed frontier-1-1 only, joined after 1-2 was accepted
    assert new.frontier.documents() == 4
    new.start(None, pytest.fail)  # removes no shard the old incarnation's last listing names
    publish_segments(output, hub.segments()[1], options)
    assert sorted(_stored_urls(output, options)) == sorted(f"http://a.test/{n}" for n in range(4))
    new.close()
    old.close()


def test_a_crawl_without_a_hub_checkpoints_above_the_stores_generations(s3_bucket: str, s3_server: dict,
                                                                         nodes: Any) -> None:
    """One crawler has no hub: it is the only writer, and saves one generation above what it found."""
    options = s3_server["storage_options"]
    state = f"{s3_bucket}/raw/_crawl"
    nodes("a")
    first = Persistence(f"{s3_bucket}/raw", CrawlConfig(storage_options=options), None, None)
    first.start(None, pytest.fail)
    store_pages(first.frontier, 0, 2)
    first.committer.flush(crawl_stats(first.frontier))
    first.close()
    again = Checkpoint(state, options)
    assert sorted(again.stored) == [(1, 1)] and again.generation == 2


def test_a_halted_commit_loop_writes_nothing_more_not_even_at_the_end(tmp_path: Path) -> None:
    """A partition refused while handing its links over (the hook every commit runs first) halts its
    commit loop there: that commit writes no shard, and neither does the final one."""
    out, state = tmp_path / "out", tmp_path / "frontier.sqlite"
    frontier, results = Frontier(str(state)), ResultLog(str(state))
    committer = Committer(str(out), results, shard_bytes=1 << 20, row_group_bytes=1 << 16, warc=False)
    commits = CommitLoop(committer, frontier, CrawlConfig(), on_error=pytest.fail,
                         before_commit=lambda: commits.halt())  # as Incarnation's on_fenced does
    store_pages(frontier, 0, 3)

    async def crawl_ends() -> None:
        commits.commit()
        await commits.finish()

    asyncio.run(crawl_ends())
    assert not list(out.glob("*.parquet")) and results.unsharded_count() == 3
    frontier.close()
    results.close()


class RestartedAtFirstCheckpoint(MemoryHub):
    """A hub that, once partition 0's first checkpoint is accepted, takes its node for dead: the
    partition joins again (generation 2), as when the coordinator restarts it elsewhere."""

    def checkpointed(self, index: int, generation: int, name: str) -> None:
        super().checkpointed(index, generation, name)
        if generation == 1:
            self.join(index)


@pytest.fixture(scope="module")
def site() -> Iterator[DemoSite]:
    with DemoSite() as served:
        yield served


SETTINGS = dict(allow_networks=["127.0.0.0/8"], adaptive=False, extract=False, progress_interval=60.0,
                min_delay=0.02)


def test_a_fenced_partition_halts_and_its_successor_stores_every_page_once(
        site: DemoSite, s3_server: dict, s3_bucket: str, nodes: Any, tmp_path: Path) -> None:
    options = s3_server["storage_options"]
    crawl(site.seeds, str(tmp_path / "single"), host_map=site.host_map, **SETTINGS)
    single = set(Corpus.open(str(tmp_path / "single")).to_table(["url"])["url"].to_pylist())
    output = f"{s3_bucket}/raw"
    # a commit every 3 pages and no other (the interval is longer than the test): the zombie's first
    # refusal comes with 3 pages waiting for a shard
    config = CrawlConfig(host_map=site.host_map, storage_options=options, commit_every=3, commit_interval=600.0,
                         **SETTINGS)
    part, hub = Partition(0, 1, f"{output}/_crawl"), RestartedAtFirstCheckpoint()

    nodes("a")
    zombie = Crawler(site.seeds, output, config, partition=part, hub=hub)
    with pytest.raises(Fenced, match="partition 0 generation 1 is fenced: generation 2"):
        asyncio.run(zombie.run())  # never told to stop: only the fence ends it (else the test times out)
    _version, segments = hub.segments()
    assert [segment["shards"] for segment in segments] == [[]]  # only its start-up listing went out
    fs = s3fs.S3FileSystem(**options)
    assert _checkpoints(fs, part.checkpoint) == {"frontier-1-1.sqlite"}
    fs.get_file(f"{part.checkpoint}/frontier-1-1.sqlite", str(tmp_path / "accepted.sqlite"))
    with closing(sqlite3.connect(tmp_path / "accepted.sqlite")) as accepted:
        recorded = {name for (name,) in accepted.execute("SELECT name FROM shards")}
    written = {posixpath.basename(path) for path in fs.glob(f"{output}/crawl-p0-*.parquet")}
    assert recorded and written == recorded  # no shard written after the refusal, not even at its end

    nodes("b")
    hub.finish()  # the coordinator's stop: the successor ends once nothing is left
    successor = Crawler(site.seeds, output, config, partition=part, hub=hub)
    assert successor.frontier.queued_count() + successor.frontier.documents() > 0  # the accepted checkpoint
    asyncio.run(successor.run())
    publish_segments(output, hub.segments()[1], options)
    urls = _stored_urls(output, options)
    assert len(urls) == len(set(urls)) and set(urls) == single


def test_a_refusal_crosses_ray_as_the_hubs_own_one_line_error(ray_local: None) -> None:
    """On a cluster the hub is a Ray actor: its Fenced reaches the zombie as itself, not as Ray's
    RayTaskError with the actor's traceback in its message."""
    import ray

    from gristmill.pipeline.commands.crawl import ActorHub

    hub = ActorHub(ray.remote(num_cpus=0)(MemoryHub).remote())
    assert hub.join(0, 4) == (5, None)
    assert hub.join(0) == (6, None)
    with pytest.raises(Fenced) as refused:
        hub.publish(0, 5, {"shards": [], "stats": {}, "warc_files": []})
    assert str(refused.value) == str(Fenced(0, 5, 6))
