"""The crawler against hostile loopback hosts: every fault is injected by a real aiohttp server."""

from __future__ import annotations

import asyncio
import email.utils
import gzip
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from aiohttp import web
from test_crawl_support import ServerThread, Site, crawl_sites, documents, outcomes, serve

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def servers() -> Iterator[ServerThread]:
    yield from serve()


def _failing_then(site: Site, path: str, failures: list[Callable[[], web.Response]], final: str) -> None:
    """Answer ``path`` with each of ``failures`` (made when asked) in turn, then with ``final``."""
    remaining = list(failures)

    async def handler(request: web.Request) -> web.StreamResponse:
        if remaining:
            return remaining.pop(0)()
        return web.Response(text=f"<html><body><p>{final}</p></body></html>", content_type="text/html")

    site.routes[path] = handler


def test_retry_after_seconds_and_http_date_are_honoured(servers: ServerThread, tmp_path) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.article("/", "Home", ["/busy", "/down"])
    _failing_then(site, "/busy", [lambda: web.Response(status=429, headers={"Retry-After": "1"})], "busy page")
    _failing_then(site, "/down", [lambda: web.Response(status=503, headers={
        "Retry-After": email.utils.formatdate(time.time() + 2, usegmt=True)})], "down page")
    crawl_sites(tmp_path, [site.url("/")], [site])
    seen = outcomes(tmp_path)
    assert seen[site.url("/busy")] == "ok" and seen[site.url("/down")] == "ok"
    for path, at_least in (("/busy", 1.0), ("/down", 1.0)):
        first, second = [h.time for h in site.hits if h.path == path]
        assert second - first >= at_least, path  # measured where it matters: at the server


