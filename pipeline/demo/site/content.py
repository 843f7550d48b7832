"""The pages of the bundled demo site: five small news sites with the duplication a real crawl meets.

Why: a demo (and its end-to-end test) needs a web that looks like the real one without the network.
Three origin newspapers publish the articles in ``articles_*.txt`` (English and German, Japanese,
Portuguese). The web around them copies them the way crawls see it:

- printer-friendly versions of every article (same text, no site chrome): exact duplicates;
- a mirror site serving the English and German articles under its own chrome: exact duplicates;
- a news wire re-publishing articles with small edits (new title, an added credit line, two
  paragraphs swapped, a trimmed last paragraph): near duplicates;
- tag and archive pages that hold nothing but navigation, link lists and footers: boilerplate;
- robots.txt (with a disallowed /drafts/ folder), a sitemap per site and one broken link.

Everything is rendered from the article files once the sites' base URLs are known; no aiohttp here,
so tests and tools can read the ground truth (``Page.kind``/``Page.original``) cheaply.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

LANGUAGES = ("en", "de", "ja", "pt")
ARTICLE_FILES = {language: f"articles_{language}.txt" for language in LANGUAGES}


@dataclass(frozen=True)
class Article:
    """One article as its author wrote it."""

    slug: str
    language: str
    title: str
    date: str
    author: str
    tags: tuple[str, ...]
    paragraphs: tuple[str, ...]


@dataclass(frozen=True)
class Publication:
    """An origin site: its host name, masthead, languages and the words of its chrome."""

    host: str
    name: str
    languages: tuple[str, ...]
    tagline: str


@dataclass(frozen=True)
class Page:
    """One response. ``kind`` and ``original`` (the path of the page it copies, on the origin site)
    are the ground truth a test compares the dedup result with."""

    body: str
    content_type: str = "text/html; charset=utf-8"
    kind: str = "article"  # article | print | mirror | syndicated | listing | home | robots | sitemap
    original: str | None = None


PUBLICATIONS = (
    Publication("lindenpost.test", "The Linden Post", ("en", "de"),
                "Local news from the river towns, in English and German"),
    Publication("yamakaze.test", "山風新聞", ("ja",), "山あいの町のニュース"),
    Publication("jornaldovale.test", "Jornal do Vale", ("pt",), "Notícias da cidade e do campo"),
)
MIRROR_HOST = "lindenpost-mirror.test"
WIRE_HOST = "newswire.test"
SITE_HOSTS = tuple(p.host for p in PUBLICATIONS) + (MIRROR_HOST, WIRE_HOST)

# Words of the site chrome, per language; the chrome is what extraction has to strip.
CHROME = {
    "en": {"home": "Home", "archive": "Archive", "tags": "Topics", "print": "Print this article",
           "by": "By", "most_read": "Most read", "cookie": "We use cookies to remember your settings. "
           "By continuing to browse you agree to our use of cookies.", "rights": "All rights reserved.",
           "tagged": "Articles tagged", "archive_of": "Articles from", "subscribe": "Subscribe to our newsletter",
           "credit": "This article was first published by {name} and is republished with permission."},
    "de": {"home": "Startseite", "archive": "Archiv", "tags": "Themen", "print": "Artikel drucken",
           "by": "Von", "most_read": "Meistgelesen", "cookie": "Wir verwenden Cookies, um Ihre "
           "Einstellungen zu speichern. Wenn Sie weiterlesen, stimmen Sie dem zu.",
           "rights": "Alle Rechte vorbehalten.", "tagged": "Artikel zum Thema", "archive_of": "Artikel aus",
           "subscribe": "Newsletter abonnieren",
           "credit": "Dieser Artikel erschien zuerst in {name} und wird mit Genehmigung veröffentlicht."},
    "ja": {"home": "ホーム", "archive": "アーカイブ", "tags": "トピック", "print": "印刷用ページ",
           "by": "文・", "most_read": "よく読まれている記事", "cookie": "当サイトでは設定を保存するために"
           "クッキーを使用しています。", "rights": "無断転載を禁じます。", "tagged": "タグ",
           "archive_of": "記事一覧", "subscribe": "メールマガジンに登録",
           "credit": "この記事は{name}から許可を得て転載しました。"},
    "pt": {"home": "Início", "archive": "Arquivo", "tags": "Temas", "print": "Imprimir",
           "by": "Por", "most_read": "Mais lidas", "cookie": "Usamos cookies para guardar as suas "
           "preferências. Ao continuar a navegar, concorda com o seu uso.",
           "rights": "Todos os direitos reservados.", "tagged": "Artigos sobre", "archive_of": "Artigos de",
           "subscribe": "Assine a nossa newsletter",
           "credit": "Este texto foi publicado originalmente pelo {name} e é reproduzido com autorização."},
}
# How the wire edits each article it re-publishes (cycled in article order): near-copies, not copies.
WIRE_EDITS = (("retitle", "credit"), ("swap",), ("retitle", "swap"), ("credit",), ("trim",))
WIRE_TITLE_PREFIX = {"en": "Wire: ", "de": "Meldung: ", "ja": "【配信】", "pt": "Agência: "}


def parse_articles(text: str, language: str, where: str) -> list[Article]:
    """Articles from the ``=== slug: ...`` format of ``articles_*.txt``; errors name the file and line."""
    articles: list[Article] = []
    blocks: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("=== "):
            blocks.append((number, [line[4:]]))
        elif blocks:
            blocks[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"{where}:{number}: text before the first '=== slug:' line")
    for number, lines in blocks:
        header: dict[str, str] = {}
        body_start = len(lines)
        for index, line in enumerate(lines):
            if not line.strip():
                body_start = index
                break
            key, sep, value = line.partition(":")
            if not sep:
                raise ValueError(f"{where}:{number + index}: expected 'key: value' in the article header")
            header[key.strip()] = value.strip()
        missing = {"slug", "title", "date", "author", "tags"} - header.keys()
        if missing:
            raise ValueError(f"{where}:{number}: article header lacks {sorted(missing)}")
        paragraphs = tuple(p.strip() for p in "\n".join(lines[body_start:]).split("\n\n") if p.strip())
        if len(paragraphs) < 3:
            raise ValueError(f"{where}:{number}: article {header['slug']!r} needs at least three paragraphs")
        articles.append(Article(
            slug=header["slug"], language=language, title=header["title"], date=header["date"],
            author=header["author"], tags=tuple(t.strip() for t in header["tags"].split(",") if t.strip()),
            paragraphs=paragraphs,
        ))
    return articles


@lru_cache(maxsize=1)
def load_articles() -> tuple[Article, ...]:
    """Every bundled article, in language order then file order."""
    package = resources.files(__package__)
    articles: list[Article] = []
    for language, name in ARTICLE_FILES.items():
        articles.extend(parse_articles(package.joinpath(name).read_text(encoding="utf-8"), language, name))
    return tuple(articles)


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def article_path(article: Article) -> str:
    return f"/{article.language}/{article.slug}.html"


def print_path(article: Article) -> str:
    return f"/print/{article.language}/{article.slug}.html"


def tag_path(tag: str) -> str:
    return f"/tags/{tag.replace(' ', '-')}.html"


def archive_path(date: str) -> str:
    return f"/archive/{date[:7]}.html"


def _byline(article: Article, words: Mapping[str, str]) -> str:
    return f"{words['by']} {article.author} · {article.date}"


def _body_html(title: str, byline: str, paragraphs: tuple[str, ...]) -> str:
    paras = "\n".join(f"    <p>{_e(p)}</p>" for p in paragraphs)
    return f"""    <h1>{_e(title)}</h1>
    <p class="byline">{_e(byline)}</p>
{paras}"""


def _chrome(site_name: str, language: str, nav: list[tuple[str, str]], main: str, aside: list[tuple[str, str]],
            title: str, css_prefix: str, footer_links: list[tuple[str, str]]) -> str:
    """A full page: header, navigation, cookie banner, main, sidebar, footer, tracking script."""
    words = CHROME[language]
    nav_html = " ".join(f'<a href="{href}">{_e(text)}</a>' for href, text in nav)
    aside_html = "\n".join(f'      <li><a href="{href}">{_e(text)}</a></li>' for href, text in aside)
    footer_html = " · ".join(f'<a href="{href}">{_e(text)}</a>' for href, text in footer_links)
    return f"""<!DOCTYPE html>
