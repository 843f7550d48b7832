"""The bundled demo site: real prose in four languages, served on loopback, with the duplication of a real crawl."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections import Counter
from xml.etree import ElementTree

import pytest

from gristmill.crawlers.extract import detect_language, extract_text
from gristmill.pipeline.demo.site.content import LANGUAGES, SITE_HOSTS, load_articles, parse_articles
from gristmill.pipeline.demo.site.server import DemoSite, serving

pytestmark = pytest.mark.timeout(120)


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode("utf-8")


def shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    if re.search("[\u3040-\u9fff]", text):  # Japanese has no spaces: characters stand in for words
        words = [c for c in text if not c.isspace()]
    else:
        words = re.findall(r"\w+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: str, b: str) -> float:
    sa, sb = shingles(a), shingles(b)
    return len(sa & sb) / len(sa | sb)


@pytest.fixture(scope="module")
def site():
    with serving(host_names=False) as running:
        yield running


def test_articles_are_real_prose_in_four_languages() -> None:
    articles = load_articles()
    counts = Counter(a.language for a in articles)
    assert set(counts) == set(LANGUAGES) and min(counts.values()) >= 4 and len(articles) >= 16
    assert len({a.slug for a in articles}) == len(articles)
    for article in articles:
        body = "\n".join(article.paragraphs)
        size = len(body) if article.language == "ja" else len(body.split())
        assert size >= (450 if article.language == "ja" else 200), article.slug  # ja: characters
        assert detect_language(body) == article.language, article.slug


def test_article_file_errors_name_the_file_and_line() -> None:
    with pytest.raises(ValueError, match=r"x\.txt:1: text before"):
        parse_articles("stray\n=== slug: a\n", "en", "x.txt")
    with pytest.raises(ValueError, match=r"x\.txt:2: article header lacks \['author', 'date', 'tags', 'title'\]"):
        parse_articles("\n=== slug: a\n\npara\n\npara\n\npara\n", "en", "x.txt")
    with pytest.raises(ValueError, match=r"x\.txt:1: article 'a' needs at least three paragraphs"):
        parse_articles("=== slug: a\ntitle: t\ndate: d\nauthor: p\ntags: x\n\nonly one\n", "en", "x.txt")


def test_robots_sitemaps_and_every_listed_page_are_served(site: DemoSite) -> None:
    assert set(site.bases) == set(SITE_HOSTS)
    assert all(base.startswith("http://127.0.0.1:") for base in site.bases.values())
    assert len(set(site.bases.values())) == len(SITE_HOSTS)  # one origin per site
    for host in SITE_HOSTS:
        status, content_type, robots = fetch(site.url(host, "/robots.txt"))
        assert status == 200 and content_type.startswith("text/plain")
        assert "Disallow: /drafts/" in robots and f"Sitemap: {site.url(host, '/sitemap.xml')}" in robots
        status, _, xml = fetch(site.url(host, "/sitemap.xml"))
        locs = [el.text for el in ElementTree.fromstring(xml).iter("{http://www.sitemaps.org/schemas/sitemap/0.9}loc")]
        assert status == 200 and len(locs) >= 5
        for loc in locs:
            assert fetch(loc)[0] == 200, loc
    assert fetch(site.url("lindenpost.test", "/en/old-story.html"))[0] == 404  # the broken footer link
    assert ("lindenpost.test", "/en/old-story.html", 404) in {(h.host, h.path, h.status) for h in site.hits}


def test_the_copies_are_exact_near_or_boilerplate_as_labelled(site: DemoSite) -> None:
    pages = dict(site.pages())
    texts = {url: extract_text(page.body, url) for url, page in pages.items() if page.kind not in ("robots", "sitemap")}
    kinds = Counter(page.kind for page in pages.values())
    prose = [paragraph for article in load_articles() for paragraph in article.paragraphs if len(paragraph) >= 40]
    assert kinds["print"] == 16 and kinds["mirror"] == 8 and kinds["syndicated"] >= 10 and kinds["listing"] >= 20
    for url, page in pages.items():
        if page.kind in ("print", "mirror", "syndicated"):
            host = "lindenpost.test" if page.kind == "mirror" else None
            original = next(u for u, p in pages.items() if p.kind == "article" and u.endswith(page.original)
                            and (host is None or u.startswith(site.bases[host])))
            similarity = jaccard(texts[url], texts[original])
            if page.kind == "syndicated":
                assert 0.6 < similarity < 1.0, (url, similarity)  # a near copy, never an exact one
            else:
                assert texts[url] == texts[original], url  # extraction strips the differing chrome
        elif page.kind == "listing":
            # navigation, titles and footer only: no article's prose (what the extractor keeps of the
            # chrome depends on its settings; crawlers/extract.py chose them on the shared benchmark)
            assert len(texts[url]) < 400, (url, texts[url])
            assert not any(paragraph[:40] in texts[url] for paragraph in prose), (url, texts[url])
        elif page.kind == "article":
            assert len(texts[url]) > 450, url