def test_resets_truncated_bodies_and_stalled_headers_are_retried_then_given_up(servers: ServerThread,
                                                                              tmp_path) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.article("/", "Home", ["/reset-twice", "/truncated", "/stalled", "/trickle"])
    resets = {"left": 2}

    async def reset_twice(request: web.Request) -> web.StreamResponse:
        if resets["left"]:
            resets["left"] -= 1
            assert request.transport is not None
            request.transport.abort()
            await asyncio.sleep(0.05)
        return web.Response(text="<p>survived resets</p>", content_type="text/html")

    async def truncated(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html", "Content-Length": "5000"})
        await response.prepare(request)
        await response.write(b"<p>only the start")
        assert request.transport is not None
        request.transport.abort()
        return response

    async def stalled(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(10)
        return web.Response(text="too late")

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        for _ in range(40):  # a byte every 0.2 s: never idle long enough for the read timeout
            await response.write(b"x")
            await asyncio.sleep(0.2)
        return response

    site.routes.update({"/reset-twice": reset_twice, "/truncated": truncated, "/stalled": stalled,
                        "/trickle": trickle})
    summary = crawl_sites(tmp_path, [site.url("/")], [site], read_timeout=0.5, total_timeout=1.5, max_retries=1)
    seen = outcomes(tmp_path)
    hits = site.paths()
    assert seen[site.url("/reset-twice")] == "ok" and hits["/reset-twice"] == 3
    assert seen[site.url("/truncated")].startswith("failed: ") and "truncated" in seen[site.url("/truncated")]
    assert seen[site.url("/stalled")].startswith("failed: ") and "timed out" in seen[site.url("/stalled")]
    assert seen[site.url("/trickle")].startswith("failed: ") and "timed out" in seen[site.url("/trickle")]
    assert hits["/truncated"] == hits["/stalled"] == hits["/trickle"] == 2  # one retry each, then given up
    assert any("/stalled: giving up after 2 attempts" in e for e in summary.errors)


def test_endless_body_gzip_bomb_and_wrong_content_type_are_rejected(servers: ServerThread, tmp_path) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.article("/", "Home", ["/endless", "/bomb", "/image", "/json", "/gzipped"])

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        await response.prepare(request)
        chunk = b"<p>" + b"a" * 65536 + b"</p>"
        for _ in range(10_000):
            await response.write(chunk)
        return response

    bomb = gzip.compress(b"<html>" + b"\0" * (50 * 1024 * 1024), compresslevel=9)
    site.page("/bomb", bomb, headers={"Content-Encoding": "gzip"})
    site.page("/gzipped", gzip.compress(b"<html><body><p>small and honest</p></body></html>"),
              headers={"Content-Encoding": "gzip"})
    site.page("/image", b"\x89PNG\r\n", content_type="image/png")
    site.page("/json", b'{"a": 1}', content_type="application/json")
    site.routes["/endless"] = endless
    crawl_sites(tmp_path, [site.url("/")], [site], max_body_bytes=1024 * 1024,
                max_decompressed_bytes=4 * 1024 * 1024)
    seen = outcomes(tmp_path)
    assert "body exceeds 1048576 bytes" in seen[site.url("/endless")]
    assert "compression bomb" in seen[site.url("/bomb")]
    assert "'image/png' is not one of" in seen[site.url("/image")]
    assert "application/json" in seen[site.url("/json")]
    assert seen[site.url("/gzipped")] == "ok"
    texts = {row["final_url"]: row["text"] for row in documents(tmp_path)}
    assert texts[site.url("/gzipped")] == "small and honest"
    assert set(texts) == {site.url("/"), site.url("/gzipped")}
    assert max(site.paths().values()) == 1  # rejections are final, never retried


def test_wrong_and_missing_charsets_decode_correctly(servers: ServerThread, tmp_path) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.article("/", "Home", ["/lying-header", "/meta-only", "/utf16-bom"])
    french = ("<html><body><p>Le café était fermé, mais la boulangère nous a proposé une crème brûlée. "
              "Nous avons marché jusqu'à la forêt près du château.</p></body></html>") * 2
    site.page("/lying-header", french.encode("cp1252"), content_type="text/html; charset=utf-8")
    russian = '<html><head><meta charset="windows-1251"></head><body><p>Привет, мир</p></body></html>'
    site.page("/meta-only", russian.encode("cp1251"), content_type="text/html; charset=x-unheard-of")
    site.page("/utf16-bom", "<html><body><p>Grüße aus Köln</p></body></html>".encode("utf-16"),
              content_type="text/html")
    crawl_sites(tmp_path, [site.url("/")], [site])
    rows = {row["final_url"]: row for row in documents(tmp_path)}
    assert "boulangère nous a proposé une crème brûlée" in rows[site.url("/lying-header")]["text"]
    assert rows[site.url("/meta-only")]["text"] == "Привет, мир"
    assert rows[site.url("/meta-only")]["encoding"] == "cp1251"
    assert rows[site.url("/utf16-bom")]["text"] == "Grüße aus Köln"


def test_redirect_chains_caps_and_loops(servers: ServerThread, tmp_path) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.article("/", "Home", ["/r1", "/loop-a", "/long0"])
    for source, target in [("/r1", "/r2"), ("/r2", "/r3"), ("/r3", "/final"), ("/loop-a", "/loop-b"),
                           ("/loop-b", "/loop-a")] + [(f"/long{i}", f"/long{i + 1}") for i in range(6)]:
        site.page(source, "", status=302, headers={"Location": target})
    site.article("/final", "Final destination")
    crawl_sites(tmp_path, [site.url("/")], [site], max_redirects=3)
    seen = outcomes(tmp_path)
    rows = {row["final_url"]: row for row in documents(tmp_path)}
    assert rows[site.url("/final")]["url"] == site.url("/r1")  # the URL asked for, and where it ended
    assert seen[site.url("/loop-b")] == "redirect: target already seen (loop or duplicate)"
    assert seen[site.url("/long3")] == "redirect: chain longer than 3 hops"
    assert site.url("/long4") not in seen
    assert max(site.paths().values()) == 1


def test_redirects_to_private_addresses_are_blocked_before_connecting(servers: ServerThread, tmp_path) -> None:
    public = servers.start(Site("127.0.0.2", "public.test"))
    internal = servers.start(Site("127.0.0.3", "internal.test"))
    internal.article("/", "Secret admin page")
    public.article("/", "Home", ["/to-ip", "/to-name", "/to-metadata", f"http://127.0.0.3:{internal.port}/x"])
    public.page("/to-ip", "", status=301, headers={"Location": f"http://127.0.0.3:{internal.port}/"})
    public.page("/to-name", "", status=302, headers={"Location": f"http://internal.test:{internal.port}/"})
    public.page("/to-metadata", "", status=302,
                headers={"Location": "http://169.254.169.254/latest/meta-data/iam/security-credentials/"})
    crawl_sites(tmp_path, [public.url("/")], [public, internal], allow_networks=["127.0.0.2/32"],
                follow="any")
    seen = outcomes(tmp_path)
    assert internal.hits == []  # not one packet reached the "internal" host
    blocked = {url: outcome for url, outcome in seen.items() if outcome.startswith("blocked")}
    assert f"http://127.0.0.3:{internal.port}/" in blocked
    assert f"http://internal.test:{internal.port}/" in blocked
    assert "http://169.254.169.254/latest/meta-data/iam/security-credentials/" in blocked
    assert "internal.test resolves to 127.0.0.3" in blocked[f"http://internal.test:{internal.port}/"]


def test_robots_rules_crawl_delay_and_status_semantics(servers: ServerThread, tmp_path) -> None:
    ruled = servers.start(Site("127.0.0.2", "ruled.test"))
    missing = servers.start(Site("127.0.0.3", "missing.test"))
    broken = servers.start(Site("127.0.0.4", "broken.test"))
    huge = servers.start(Site("127.0.0.5", "huge.test"))
    ruled.page("/robots.txt", "User-agent: *\nDisallow: /private\nCrawl-delay: 0.3\n", content_type="text/plain")
    ruled.article("/", "Ruled", ["/a", "/b", "/private/x"])
    ruled.article("/a", "A")
    ruled.article("/b", "B")
    missing.page("/robots.txt", "gone", status=404, content_type="text/plain")
    missing.article("/", "Missing robots", ["/private/ok"])
    missing.article("/private/ok", "Allowed when robots.txt is 404")
    broken.page("/robots.txt", "oops", status=503, content_type="text/plain")
    broken.article("/", "Broken robots")
    huge.page("/robots.txt", "User-agent: *\nDisallow: /secret\n" + "# padding\n" * 200_000,
              content_type="text/plain")
    huge.article("/", "Huge robots", ["/secret", "/open"])
    huge.article("/open", "Open")
    summary = crawl_sites(tmp_path, [s.url("/") for s in (ruled, missing, broken, huge)],
                          [ruled, missing, broken, huge], max_retries=1, max_body_bytes=512 * 1024)
    seen = outcomes(tmp_path)
    assert seen[ruled.url("/private/x")] == "robots: disallowed by robots.txt"
    assert "/private/x" not in ruled.paths()
    page_times = ruled.times(exclude_robots=True)
    assert len(page_times) == 3
    # Crawl-delay 0.3 s, seen at the server (slack for connection set-up jitter on a busy machine)
    assert all(b - a >= 0.24 for a, b in zip(page_times, page_times[1:]))
    assert seen[missing.url("/private/ok")] == "ok"  # 4xx robots.txt: everything allowed
    assert set(broken.paths()) == {"/robots.txt"}  # 5xx robots.txt: complete disallow
    assert broken.paths()["/robots.txt"] == 2 and broken.base in summary.parked_hosts
    assert seen[huge.url("/secret")] == "robots: disallowed by robots.txt"
    assert seen[huge.url("/open")] == "ok"


def test_sitemaps_from_robots_with_gzip_index(servers: ServerThread, tmp_path) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.page("/robots.txt", f"User-agent: *\nAllow: /\nSitemap: {site.url('/sitemap_index.xml')}\n",
              content_type="text/plain")
    site.article("/", "Home")
    site.page("/sitemap_index.xml",
              f'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"><sitemap>'
              f"<loc>{site.url('/pages.xml.gz')}</loc></sitemap></sitemapindex>", content_type="application/xml")
    urlset = "".join(f"<url><loc>{site.url(f'/hidden{i}')}</loc></url>" for i in range(3))
    site.page("/pages.xml.gz", gzip.compress(f"<urlset>{urlset}</urlset>".encode()),
              content_type="application/gzip")
    for i in range(3):
        site.article(f"/hidden{i}", f"Hidden {i}")
    crawl_sites(tmp_path, [site.url("/")], [site])
    fetched = {row["final_url"] for row in documents(tmp_path)}
    assert fetched == {site.url("/")} | {site.url(f"/hidden{i}") for i in range(3)}


def test_trap_urls_are_bounded_by_depth_length_and_per_host_limits(servers: ServerThread, tmp_path) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))

    async def calendar(request: web.Request) -> web.StreamResponse:
        day = int(request.query.get("d", "0"))
        return web.Response(text=f'<a href="/cal?d={day + 1}">next</a><a href="{request.path}x/">deeper</a>',
                            content_type="text/html")

    site.default = calendar
    crawl_sites(tmp_path, [site.url("/cal?d=0")], [site], max_depth=4, max_url_length=40)
    fetched = site.paths()
    assert fetched["/robots.txt"] == 1 and max(fetched.values()) == 1
    assert "/cal?d=4" in fetched and "/cal?d=5" not in fetched  # depth limit
    assert all(len(site.url(p)) <= 40 for p in fetched)  # URL length limit
    out2 = tmp_path / "per-host"
    crawl_sites(out2, [site.url("/cal?d=100")], [site], max_depth=1000, max_pages_per_host=7)
    assert len(outcomes(out2)) == 7


