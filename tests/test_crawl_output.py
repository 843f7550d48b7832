"""What a crawl leaves behind: raw corpus shards, manifest, WARC/1.1, resumable state, CLI, proxies."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import s3fs
import xxhash
from test_crawl_support import CountingProxy, ServerThread, Site, crawl_sites, documents, outcomes, serve

from gristmill.crawlers.urls import url_id
from gristmill.pipeline.format import RAW_CRAWL_SCHEMA, Corpus

pytestmark = pytest.mark.timeout(90)
ROOT = Path(__file__).resolve().parents[1]
GERMAN = ("Die Stadtverwaltung hat am Montag beschlossen, die alte Brücke über den Fluss vollständig zu "
          "erneuern. Die Arbeiten sollen im Frühjahr beginnen und etwa zwei Jahre dauern. ")


@pytest.fixture
def servers() -> Iterator[ServerThread]:
    yield from serve()


def _news_site(servers: ServerThread) -> Site:
    site = servers.start(Site("127.0.0.2", "news.test"))
    site.article("/", "Front page of the daily news", ["/en", "/de"])
    site.article("/en", "The city council voted to rebuild the old bridge over the river", words=200)
    site.page("/de", f"<html><head><title>Brücke</title></head><body><nav>Startseite | Impressum</nav>"
                     f"<article><h1>Die Brücke</h1><p>{GERMAN * 4}</p></article></body></html>")
    return site


def test_raw_shards_manifest_and_warc_read_back(servers: ServerThread, tmp_path: Path) -> None:
    site = _news_site(servers)
    summary = crawl_sites(tmp_path, [site.url("/")], [site], extract=True, extract_workers=1, warc=True)
    assert summary.documents == 3 and summary.outcomes == {"ok": 3}
    corpus = Corpus.open(str(tmp_path))
    assert corpus.schema.equals(RAW_CRAWL_SCHEMA) and corpus.manifest.extra["kind"] == "raw-crawl"
    assert all(result.ok for result in corpus.verify())
    table = corpus.to_table()
    assert table.schema.field("fetch_time").type == pa.timestamp("ms", tz="UTC")
    rows = {row["final_url"]: row for row in table.to_pylist()}
    german = rows[site.url("/de")]
    assert german["language"] == "de" and "alte Brücke" in german["text"] and "Impressum" not in german["text"]
    assert rows[site.url("/en")]["language"] == "en"
    for url, row in rows.items():
        assert row["id"] == url_id(url) and row["url"] == url and row["status"] == 200
        assert row["domain"] == "news.test"
        assert row["content_hash"] == xxhash.xxh3_128_hexdigest(row["text"].encode("utf-8"))
    assert corpus.stats["crawl"]["documents"] == 3

    from fastwarc.warc import ArchiveIterator as FastIterator
    from fastwarc.warc import WarcRecordType
    from warcio.archiveiterator import ArchiveIterator

    warc_files = corpus.manifest.extra["warc_files"]
    assert len(warc_files) == 1
    path = tmp_path / warc_files[0]
    with open(path, "rb") as handle:
        records = [(r.rec_type, r.rec_headers.get_header("WARC-Target-URI"), r.content_stream().read())
                   for r in ArchiveIterator(handle, check_digests="raise")]
    assert [kind for kind, _, _ in records] == ["request", "response", "metadata"] * 3
    bodies = {uri: body for kind, uri, body in records if kind == "response"}
    assert "alte Brücke".encode() in bodies[site.url("/de")]
    with open(path, "rb") as handle:
        blocks = [r.verify_block_digest() for r in FastIterator(handle, record_types=WarcRecordType.any_type,
                                                                  parse_http=False)]
    assert blocks == [True] * 9  # request, response and metadata records of three pages
    with open(path, "rb") as handle:
        fast = [(r.http_headers.status_code, r.verify_payload_digest())
                for r in FastIterator(handle, record_types=WarcRecordType.response, parse_http=True)]
    assert fast == [(200, True)] * 3
    with open(path, "rb") as handle:
        versions = {r.rec_headers.protocol for r in ArchiveIterator(handle)}
    assert versions == {"WARC/1.1"}


def _linked_site(servers: ServerThread, count: int) -> tuple[Site, list[str]]:
    """A home page linking ``count`` articles, each linking back home."""
    site = servers.start(Site("127.0.0.2", "a.test"))
    pages = [f"/p{i}" for i in range(count)]
    site.article("/", "Home", pages)
    for path in pages:
        site.article(path, f"Page {path}", ["/"])
    return site, pages


def test_rerun_resumes_without_fetching_committed_pages_twice(servers: ServerThread, tmp_path: Path) -> None:
    site, pages = _linked_site(servers, 12)
    first = crawl_sites(tmp_path, [site.url("/")], [site], max_pages=4, commit_every=2)
    assert 4 <= first.documents < 13
    assert len(Corpus.open(str(tmp_path)).shards) >= 2  # committed in several steps
    second = crawl_sites(tmp_path, [site.url("/")], [site])
    assert second.documents == 13 and second.queued == 0
    hits = site.paths()
    assert all(hits[path] == 1 for path in ["/", *pages]), hits
    rows = documents(tmp_path)
    assert len(rows) == 13 and len({row["id"] for row in rows}) == 13
    third = crawl_sites(tmp_path, [site.url("/")], [site])
    assert third.fetched_this_run == 0 and len(documents(tmp_path)) == 13


def test_commits_in_the_background_lose_and_repeat_no_row(servers: ServerThread, tmp_path: Path) -> None:
    """A commit after every page: shards are written in a thread while pages keep arriving."""
    import sqlite3

    site, pages = _linked_site(servers, 40)
    summary = crawl_sites(tmp_path, [site.url("/")], [site], commit_every=1, concurrency=8, per_host_concurrency=8)
    assert summary.documents == 41 and not summary.errors
    corpus = Corpus.open(str(tmp_path))
    assert len(corpus.shards) >= 2 and all(result.ok for result in corpus.verify())
    ids = [row["id"] for row in documents(tmp_path)]
    assert sorted(ids) == sorted({url_id(site.url(path)) for path in ["/", *pages]})
    with sqlite3.connect(tmp_path / ".crawl" / "frontier.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 0


def test_cli_crawls_and_reports_bad_seeds(servers: ServerThread, tmp_path: Path) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.article("/", "Home", ["/a"])
    site.article("/a", "Page a")
    seeds = tmp_path / "seeds.txt"
    seeds.write_text(f"# seeds\n{site.url('/')}\nmailto:nobody@example.com\n\n", encoding="utf-8")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "gristmill.pipeline.cli", "crawl", str(seeds), "-o", str(out), "--delay", "0",
         "--no-extract", "--allow-network", "127.0.0.0/8", "--resolve", f"a.test={site.ip}", "--quiet", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["documents"] == 2 and report["outcomes"] == {"ok": 2}
    assert "seed 'mailto:nobody@example.com': scheme 'mailto' is not http or https" in result.stderr
    assert {row["final_url"] for row in documents(out)} == {site.url("/"), site.url("/a")}


def test_proxies_route_by_region_rotate_on_bans_and_bench_dead_exits(servers: ServerThread,
                                                                    tmp_path: Path) -> None:
    german = servers.start(Site("127.0.0.2", "zeitung.de.test"))
    other = servers.start(Site("127.0.0.3", "news.com.test"))
    for site in (german, other):
        site.article("/", f"Home of {site.name}", [f"/a{i}" for i in range(6)])
        for i in range(6):
            site.article(f"/a{i}", f"Article {i} of {site.name}")
    host_map = {german.name: german.ip, other.name: other.ip}
    banned_exit = servers.start_proxy(CountingProxy(host_map, "de-1", ban={"zeitung.de.test"}))
    good_exit = servers.start_proxy(CountingProxy(host_map, "de-2"))
    dead_exit = servers.start_proxy(CountingProxy(host_map, "any-1", down=True))
    default_exit = servers.start_proxy(CountingProxy(host_map, "any-2"))
    summary = crawl_sites(
        tmp_path, [german.url("/"), other.url("/")], [german, other],
        proxies=(f"{banned_exit.url},region=de", f"{good_exit.url},region=de", dead_exit.url, default_exit.url),
        proxy_routes={"*.de.test": "de"}, proxy_ban_after=2, max_retries=4, park_after=20)
    seen = outcomes(tmp_path)
    assert all(outcome == "ok" for outcome in seen.values()), seen
    assert summary.documents == 14
    # German pages only ever left through the German exits; the others never did.
    assert set(banned_exit.counts) | set(good_exit.counts) == {"zeitung.de.test"}
    assert set(dead_exit.counts) | set(default_exit.counts) <= {"news.com.test"}
    assert banned_exit.counts["zeitung.de.test"] == 2  # banned after two captcha answers, then rotated away
    assert good_exit.counts["zeitung.de.test"] == len(german.hits)  # every request that arrived came via it
    assert default_exit.counts["news.com.test"] == len(other.hits)
    assert dead_exit.url in {p["proxy"] for p in summary.proxies if p["benched"]}
    assert german.name in next(p for p in summary.proxies if p["proxy"] == banned_exit.url)["banned_for"]


def test_health_check_returns_a_dead_proxy_to_rotation(servers: ServerThread, tmp_path: Path) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.article("/", "Home", [f"/a{i}" for i in range(3)])
    for i in range(3):
        site.article(f"/a{i}", f"Article {i}")
    site.page("/health", "ok", content_type="text/plain")
    only_exit = servers.start_proxy(CountingProxy({site.name: site.ip}, "only", down=True))
    servers.loop.call_later(1.0, setattr, only_exit, "down", False)  # the exit comes back after a second
    summary = crawl_sites(tmp_path, [site.url("/")], [site], proxies=(only_exit.url,), proxy_cooldown=600,
                          proxy_health_url=site.url("/health"), proxy_health_interval=0.2, max_retries=3)
    # Benched for 600 s after three failures, it is back within the run only through the health check.
    assert summary.documents == 4 and set(outcomes(tmp_path).values()) == {"ok"}
    assert only_exit.counts[site.name] == len(site.hits) >= 6  # robots.txt, 4 pages, health probes
    assert "/health" in site.paths()


def test_crawl_into_s3_with_local_state_resumes(servers: ServerThread, tmp_path: Path, s3_server: dict,
                                                s3_bucket: str) -> None:
    site = servers.start(Site("127.0.0.2", "a.test"))
    site.article("/", "Home", [f"/p{i}" for i in range(5)])
    for i in range(5):
        site.article(f"/p{i}", f"Page {i}")
    output = f"{s3_bucket}/raw"
    options = {"state_dir": str(tmp_path / "state"), "storage_options": s3_server["storage_options"],
               "warc": True}
    first = crawl_sites(output, [site.url("/")], [site], max_pages=2, commit_every=1, **options)
    assert 2 <= first.documents < 6
    second = crawl_sites(output, [site.url("/")], [site], **options)
    assert second.documents == 6
    corpus = Corpus.open(output, s3_server["storage_options"])
    assert all(result.ok for result in corpus.verify())
    assert sorted(corpus.to_table(["final_url"])["final_url"].to_pylist()) == sorted(
        [site.url("/")] + [site.url(f"/p{i}") for i in range(5)])
    pages = {path: n for path, n in site.paths().items() if path != "/robots.txt"}  # robots.txt: once a run
    assert len(corpus.manifest.extra["warc_files"]) >= 2 and set(pages.values()) == {1}
    fresh = f"{s3_bucket}/fresh"  # no state_dir: the state is checkpointed under the output, never a local "s3:"
    assert crawl_sites(fresh, [site.url("/")], [site], storage_options=s3_server["storage_options"]).documents == 6
    fs = s3fs.S3FileSystem(**s3_server["storage_options"])
    assert fs.glob(f"{fresh}/_crawl/frontier-*.sqlite") and not Path("s3:").exists()
