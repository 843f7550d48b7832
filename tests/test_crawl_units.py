"""Crawler building blocks without a network: URLs, charsets, address policy, sitemaps, proxies, text."""

from __future__ import annotations

import email.utils
import gzip
import time

import pytest

from gristmill.crawlers import detect_language, extract_text
from gristmill.crawlers.crawler import CrawlConfig
from gristmill.crawlers.extract import content_hash, decode_html
from gristmill.crawlers.fetch import retry_after_seconds
from gristmill.crawlers.frontier import Frontier
from gristmill.crawlers.proxies import ProxyPool, ProxySpec
from gristmill.crawlers.safety import AddressPolicy
from gristmill.crawlers.sitemaps import SitemapError, looks_like_sitemap, parse_sitemap
from gristmill.crawlers.urls import BadURL, normalize_url, parse_page, url_id


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("HTTP://Example.COM:80/a/../b/./c?utm_source=x&b=2&a=1#top", "http://example.com/b/c?a=1&b=2"),
        ("https://example.com:443", "https://example.com/"),
        ("https://example.com:8443/x", "https://example.com:8443/x"),
        ("http://user:pw@example.com/x?fbclid=1&gclid=2&q=a b", "http://example.com/x?q=a%20b"),
        ("http://bücher.de/%7e/", "http://xn--bcher-kva.de/%7E/"),
        ("http://example.com./a/..", "http://example.com/"),
    ],
)
def test_normalize_url(raw: str, expected: str) -> None:
    assert normalize_url(raw) == expected


@pytest.mark.parametrize("bad", ["mailto:a@b.c", "javascript:void(0)", "ftp://x/y", "http://", "http://[::1"])
def test_normalize_url_rejects_uncrawlable(bad: str) -> None:
    with pytest.raises(BadURL, match="scheme|host|Invalid|invalid"):
        normalize_url(bad)


def test_url_id_is_stable_and_32_hex() -> None:
    first = url_id(normalize_url("http://Example.com/a?b=1&a=2"))
    assert first == url_id(normalize_url("http://example.com:80/a?a=2&b=1#x"))
    assert len(first) == 32 and int(first, 16) >= 0


def test_parse_page_links_base_nofollow_and_text() -> None:
    html = ('<html><head><base href="/docs/"><script>var hidden = 1</script></head><body>'
            '<a href="intro.html#part">Intro</a> <a href="mailto:x@y.z">mail</a>'
            '<a rel="nofollow" href="/login">login</a><area href="http://Other.example/x"></body></html>')
    links, text = parse_page(html, "http://site.example/a/b.html", want_text=True)
    assert links == ["http://site.example/docs/intro.html", "http://other.example/x"]
    assert "hidden" not in text and "Intro" in text
    blocked, _ = parse_page('<meta name="robots" content="noindex, nofollow"><a href="/x">x</a>', "http://s.example/")
    assert blocked == []
    xhtml = ('<?xml version="1.0" encoding="utf-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml"><body>'
             '<p>Kept<style>p {}</style> text</p><a href="/next">next</a></body></html>')
    assert parse_page(xhtml, "http://s.example/", want_text=True) == (["http://s.example/next"], "Kept text next")
    assert parse_page("", "http://s.example/") == ([], "")


@pytest.mark.parametrize(
    ("body", "header", "expected_text", "expected_encoding"),
    [
        ("\ufeffgrüße".encode(), None, "grüße", "utf-8"),
        ("grüße".encode("utf-16"), "iso-8859-1", "grüße", "utf-16-le"),
        (("<p>Le café était fermé, mais la boulangère nous a proposé une crème brûlée très réussie. "
          "Nous avons ensuite marché jusqu'à la forêt près du château.</p>" * 3).encode("cp1252"), "utf-8",
         "boulangère nous a proposé une crème brûlée", None),  # the header lies: detection decides
        ('<meta charset="koi8-r">Привет'.encode("koi8-r"), "x-no-such-charset", "Привет", "koi8-r"),
        ("Ελληνικά".encode("iso-8859-7"), "iso-8859-7", "Ελληνικά", "iso8859-7"),
    ],
)
def test_decode_html_tries_bom_header_meta_detection(body: bytes, header: str | None, expected_text: str,
                                                     expected_encoding: str | None) -> None:
    text, encoding = decode_html(body, header)
    assert expected_text in text
    if expected_encoding:
        assert encoding == expected_encoding


def test_decode_html_never_raises_on_garbage() -> None:
    text, _ = decode_html(bytes(range(256)) * 50, "utf-8")
    assert isinstance(text, str) and len(text) > 0


def test_address_policy_blocks_private_and_metadata_addresses() -> None:
    policy = AddressPolicy()
    for address in ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "::1",
                    "fe80::1", "fd00:ec2::254", "::ffff:10.0.0.1", "100.64.0.1", "0.0.0.0", "224.0.0.1"]:
        assert not policy.allows(address), address
    assert policy.allows("93.184.216.34") and policy.allows("2606:4700::1")
    allowed = AddressPolicy(["127.0.0.2/32"])
    assert allowed.allows("127.0.0.2") and not allowed.allows("127.0.0.3")
    assert AddressPolicy(allow_private=True).allows("10.0.0.1")