<html lang="{language}">
<head>
  <meta charset="utf-8">
  <title>{_e(title)} | {_e(site_name)}</title>
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <style>.{css_prefix}-nav a {{ margin-right: 1em }} .{css_prefix}-aside {{ float: right; width: 30% }}</style>
</head>
<body>
  <header class="{css_prefix}-masthead"><a href="/">{_e(site_name)}</a></header>
  <nav class="{css_prefix}-nav">{nav_html}</nav>
  <div class="{css_prefix}-cookie" role="dialog">{_e(words['cookie'])} <button>OK</button></div>
  <main class="{css_prefix}-main">
{main}
  </main>
  <aside class="{css_prefix}-aside">
    <h2>{_e(words['most_read'])}</h2>
    <ul>
{aside_html}
    </ul>
    <form action="/newsletter" method="post"><label>{_e(words['subscribe'])} <input name="email"></label></form>
  </aside>
  <footer class="{css_prefix}-footer">© 2026 {_e(site_name)}. {_e(words['rights'])} {footer_html}</footer>
  <script>window.dataLayer = window.dataLayer || []; dataLayer.push({{"event": "pageview"}});</script>
</body>
</html>
"""


def _print_page(article: Article, site_name: str) -> str:
    words = CHROME[article.language]
    return f"""<!DOCTYPE html>
