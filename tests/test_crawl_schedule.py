"""The per-host scheduler on its own, with a fake clock: concurrency, delay, Crawl-delay, Retry-After,
backoff and parking decided without a network or a single real second waited."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protego import Protego

from gristmill.crawlers.crawler import CrawlConfig
from gristmill.crawlers.frontier import Frontier
from gristmill.crawlers.robots import Robots
from gristmill.crawlers.schedule import ROBOTS, HostScheduler


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _scheduler(tmp_path: Path, hosts: int = 1, urls: int = 50, **options: object) -> tuple[HostScheduler, FakeClock]:
    frontier = Frontier(str(tmp_path / "frontier.sqlite"))
    clock = FakeClock()
    settings_ = {"obey_robots": False, "adaptive": False, "min_delay": 1.0, "per_host_concurrency": 1, **options}
    scheduler = HostScheduler(CrawlConfig(**settings_), frontier, clock)
    with frontier.transaction():
        for h in range(hosts):
            for i in range(urls):
                request = frontier.add(f"http://h{h}.test/{i}", f"http://h{h}.test", 0)
                assert request is not None
                scheduler.admitted(request)
    return scheduler, clock


def _drain(scheduler: HostScheduler, clock: FakeClock, until: float, step: float = 0.05,
           finish_after: float = 0.0) -> list[tuple[float, str, object]]:
    """Run the fake clock to ``until``: take every due request, finish each ``finish_after`` later."""
    taken, open_ = [], []
    while clock.now < until:
        for done_at, host in [o for o in open_ if o[0] <= clock.now]:
            open_.remove((done_at, host))
            scheduler.finished(host)
        while (item := scheduler.due()) is not None:
            host, request = item
            scheduler.started(host)
            taken.append((clock.now, host.origin, request))
            open_.append((clock.now + finish_after, host))
        clock.now = round(clock.now + step, 6)
    return taken


def test_requests_to_one_host_keep_the_delay_and_hosts_do_not_wait_for_each_other(tmp_path: Path) -> None:
    scheduler, clock = _scheduler(tmp_path, hosts=3, urls=10)
    taken = _drain(scheduler, clock, until=1005.0)
    for origin in ("http://h0.test", "http://h1.test", "http://h2.test"):
        times = [t for t, o, _r in taken if o == origin]
        assert len(times) == 5  # at 0, 1, ..., 4 s
        assert all(b - a >= 1.0 - 1e-9 for a, b in zip(times, times[1:]))
    assert sum(t == 1000.0 for t, _o, _r in taken) == 3  # each host's first request at once


def test_per_host_concurrency_holds_while_requests_are_slow(tmp_path: Path) -> None:
    scheduler, clock = _scheduler(tmp_path, urls=20, per_host_concurrency=2, min_delay=0.0)
    taken = _drain(scheduler, clock, until=1010.0, finish_after=1.0)
    starts = [t for t, _o, _r in taken]
    for t in starts:
        assert sum(1 for s in starts if t - 1.0 < s <= t) <= 2  # never more than 2 open at once
    assert len(starts) == 20


def test_crawl_delay_is_honoured_up_to_its_cap(tmp_path: Path) -> None:
    scheduler, clock = _scheduler(tmp_path, urls=10, crawl_delay_cap=4.0)
    host = scheduler.host(1)
    scheduler.set_crawl_delay(host, 9.0)
    taken = _drain(scheduler, clock, until=1013.0)
    times = [t for t, _o, _r in taken]
    assert [round(b - a, 6) for a, b in zip(times, times[1:])] == [4.0] * (len(times) - 1)
    assert len(times) == 4


def test_retry_after_keeps_the_host_quiet_and_backoff_only_lengthens_on_errors(tmp_path: Path) -> None:
    scheduler, clock = _scheduler(tmp_path, urls=5, max_retry_after=60.0, backoff_base=1.0, max_delay=8.0)
    host, request = scheduler.due()
    scheduler.started(host)
    scheduler.on_response(host, 0.1, ok=False)
    scheduler.hold_off(host, 3600.0)  # capped at max_retry_after
    scheduler.retry_later(host, request, 5.0)
    scheduler.finished(host)
    assert [t for t, _o, _r in _drain(scheduler, clock, until=1059.9)] == []
    taken = _drain(scheduler, clock, until=1061.0)
    assert len(taken) == 1 and taken[0][2] is request  # the retry comes first once due
    for _ in range(10):
        scheduler.on_response(host, 0.1, ok=False)
    assert host.delay == 8.0 and host.consecutive_failures == 11
    scheduler.on_response(host, 0.1, ok=True)
    assert host.delay == 8.0 and host.consecutive_failures == 0  # adaptive off: success does not shorten


def test_a_parked_host_is_never_asked_again_and_its_urls_are_set_aside(tmp_path: Path) -> None:
    scheduler, clock = _scheduler(tmp_path, hosts=2, urls=5)
    parked = scheduler.host(1)
    assert scheduler.park(parked, "10 consecutive failures") == 5
    taken = _drain(scheduler, clock, until=1020.0)
    assert {o for _t, o, _r in taken} == {"http://h1.test"}
    assert scheduler.frontier.outcome_counts()["host"][0] == 5


def test_robots_txt_comes_first_and_holds_the_host_until_it_arrives(tmp_path: Path) -> None:
    scheduler, clock = _scheduler(tmp_path, urls=3, obey_robots=True, min_delay=0.0)
    host, first = scheduler.due()
    assert first is ROBOTS and scheduler.due() is None
    clock.now += 10
    assert scheduler.due() is None  # robots.txt still pending
    host.robots = Robots(host.origin, clock.now + 3600, Protego.parse("User-agent: *\nDisallow: /1\n"))
    host.robots_pending = False
    scheduler.finished(host)
    taken = _drain(scheduler, clock, until=clock.now + 1.0)
    assert [r.url for _t, _o, r in taken] == ["http://h0.test/0", "http://h0.test/2"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(per_host=st.integers(1, 3), delay=st.sampled_from([0.0, 0.5, 2.0]),
       latencies=st.lists(st.sampled_from([0.0, 0.1, 0.7, 3.0]), min_size=1, max_size=8),
       errors=st.lists(st.booleans(), min_size=1, max_size=8))
def test_any_latencies_and_errors_keep_the_hosts_limits(tmp_path_factory: pytest.TempPathFactory, per_host: int,
                                                       delay: float, latencies: list[float],
                                                       errors: list[bool]) -> None:
    scheduler, clock = _scheduler(tmp_path_factory.mktemp("s"), hosts=2, urls=12, per_host_concurrency=per_host,
                                  min_delay=delay, adaptive=True)
    open_: list[tuple[float, object]] = []
    starts: dict[str, list[float]] = {}
    for step in range(600):
        for item in [o for o in open_ if o[0] <= clock.now]:
            open_.remove(item)
            host = item[1]
            scheduler.on_response(host, latencies[step % len(latencies)], ok=not errors[step % len(errors)])
            scheduler.finished(host)
        while (item := scheduler.due()) is not None:
            host, _request = item
            scheduler.started(host)
            floor = scheduler.delay(host)
            previous = starts.setdefault(host.origin, [])
            assert not previous or clock.now - previous[-1] >= min(delay, floor) - 1e-9
            previous.append(clock.now)
            assert host.inflight <= per_host
            open_.append((clock.now + latencies[len(previous) % len(latencies)], host))
        clock.now = round(clock.now + 0.05, 6)