def test_retry_after_both_forms() -> None:
    assert retry_after_seconds("7") == 7.0
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= (retry_after_seconds(future) or 0) <= 31
    assert retry_after_seconds(email.utils.formatdate(time.time() - 60, usegmt=True)) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


def test_sitemap_urlset_index_gzip_and_text() -> None:
    urlset = (b'<?xml version="1.0"?><urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
              b"<url><loc>http://a.example/x</loc></url><url><loc> http://a.example/y?utm_medium=z </loc></url>"
              b"<url><loc>not a url</loc></url></urlset>")
    assert parse_sitemap(urlset, "http://a.example/s.xml", 10**6) == [
        ("http://a.example/x", False), ("http://a.example/y", False)]
    index = gzip.compress(b'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">'
                          b"<sitemap><loc>http://a.example/s1.xml.gz</loc></sitemap></sitemapindex>")
    assert parse_sitemap(index, "http://a.example/i.xml.gz", 10**6) == [("http://a.example/s1.xml.gz", True)]
    assert parse_sitemap(b"http://a.example/1\n\nhttp://a.example/2\n", "http://a.example/s.txt", 100) == [
        ("http://a.example/1", False), ("http://a.example/2", False)]
    with pytest.raises(SitemapError, match="inflates beyond"):
        parse_sitemap(gzip.compress(b"<urlset>" + b" " * 10_000 + b"</urlset>"), "http://a.example/b.xml.gz", 1000)
    with pytest.raises(SitemapError, match="http://a.example/h.xml.*<html>"):
        parse_sitemap(b"<html><body>hi</body></html>", "http://a.example/h.xml", 1000)
    entity = (b'<?xml version="1.0"?><!DOCTYPE u [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
              b'<urlset><url><loc>http://a.example/&e;</loc></url></urlset>')
    assert all("root:" not in loc for loc, _ in parse_sitemap(entity, "http://a.example/e.xml", 10**6))
    assert looks_like_sitemap("http://a.example/sitemap_index.xml.gz") and not looks_like_sitemap("http://a.example/")


def test_proxy_pool_routes_by_host_pattern_and_region_and_rotates_on_bans() -> None:
    pool = ProxyPool([ProxySpec("http://de1", "de"), ProxySpec("http://de2", "de"), ProxySpec("http://any"),
                      ProxySpec.parse("http://special,hosts=*.special.example|x.example")],
                     routes={"*.de": "de"}, ban_after=2, cooldown=60)
    assert pool.choose("shop.special.example") == "http://special"
    assert pool.choose("news.example.com") == "http://any"
    first, second = pool.choose("zeitung.de"), pool.choose("zeitung.de")
    assert {first, second} == {"http://de1", "http://de2"}
    assert pool.report("http://de1", "zeitung.de", 200, b"<p>ok</p>") is False
    assert pool.report("http://de1", "zeitung.de", 200, b"please solve the CAPTCHA") is True
    pool.report("http://de1", "zeitung.de", 403)
    assert {pool.choose("zeitung.de") for _ in range(4)} == {"http://de2"}
    assert pool.choose("other.de") in {"http://de1", "http://de2"}  # the ban is per host
    for _ in range(3):
        pool.report("http://any", "news.example.com", None)
    with pytest.raises(Exception, match="no usable proxy for news.example.com"):
        pool.choose("news.example.com")
    pool.restore("http://any")
    assert pool.choose("news.example.com") == "http://any"


def test_extract_text_and_language() -> None:
    article = ("<html><body><nav>Home | About | Login</nav><article><h1>Der Bericht</h1><p>"
               + "Die Stadt hat heute beschlossen, die alte Brücke über den Fluss zu erneuern. " * 8
               + "</p></article><footer>Impressum Datenschutz</footer></body></html>")
    text = extract_text(article.encode("utf-8"), "http://zeitung.example/bericht")
    assert "alte Brücke" in text and "Impressum" not in text
    assert detect_language(text) == "de"
    assert detect_language("The committee approved the budget after a long debate on Tuesday.") == "en"
    assert detect_language("1234 5678 !!") == "und"
    assert extract_text("") == "" and extract_text(b"\xff\xfe\x00garbage") == ""
    assert len(content_hash(text)) == 32


def test_language_id_scores_exactly_as_py3langid_does() -> None:
    """The identifier's widened weights must not change a single score of the library's own."""
    import py3langid.langid as langid

    from gristmill.crawlers.extract import _identifier

    library = langid.LanguageIdentifier.from_model_file(langid.MODEL_FILE, norm_probs=True)
    samples = ["The committee approved the budget after a long debate on Tuesday.",
               "Die Stadtverwaltung hat am Montag beschlossen, die alte Brücke zu erneuern.",
               "Le conseil municipal a voté la rénovation du vieux pont.", "日本語のテキストです。", "1234", ""]
    for sample in samples:
        assert _identifier().classify(sample) == library.classify(sample)


