"""Scope and seeds against real aiohttp servers on 127.0.0.1: under ``follow="same-host"`` another
port of an allowed host is another site (neither a link nor a redirect to it is followed), and a seed
meets the URL length limit every discovered URL meets."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_crawl_support import ServerThread, Site, crawl_sites, outcomes, serve

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def servers() -> Iterator[ServerThread]:
    yield from serve()


def test_another_port_of_an_allowed_host_is_out_of_scope(servers: ServerThread, tmp_path) -> None:
    allowed, other = servers.start(Site("127.0.0.1")), servers.start(Site("127.0.0.1"))
    other.article("/linked", "Linked")
    other.article("/redirected", "Redirected")
    allowed.article("/", "Home", ["/go", other.url("/linked"), "/same"])
    allowed.article("/same", "Same")

    async def go(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(other.url("/redirected"))

    allowed.routes["/go"] = go
    crawl_sites(tmp_path, [allowed.url("/")], [allowed])
    seen = outcomes(tmp_path)
    assert seen[allowed.url("/same")] == "ok"
    assert seen[allowed.url("/go")] == "redirect: target refused (out of scope)"
    assert other.url("/linked") not in seen and other.url("/redirected") not in seen
    assert not other.hits  # nothing was asked of the other port


def test_a_seeds_redirect_still_brings_its_target_into_scope(servers: ServerThread, tmp_path) -> None:
    seed, target = servers.start(Site("127.0.0.1")), servers.start(Site("127.0.0.1"))
    target.article("/home", "Home", ["/next"])
    target.article("/next", "Next")

    async def moved(request: web.Request) -> web.StreamResponse:
        raise web.HTTPMovedPermanently(target.url("/home"))

    seed.routes["/"] = moved
    crawl_sites(tmp_path, [seed.url("/")], [seed])
    seen = outcomes(tmp_path)
    assert seen[target.url("/home")] == "ok" and seen[target.url("/next")] == "ok"


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(extra=st.integers(0, 3000), alphabet=st.sampled_from(["a", "%e4", "é"]))
def test_a_seed_over_the_url_length_limit_is_refused_like_a_link(servers: ServerThread,
                                                                 tmp_path_factory: pytest.TempPathFactory,
                                                                 extra: int, alphabet: str) -> None:
    site = servers.start(Site("127.0.0.1"))
    site.article("/", "Home")
    base = site.url("/?q=")
    long_seed = base + alphabet * (2048 + extra)  # over the limit however it is escaped
    out = tmp_path_factory.mktemp("seeds")
    summary = crawl_sites(out, [site.url("/"), long_seed], [site], max_url_length=2048)
    seen = outcomes(out)
    assert list(seen) == [site.url("/")]
    assert any("over max_url_length (2048)" in error for error in summary.errors)
    assert all(hit.path == "/" or hit.path == "/robots.txt" for hit in site.hits)