def test_politeness_is_visible_at_the_server(servers: ServerThread, tmp_path) -> None:
    sites = [servers.start(Site(f"127.0.0.{i}", f"host{i}.test")) for i in (2, 3, 4)]
    everywhere = {"now": 0, "peak": 0}
    for site in sites:
        async def slow_page(request: web.Request, site: Site = site) -> web.StreamResponse:
            everywhere["now"] += 1
            everywhere["peak"] = max(everywhere["peak"], everywhere["now"])
            try:
                await asyncio.sleep(0.15)
                links = "".join(f'<a href="/p{i}">p</a>' for i in range(12))
                return web.Response(text=f"<p>{site.name} {request.path}</p>{links}", content_type="text/html")
            finally:
                everywhere["now"] -= 1

        site.default = slow_page
        site.page("/robots.txt", "User-agent: *\nAllow: /\n", content_type="text/plain")
    reports: list[dict[str, object]] = []
    summary = crawl_sites(tmp_path, [s.url("/") for s in sites], sites, per_host_concurrency=2, min_delay=0.2,
                          concurrency=16, adaptive=False, progress_interval=0.3, on_progress=reports.append)
    for site in sites:
        assert site.peak_in_flight <= 2
        starts = site.times()
        assert len(starts) == 14  # robots.txt, /, /p0../p11
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        assert min(gaps) >= 0.16, (site.name, min(gaps))  # 0.2 s, less connection set-up jitter
    assert everywhere["peak"] >= 3  # hosts are crawled at the same time, each at its own pace
    assert reports and {"pages_per_s", "bytes", "queued", "status_counts", "in_flight", "slowest_hosts"} <= set(reports[-1])
    assert all(delays["delay_s"] >= 0.2 for delays in reports[-1]["slowest_hosts"].values())  # type: ignore[union-attr]
    assert summary.status_counts == {"200": 39} and summary.documents == 39 and summary.requests == 42  # + robots.txt