def test_frontier_seen_set_and_durable_transitions(tmp_path) -> None:
    path = str(tmp_path / "f.sqlite")
    frontier = Frontier(path)
    with frontier.transaction():
        first = frontier.add("http://a.example/", "http://a.example", 0)
        assert frontier.add("http://a.example/", "http://a.example", 0) is None
        frontier.add("http://a.example/2", "http://a.example", 1)
    assert first is not None
    with frontier.transaction():
        frontier.finish(first, "ok")
    frontier.close()
    reopened = Frontier(path)
    assert reopened.seen("http://a.example/") and reopened.admitted("http://a.example") == 2
    assert [r.url for r in reopened.load(reopened.host_id("http://a.example"), 0, 10)] == ["http://a.example/2"]
    with pytest.raises(RuntimeError), reopened.transaction():
        reopened.add("http://a.example/3", "http://a.example", 1)
        raise RuntimeError("crash inside a transition")
    assert not reopened.seen("http://a.example/3")


def test_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="follow"):
        CrawlConfig(follow="everywhere")
    assert CrawlConfig(proxies=("http://p:1,region=de",)).proxies[0].region == "de"


def test_extraction_pool_kills_a_document_that_overruns_and_keeps_working() -> None:
    import asyncio

    from gristmill.crawlers.extract import ExtractionPool, ExtractionTimeout

    # 20,000 one-cell tables: several seconds of trafilatura on any machine, against a 0.5 s limit
    pathological = "<html><body>" + "".join(f"<table><tr><td><p>cell {i} " + "word " * 30 + "</p></td></tr></table>"
                                            for i in range(20_000)) + "</body></html>"
    normal = "<html><body><article><p>" + "A perfectly ordinary paragraph about bridges. " * 20 + "</p></article></body></html>"

    async def run() -> tuple[str, str]:
        pool = ExtractionPool(workers=1, timeout=0.5)
        try:
            await pool.process(normal, "http://warm.example/")  # worker started and trafilatura imported
            with pytest.raises(ExtractionTimeout, match="http://slow.example/: extraction took longer than 0.5s"):
                await pool.process(pathological, "http://slow.example/")
            return await pool.process(normal, "http://after.example/")
        finally:
            pool.close()

    text, language = asyncio.run(run())
    assert "ordinary paragraph about bridges" in text and language == "en"


def test_extraction_pool_replaces_dead_and_worn_workers_and_reports_failures() -> None:
    import asyncio
    import os
    import signal

    from gristmill.crawlers.extract import ExtractionError, ExtractionPool, ExtractionTimeout

    slow = "<html><body>" + "".join(f"<table><tr><td><p>cell {i} " + "word " * 30 + "</p></td></tr></table>"
                                    for i in range(20_000)) + "</body></html>"
    normal = "<html><body><article><p>" + "A perfectly ordinary paragraph about rivers. " * 20 + "</p></article></body></html>"

    def pids(pool: ExtractionPool) -> set[int]:
        return {worker.process.pid for worker in pool._workers}

    async def run() -> None:
        pool = ExtractionPool(workers=1, timeout=30, max_documents=2)
        try:
            first = pids(pool)
            assert (await pool.process(normal, "http://a.example/"))[1] == "en"
            assert pids(pool) == first
            await pool.process(normal, "http://b.example/")  # the worker's second document: it is retired
            assert pids(pool).isdisjoint(first)
            with pytest.raises(ExtractionError, match="http://bad.example/: AttributeError"):
                await pool.process(None, "http://bad.example/")  # type: ignore[arg-type]
            task = asyncio.ensure_future(pool.process(slow, "http://killed.example/"))
            await asyncio.sleep(0.5)
            os.kill(next(iter(pids(pool))), signal.SIGKILL)  # as the OOM killer or a segfault would
            with pytest.raises(ExtractionError, match="http://killed.example/: extraction worker died") as caught:
                await task
            assert not isinstance(caught.value, ExtractionTimeout)
            text, language = await pool.process(normal, "http://after.example/")
            assert "ordinary paragraph about rivers" in text and language == "en"
        finally:
            pool.close()
        assert not pool._workers

    asyncio.run(run())


def test_extraction_pool_gives_up_when_workers_die_at_start(tmp_path) -> None:
    """A script without a ``__main__`` guard: each worker re-runs it and dies; no endless respawning."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "unguarded.py"
    script.write_text(
        "import asyncio\n"
        "from gristmill.crawlers.extract import ExtractionError, ExtractionPool\n"
        "async def main():\n"
        "    pool = ExtractionPool(workers=2, timeout=5)\n"
        "    try:\n"
        "        await pool.process('<p>text</p>', 'http://x.example/')\n"
        "    except ExtractionError as exc:\n"
        "        print('BROKEN', exc)\n"
        "    finally:\n"
        "        pool.close()\n"
        "asyncio.run(main())\n", encoding="utf-8")
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, str(script)], cwd=root, capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "BROKEN http://x.example/: 3 extraction workers died while starting" in result.stdout
    assert '`if __name__ == "__main__":` guard' in result.stdout