<html lang="{article.language}">
<head><meta charset="utf-8"><title>{_e(article.title)}</title><meta name="robots" content="nofollow"></head>
<body onload="window.print()">
  <article>
{_body_html(article.title, _byline(article, words), article.paragraphs)}
  </article>
  <p><small>© 2026 {_e(site_name)}</small></p>
</body>
</html>
"""


def _listing_main(heading: str, links: list[tuple[str, str]]) -> str:
    items = "\n".join(f'      <li><a href="{href}">{_e(text)}</a></li>' for href, text in links)
    return f"    <h1>{_e(heading)}</h1>\n    <ul>\n{items}\n    </ul>"


def _wire_version(article: Article, edits: tuple[str, ...], origin_name: str) -> tuple[str, tuple[str, ...]]:
    """The title and paragraphs of a wire copy: the article with small edits."""
    title, paragraphs = article.title, list(article.paragraphs)
    for edit in edits:
        if edit == "retitle":
            title = WIRE_TITLE_PREFIX[article.language] + title
        elif edit == "credit":
            paragraphs.append(CHROME[article.language]["credit"].format(name=origin_name))
        elif edit == "swap":
            paragraphs[1], paragraphs[2] = paragraphs[2], paragraphs[1]
        elif edit == "trim":
            last = paragraphs[-1]
            paragraphs[-1] = last[: max(len(last) // 2, 1)].rstrip() + "…"
    return title, tuple(paragraphs)


def _site_pages(pub_name: str, language_of_site: str, articles: list[Article], css_prefix: str,
                link_print: bool, kind: str) -> dict[str, Page]:
    """Home, article, print, tag and archive pages of one site holding ``articles``."""
    words = CHROME[language_of_site]
    tags = sorted({tag for a in articles for tag in a.tags})
    months = sorted({a.date[:7] for a in articles})
    nav = [("/", words["home"])] + [(archive_path(m + "-01"), f"{words['archive']} {m}") for m in months]
    nav += [(tag_path(t), t) for t in tags[:6]]
    most_read = [(article_path(a), a.title) for a in articles[:4]]
    footer = [("/about.html", "About"), ("/drafts/", "Drafts"), ("/en/old-story.html", "Archive 2019")]
    pages: dict[str, Page] = {}
    for article in articles:
        awords = CHROME[article.language]
        main = "    <article>\n" + _body_html(article.title, _byline(article, awords), article.paragraphs)
        tag_links = " ".join(f'<a href="{tag_path(t)}">#{_e(t)}</a>' for t in article.tags)
        main += f'\n    <p class="tags">{tag_links}</p>'
        if link_print:
            main += f'\n    <p><a href="{print_path(article)}">{_e(awords["print"])}</a></p>'
        main += "\n    </article>"
        pages[article_path(article)] = Page(
            _chrome(pub_name, article.language, nav, main, most_read, article.title, css_prefix, footer),
            kind=kind, original=article_path(article) if kind == "mirror" else None)
        if link_print:
            pages[print_path(article)] = Page(_print_page(article, pub_name), kind="print",
                                              original=article_path(article))
    for tag in tags:
        links = [(article_path(a), a.title) for a in articles if tag in a.tags]
        pages[tag_path(tag)] = Page(_chrome(pub_name, language_of_site, nav, _listing_main(
            f"{words['tagged']} {tag}", links), most_read, tag, css_prefix, footer), kind="listing")
    for month in months:
        links = [(article_path(a), a.title) for a in articles if a.date.startswith(month)]
        pages[archive_path(month + "-01")] = Page(_chrome(pub_name, language_of_site, nav, _listing_main(
            f"{words['archive_of']} {month}", links), most_read, month, css_prefix, footer), kind="listing")
    home_links = [(article_path(a), a.title) for a in sorted(articles, key=lambda a: a.date, reverse=True)]
    pages["/"] = Page(_chrome(pub_name, language_of_site, nav, _listing_main(pub_name, home_links), most_read,
                              pub_name, css_prefix, footer), kind="home")
    return pages


def _robots_and_sitemap(pages: dict[str, Page], base: str) -> None:
    listed = sorted(p for p, page in pages.items() if page.kind in ("article", "mirror", "syndicated", "home"))
    urls = "\n".join(f"  <url><loc>{_e(base + p)}</loc></url>" for p in listed)
    pages["/sitemap.xml"] = Page(
        f'<?xml version="1.0" encoding="UTF-8"?>\n<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">\n'
        f"{urls}\n</urlset>\n", content_type="application/xml", kind="sitemap")
    pages["/robots.txt"] = Page(f"User-agent: *\nDisallow: /drafts/\nDisallow: /newsletter\n\nSitemap: {base}/sitemap.xml\n",
                                content_type="text/plain; charset=utf-8", kind="robots")


def build_sites(bases: Mapping[str, str]) -> dict[str, dict[str, Page]]:
    """Every page of every site, keyed by host then path; ``bases`` maps each host to its base URL.

    Cross-site links (the wire links back to its sources, the origins link to the mirror) use
    ``bases``, so the sites form one connected web from any seed.
    """
    missing = set(SITE_HOSTS) - set(bases)
    if missing:
        raise ValueError(f"no base URL for {sorted(missing)}")
    articles = load_articles()
    sites: dict[str, dict[str, Page]] = {}
    for pub in PUBLICATIONS:
        own = [a for a in articles if a.language in pub.languages]
        sites[pub.host] = _site_pages(pub.name, pub.languages[0], own, pub.host.split(".")[0], True, "article")
        about = _listing_main(pub.name, [(bases[MIRROR_HOST] + "/", "Mirror"), (bases[WIRE_HOST] + "/", "Wire")])
        sites[pub.host]["/about.html"] = Page(_chrome(pub.name, pub.languages[0], [("/", "Home")], about + f"\n    <p>{_e(pub.tagline)}</p>",
                                                      [], pub.name, pub.host.split(".")[0], []), kind="listing")
    linden = PUBLICATIONS[0]
    mirrored = [a for a in articles if a.language in linden.languages]
    sites[MIRROR_HOST] = _site_pages("Linden Post Mirror", "en", mirrored, "mirror", False, "mirror")
    wire: dict[str, Page] = {}
    wired = [a for a in articles if a.slug not in {"bees-on-the-roof", "sauerteig-aus-der-backstube"}]
    publication_of = {lang: pub for pub in PUBLICATIONS for lang in pub.languages}
    home_links = []
    for index, article in enumerate(wired):
        origin = publication_of[article.language]
        title, paragraphs = _wire_version(article, WIRE_EDITS[index % len(WIRE_EDITS)], origin.name)
        words = CHROME[article.language]
        source_link = f'{bases[origin.host]}{article_path(article)}'
        main = ("    <article>\n" + _body_html(title, _byline(article, words), paragraphs)
                + f'\n    <p class="source"><a href="{source_link}">{_e(origin.name)}</a></p>\n    </article>')
        path = f"/stories/{index:03d}-{article.slug}.html"
        wire[path] = Page(_chrome("Newswire", article.language, [("/", "Newswire")], main, [], title, "wire",
                                  [("/", "Newswire")]), kind="syndicated", original=article_path(article))
        home_links.append((path, title))
    wire["/"] = Page(_chrome("Newswire", "en", [("/", "Newswire")], _listing_main("Newswire", home_links), [],
                             "Newswire", "wire", []), kind="home")
    sites[WIRE_HOST] = wire
    for host, pages in sites.items():
        _robots_and_sitemap(pages, bases[host])
    return sites