def test_errors_slow_a_host_down_and_a_hopeless_host_is_parked(servers: ServerThread, tmp_path) -> None:
    flaky = servers.start(Site("127.0.0.2", "flaky.test"))
    dead = servers.start(Site("127.0.0.3", "dead.test"))
    flaky.article("/", "Flaky", [f"/p{i}" for i in range(4)])
    statuses = Counter[str]()

    async def sometimes(request: web.Request) -> web.StreamResponse:
        statuses[request.path] += 1
        if statuses[request.path] <= 2:
            return web.Response(status=503, text="overloaded")
        return web.Response(text=f"<p>{request.path} at last</p>", content_type="text/html")

    for i in range(4):
        flaky.routes[f"/p{i}"] = sometimes

    async def reset(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        return web.Response()

    dead.default = reset
    dead.page("/robots.txt", "", status=404, content_type="text/plain")
    summary = crawl_sites(tmp_path, [flaky.url("/"), dead.url("/")] + [dead.url(f"/d{i}") for i in range(6)],
                          [flaky, dead], min_delay=0.05, max_delay=0.4, max_retries=3, park_after=9)
    seen = outcomes(tmp_path)
    assert all(seen[flaky.url(f"/p{i}")] == "ok" for i in range(4))
    assert summary.hosts[flaky.base]["delay_s"] > 0.05  # errors lengthened the delay; successes since
    flaky_times = flaky.times(exclude_robots=True)  # never shortened it below where errors put it
    assert all(b - a >= 0.04 for a, b in zip(flaky_times, flaky_times[1:]))
    assert dead.base in summary.parked_hosts and "consecutive failures" in summary.parked_hosts[dead.base]
    parked = [url for url, outcome in seen.items() if outcome.startswith("host parked")]
    assert parked and all(url.startswith(dead.base) for url in parked)
    # 9 failed attempts (the flaky host, at most 8 failures in a row, is never parked); aiohttp re-sends
    # an idempotent request once on a fresh connection when a kept-alive one was reset (RFC 9112
    # 9.3.1), so the server may see each attempt twice.
    assert 9 <= len([h for h in dead.hits if h.path != "/robots.txt"]) <= 18


@pytest.mark.parametrize("robots", [True, False])
def test_a_seed_host_that_does_not_resolve_is_parked_at_once_naming_resolve(servers: ServerThread, tmp_path,
                                                                            robots: bool) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.article("/", "Home")
    summary = crawl_sites(tmp_path, [site.url("/"), "http://nosuch-host.invalid/"], [site], obey_robots=robots)
    assert summary.outcomes == {"ok": 1, "dns": 1}
    assert summary.hosts["http://nosuch-host.invalid"]["requests"] == 1  # not retried
    assert "--resolve nosuch-host.invalid=IP" in summary.outcome_examples["dns"]
    assert summary.parked_hosts == {"http://nosuch-host.invalid": "name does not resolve"}
