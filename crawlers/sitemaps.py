"""Sitemaps (sitemaps.org protocol): ``<urlset>``, ``<sitemapindex>``, gzip, and plain-text lists.

Why defensive parsing: sitemaps come from untrusted hosts; XML entities are never resolved, nothing
is fetched by the parser, gzip output is capped, and a broken file is an error naming its URL.
"""

from __future__ import annotations

import zlib

from .urls import BadURL, normalize_url

GZIP_MAGIC = b"\x1f\x8b"


class SitemapError(ValueError):
    """A sitemap that cannot be read; the message names its URL."""


def looks_like_sitemap(url: str) -> bool:
    """Seeds named like ``.../sitemap.xml``, ``sitemap_index.xml.gz`` or ``*.xml`` are sitemaps."""
    path = url.split("?", 1)[0].lower()
    return path.endswith((".xml", ".xml.gz")) or "sitemap" in path.rsplit("/", 1)[-1]


def _gunzip(body: bytes, cap: int, url: str) -> bytes:
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decoder.decompress(body, cap + 1)
    except zlib.error as exc:
        raise SitemapError(f"{url}: corrupt gzip sitemap ({exc})") from None
    if len(out) > cap:
        raise SitemapError(f"{url}: gzip sitemap inflates beyond {cap} bytes")
    return out


def parse_sitemap(body: bytes, url: str, cap: int) -> list[tuple[str, bool]]:
    """``(loc, is_sitemap)`` pairs: pages of a urlset, child sitemaps of an index."""
    from lxml import etree

    if body.startswith(GZIP_MAGIC):
        body = _gunzip(body, cap, url)
    stripped = body.lstrip()
    if not stripped.startswith(b"<"):
        lines = body.decode("utf-8", errors="replace").splitlines()
        return [(loc, False) for loc in _normalised(lines)]
    parser = etree.XMLParser(resolve_entities=False, no_network=True, recover=True, huge_tree=False)
    try:
        root = etree.fromstring(stripped, parser)
    except etree.XMLSyntaxError as exc:
        raise SitemapError(f"{url}: not a sitemap ({exc})") from None
    if root is None:
        raise SitemapError(f"{url}: not a sitemap (empty or unparseable XML)")
    tag = etree.QName(root).localname.lower()
    if tag not in ("urlset", "sitemapindex"):
        raise SitemapError(f"{url}: root element <{tag}> is neither <urlset> nor <sitemapindex>")
    locs = [element.text or "" for element in root.iter("{*}loc")]
    return [(loc, tag == "sitemapindex") for loc in _normalised(locs)]


def _normalised(candidates: list[str]) -> list[str]:
    out = []
    for candidate in candidates:
        if not candidate.strip():
            continue
        try:
            out.append(normalize_url(candidate))
        except BadURL:
            continue
    return out
