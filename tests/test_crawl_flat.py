"""Costs that must not grow with the crawl, and the pieces partitions are built from, without a network.

The outcome counters kept in the frontier's own table must always equal a GROUP BY over every URL;
exchange files between partitions are hostile input (a bad line is named, the rest is admitted);
the partition of a host comes from the bundled public suffix list without touching the network, and
the seeds' sites are dealt evenly over the partitions, the same in every process and on every re-run;
the HTML waiting for extraction never exceeds its byte cap; publishing the listing of every shard
stays within its share of the crawl's time.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gristmill.crawlers.commits import PUBLISH_SHARE, CommitLoop, Committer, publish_due
from gristmill.crawlers.config import CrawlConfig
from gristmill.crawlers.extract import ByteBudget
from gristmill.crawlers.frontier import Frontier, ResultLog, outcome_kind
from gristmill.crawlers.partitions import (
    LAYOUT_FILE,
    Exchange,
    ExchangeError,
    Link,
    _suffix_list,
    deal,
    partition_key,
    partition_of,
    read_layout,
)
from gristmill.crawlers.progress import is_report, merged_report
from gristmill.pipeline.format import Corpus

from frontier_pages import store_pages  # isort: skip

OUTCOMES = ["ok", "http 404", "robots: disallowed by robots.txt", "failed: http 503 (after 4 attempts)",
            "duplicate: of abc (dedup service)", "redirect", "empty: no main text"]


def _group_by(frontier: Frontier) -> dict[str, int]:
    counts = Counter[str]()
    for outcome, count in frontier.db.execute("SELECT COALESCE(outcome, 'queued'), COUNT(*) FROM urls GROUP BY 1"):
        counts[outcome_kind(outcome)] += count
    return dict(counts)


operation = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 40), st.integers(0, 3)),
    st.tuples(st.just("finish"), st.integers(0, 40), st.sampled_from(OUTCOMES)),
    st.tuples(st.just("park"), st.integers(0, 3), st.sampled_from(["5 consecutive failures", "robots"])),
    st.tuples(st.just("unpark"), st.just(0), st.just(0)),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(operation, max_size=60))
def test_outcome_counters_always_equal_a_group_by_over_every_url(tmp_path_factory: pytest.TempPathFactory,
                                                                  operations: list) -> None:
    frontier = Frontier(str(tmp_path_factory.mktemp("f") / "frontier.sqlite"))
    requests = {}
    for name, a, b in operations:
        with frontier.transaction():
            if name == "add":
                request = frontier.add(f"http://h{b}.test/{a}", f"http://h{b}.test", 1)
                if request is not None:
                    requests[a, b] = request
            elif name == "finish" and requests:
                frontier.finish(list(requests.values())[a % len(requests)], b)
            elif name == "park" and requests:
                frontier.park_host(list(requests.values())[a % len(requests)].host, b)
            elif name == "unpark":
                frontier.unpark_all()
    counted = {kind: count for kind, (count, _example) in frontier.outcome_counts().items()}
    assert counted == _group_by(frontier)
    assert frontier.queued_count() == frontier.db.execute("SELECT COUNT(*) FROM urls WHERE state = 0").fetchone()[0]
    per_host = dict(frontier.db.execute("SELECT h.origin, COUNT(u.id) FROM hosts h LEFT JOIN urls u ON u.host = h.id "
                                        "GROUP BY h.id"))
    assert {origin: frontier.admitted(origin) for origin in per_host} == per_host
    frontier.close()


def test_a_frontier_from_before_the_counters_is_counted_once_on_open(tmp_path: Path) -> None:
    path = str(tmp_path / "frontier.sqlite")
    frontier = Frontier(path)
    with frontier.transaction():
        for i in range(10):
            request = frontier.add(f"http://a.test/{i}", "http://a.test", 0)
            assert request is not None
            if i % 3 == 0:
                frontier.finish(request, "http 404")
        frontier.db.execute("DELETE FROM outcomes")  # as an older version left it
    frontier.db.execute("ALTER TABLE hosts DROP COLUMN admitted")
    frontier.close()
    reopened = Frontier(path)
    assert {k: c for k, (c, _e) in reopened.outcome_counts().items()} == {"queued": 6, "http": 4}
    assert reopened.admitted("http://a.test") == 10
    assert reopened.outcome_counts()["http"][1] == "http 404"
    reopened.close()


lines = st.one_of(
    st.builds(lambda link: json.dumps(link), st.tuples(
        st.sampled_from(["http://a.test/x", "https://b.test/y?q=1", "http://127.0.0.1:8080/"]),
        st.integers(0, 20), st.sampled_from([0, 1]), st.none() | st.just("http://c.test/"), st.integers(0, 5),
        st.booleans()).map(list)),
    st.text(max_size=40).filter(lambda t: "\n" not in t and "\r" not in t),
    st.builds(lambda v: json.dumps(v), st.lists(st.integers() | st.text(max_size=5) | st.none(), max_size=7)),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(lines, max_size=12))
def test_an_exchange_file_yields_each_good_link_and_names_each_bad_line(tmp_path_factory: pytest.TempPathFactory,
                                                                       content: list[str]) -> None:
    path = tmp_path_factory.mktemp("x") / "from-1-0.jsonl"
    path.write_text("\n".join(content) + "\n", encoding="utf-8")
    results = list(Exchange.read(str(path)))
    assert len(results) == sum(1 for line in content if line.strip())
    numbered = [n for n, line in enumerate(content, 1) if line.strip()]
    for number, result in zip(numbered, results):
        if isinstance(result, ExchangeError):
            assert f"{path}:{number}:" in str(result)
        else:
            assert isinstance(result, Link) and json.loads(content[number - 1])[0] == result.url


def test_posted_links_arrive_whole_in_the_owners_inbox(tmp_path: Path) -> None:
    source, owner = Exchange(str(tmp_path), 0, 2), Exchange(str(tmp_path), 1, 2)
    links = [Link(f"http://b.test/{i}", 1, 0, "http://a.test/", 0, True) for i in range(3)]
    source.post(1, links, last_id=7)
    [path] = owner.received()
    assert list(Exchange.read(path)) == links
    assert source.received() == []


def test_partition_keys_come_from_the_bundled_suffix_list_without_the_network(monkeypatch) -> None:
    def refuse(*_args, **_kwargs):
        raise AssertionError("the public suffix list tried to reach the network")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    _suffix_list.cache_clear()  # loaded afresh under the guard
    assert partition_key("http://www.bbc.co.uk/news") == partition_key("https://sport.bbc.co.uk/") == "bbc.co.uk"
    assert partition_key("http://alice.github.io/") != partition_key("http://bob.github.io/")  # private suffixes
    assert partition_key("http://lindenpost.test:8080/") == "lindenpost.test"  # no known suffix: the host
    assert partition_key("http://127.0.0.1:8080/") != partition_key("http://127.0.0.1:8081/")  # IPs: the origin
    for count in (2, 3, 7):
        assert partition_of("http://www.bbc.co.uk/", count) == partition_of("http://bbc.co.uk/x", count)
        assert 0 <= partition_of("http://example.org/", count) < count


def test_html_waiting_for_extraction_stays_under_its_byte_cap() -> None:
    async def main() -> list[tuple[int, int]]:
        budget = ByteBudget(100)
        holders, seen = 0, []

        async def page(size: int) -> None:
            nonlocal holders
            await budget.acquire(size)
            holders += 1
            seen.append((budget.held, holders))
            await asyncio.sleep(0.01)
            holders -= 1
            await budget.release(size)

        await asyncio.gather(*(page(size) for size in [60, 30, 50, 250, 10, 90, 40]))
        assert budget.held == 0
        return seen

    seen = asyncio.run(main())
    assert len(seen) == 7
    assert all(held <= 100 or holders == 1 for held, holders in seen)  # a page over the cap goes alone
    assert max(holders for _held, holders in seen) >= 2  # pages under the cap do share it


@settings(max_examples=60, deadline=None)
@given(sites=st.lists(st.from_regex(r"[a-z]{1,8}\.(com|co\.uk|github\.io|org)", fullmatch=True), min_size=1,
                      max_size=40, unique=True),
       count=st.integers(2, 7), order=st.randoms(use_true_random=False))
@example(sites=["cn.com", "abc.com"], count=2, order=random.Random(0))  # found by this test in CI
def test_the_seeds_sites_are_dealt_evenly_and_alike_in_every_process(sites: list[str], count: int,
                                                                    order) -> None:  # type: ignore[no-untyped-def]
    seeds = [f"http://www.{site}/" for site in sites] + [f"https://blog.{site}/a" for site in sites]
    dealt = deal(seeds, count)
    shuffled = list(seeds)
    order.shuffle(shuffled)
    assert deal(shuffled, count) == dealt  # every partition computes the same owners from the same seeds
    per_partition = Counter(dealt.values())
    assert max(per_partition.values()) - min(per_partition.get(i, 0) for i in range(count)) <= 1
    for site in sites:  # a site's hosts stay together; a public suffix (cn.com, github.io) is no one site
        www, blog = f"http://www.{site}/", f"https://blog.{site}/a"
        assert (partition_key(www) == partition_key(blog)) == (partition_key(www) == site)
        if partition_key(www) == site:
            assert partition_of(www, count, dealt) == partition_of(blog, count, dealt)
    assert deal(["http://new.example/"], count, earlier=dealt) == dealt  # a re-run keeps the first deal
    assert deal(["mailto:x@y", "not a url"], count) == {}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.recursive(st.none() | st.booleans() | st.integers(-3, 5) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                               st.sampled_from(["partitions", "dealt", "a.test", "b.test", "x"]), inner, max_size=3),
                           max_leaves=8))
def test_a_hostile_partition_layout_is_refused_naming_the_file(tmp_path: Path, layout: object) -> None:
    (tmp_path / LAYOUT_FILE).write_text(json.dumps(layout), encoding="utf-8")
    count = layout.get("partitions") if isinstance(layout, dict) else None
    dealt = layout.get("dealt", {}) if isinstance(layout, dict) else None
    good = (type(count) is int and count >= 1 and isinstance(dealt, dict)
            and all(type(owner) is int and 0 <= owner < count for owner in dealt.values()))
    if good:
        assert read_layout(str(tmp_path)) == {"partitions": count, "dealt": dealt}
    else:
        with pytest.raises(ValueError, match=str(tmp_path / LAYOUT_FILE)):
            read_layout(str(tmp_path))


def test_a_slow_listing_is_published_within_its_share_and_always_at_the_end(tmp_path: Path) -> None:
    """Publishing lists every shard (O(shards)): a publication that took T seconds is not repeated
    before T / PUBLISH_SHARE, whatever ``commit_interval`` says, though every commit still writes its
    shard; the end of the crawl publishes whatever the last one skipped."""
    out = tmp_path / "out"
    state = out / ".crawl" / "frontier.sqlite"
    state.parent.mkdir(parents=True)
    frontier, results = Frontier(str(state)), ResultLog(str(state))
    committer = Committer(str(out), results, shard_bytes=1 << 20, row_group_bytes=1 << 16, warc=False)
    loop = CommitLoop(committer, frontier, CrawlConfig(commit_interval=0.0), on_error=pytest.fail)

    def listed() -> int:
        return len(Corpus.open(str(out)).manifest.shards)

    async def commit(first: int) -> None:
        store_pages(frontier, first, 3)
        loop.commit()
        assert loop._running is not None
        await loop._running

    async def crawl() -> None:
        loop.publish()  # at start-up
        await asyncio.sleep(committer.publish_seconds / PUBLISH_SHARE)  # a few ms: due again
        await commit(0)
        assert listed() == len(results.shards()) == 1  # a fast listing: published at every commit
        committer.publish_seconds = 60.0  # as if listing every shard had taken a minute
        assert not publish_due(time.monotonic() - 60 / PUBLISH_SHARE + 5, 60.0, 0.0)
        assert publish_due(time.monotonic() - 60 / PUBLISH_SHARE, 60.0, 0.0)
        await commit(3)
        await commit(6)
        assert len(results.shards()) == 3 and listed() == 1  # shards written and recorded, listing not redone
        await loop.finish()

    asyncio.run(crawl())
    assert listed() == 3
    assert sorted(Corpus.open(str(out)).to_table(columns=["text"]).column("text").to_pylist()) == \
        sorted(f"page {n}" for n in range(9))
    frontier.close()
    results.close()


GOOD_REPORT = {"elapsed_s": 3.0, "documents": 5, "max_pages": 9, "documents_per_s": 1.5, "pages_per_s": 2.0,
               "fetched": 6, "waiting": 1, "bytes": 9000, "requests": 8, "queued": 4,
               "status_counts": {"200": 6, "404": 1}, "in_flight": 2,
               "slowest_hosts": {"http://a.test": {"delay_s": 1.0, "failures": 0}}, "line": "crawl: ..."}
json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                      max_size=3), max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(GOOD_REPORT)), json_value, st.booleans())
def test_a_partitions_progress_file_is_added_up_or_skipped_never_a_crash(key: str, value: object,
                                                                        nested: bool) -> None:
    """The coordinator adds up the progress files its partitions write; one that is not a report
    (damaged, hand-edited) is skipped, and whatever passes can be added up and printed."""
    assert is_report(GOOD_REPORT)
    report = json.loads(json.dumps(GOOD_REPORT))
    if nested and key in ("status_counts", "slowest_hosts"):
        report[key][next(iter(report[key]))] = value
    else:
        report[key] = value
    if not is_report(report):
        return
    merged = merged_report([report, GOOD_REPORT], 18, 3.0)
    assert merged["documents"] == report["documents"] + 5 and merged["queued"] == report["queued"] + 4
    assert merged["line"].startswith("crawl: ") and "of 18" in merged["line"]
