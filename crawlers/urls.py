"""URL normalisation, stable ids and link discovery.

Why: the seen set, the per-host limits and the document id all key on one canonical spelling of a
URL, so ``HTTP://Example.com:80/a/../b?utm_source=x&b=2&a=1#top`` and ``http://example.com/b?a=1&b=2``
must be the same URL.
"""

from __future__ import annotations

import re
from functools import lru_cache
from urllib.parse import quote, unquote_to_bytes, urljoin, urlsplit, urlunsplit

import lxml.etree
import xxhash

# Query parameters that only track the visitor and never change the page.
TRACKING_PARAMS = frozenset(
    {
        "fbclid", "gclid", "dclid", "gbraid", "wbraid", "msclkid", "yclid", "igshid", "twclid",
        "mc_cid", "mc_eid", "_ga", "_gl", "_hsenc", "_hsmi", "mkt_tok", "ref_src", "oly_anon_id",
        "oly_enc_id", "vero_id", "wickedid", "spm",
    }
)
TRACKING_PREFIXES = ("utm_", "pk_", "hsa_")
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SAFE_PATH = "/%:@!$&'()*+,;=-._~"
_SAFE_QUERY = "/?:@!$'()*,;-._~"  # not + (a space in a query), & or =
_PERCENT = re.compile(r"%[0-9a-fA-F]{2}")
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>")
# Already-canonical shapes (lower-case host, no query, fragment, escapes or dot segments) skip parsing.
_FAST = re.compile(r"(https?)://([a-z0-9-]+(?:\.[a-z0-9-]+)*)(?::([0-9]{1,5}))?(/[A-Za-z0-9\-_~!$&'()*+,;=:@/.]*)?")


class BadURL(ValueError):
    """A string that is not a crawlable http(s) URL; the message says why."""


def _remove_dot_segments(path: str) -> str:
    output: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if len(output) > 1:
                output.pop()
        elif segment != ".":
            output.append(segment)
    if path.endswith(("/.", "/..")):
        output.append("")
    joined = "/".join(output)
    return joined if joined.startswith("/") else "/" + joined


def _is_tracking(name: str) -> bool:
    lowered = name.lower()
    return lowered in TRACKING_PARAMS or lowered.startswith(TRACKING_PREFIXES)


def normalize_url(url: str, base: str | None = None) -> str:
    """The canonical form of ``url`` (resolved against ``base``); raises :class:`BadURL`.

    Lower-cases scheme and host (IDNA-encodes it), drops default ports, userinfo and the fragment,
    resolves ``.``/``..``, upper-cases percent escapes, drops tracking parameters and sorts the query.
    """
    text = url.strip()
    if base is not None:
        text = urljoin(base, text)
    return _normalize_absolute(text, url)


@lru_cache(maxsize=16384)
def _normalize_absolute(text: str, url: str) -> str:
    fast = _FAST.fullmatch(text)
    if fast is not None and "/." not in (fast.group(4) or ""):
        scheme, host, port, path = fast.groups()
        if port is not None and int(port) != _DEFAULT_PORTS[scheme] and 0 < int(port) < 65536:
            return f"{scheme}://{host}:{int(port)}{path or '/'}"
        if port is None or int(port) == _DEFAULT_PORTS[scheme]:
            return f"{scheme}://{host}{path or '/'}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        raise BadURL(f"{url!r}: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise BadURL(f"{url!r}: scheme {scheme or '(none)'!r} is not http or https")
    host = (parts.hostname or "").rstrip(".")
    if not host:
        raise BadURL(f"{url!r}: no host")
    try:
        host = host.encode("idna").decode("ascii").lower()
    except UnicodeError:
        raise BadURL(f"{url!r}: host {host!r} is not a valid domain name") from None
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port in (None, _DEFAULT_PORTS[scheme]) else f"{host}:{port}"
    path = _remove_dot_segments(quote(parts.path or "/", safe=_SAFE_PATH))
    path = _PERCENT.sub(lambda m: m.group(0).upper(), path)
    try:
        query = _canonical_query(parts.query)
    except UnicodeEncodeError:  # a lone surrogate: no URL can carry it
        raise BadURL(f"{url!r}: not valid Unicode") from None
    return urlunsplit((scheme, netloc, path, query, ""))


def _canonical_query(query: str) -> str:
    """The query's ``name=value`` pairs, tracking parameters dropped, sorted, each part re-escaped from
    its bytes: ``+`` and ``%20`` are both a space (form encoding), but percent-escapes that are not
    UTF-8 stay the bytes they are, so ``?q=%E4`` and ``?q=%F6`` (Latin-1 forms) stay two URLs."""
    pairs = []
    for piece in query.split("&"):
        if not piece:
            continue
        name, _, value = piece.partition("=")
        raw_name = unquote_to_bytes(name.replace("+", " "))
        if not _is_tracking(raw_name.decode("utf-8", "replace")):
            pairs.append((raw_name, unquote_to_bytes(value.replace("+", " "))))
    return "&".join(f"{quote(n, safe=_SAFE_QUERY)}={quote(v, safe=_SAFE_QUERY)}" for n, v in sorted(pairs))


def url_id(normalized: str) -> str:
    """A stable 32-hex document id: xxh3-128 of the normalised URL."""
    return xxhash.xxh3_128_hexdigest(normalized.encode("utf-8"))


def origin_of(normalized: str) -> str:
    """``scheme://host[:port]`` of a normalised URL: the unit of politeness and of robots.txt."""
    return normalized[:normalized.index("/", normalized.index("//") + 2)]  # a normalised path starts with /


def site_of(normalized: str) -> str:
    """``host[:port]`` of a normalised URL (a default port is never spelled): the unit of
    ``follow="same-host"``, so another port of an allowed host is another site."""
    return origin_of(normalized).split("//", 1)[1]


def host_of(normalized: str) -> str:
    """The bare host name of a normalised URL (no port): the ``domain`` column."""
    netloc = origin_of(normalized).split("//", 1)[1]
    if netloc.startswith("["):
        return netloc[1:netloc.index("]")]
    return netloc.rsplit(":", 1)[0] if ":" in netloc else netloc


@lru_cache(maxsize=1)
def _html_parser() -> lxml.etree.HTMLParser:
    """Plain lxml elements: ``lxml.html``'s Python-side element classes cost a lookup per node."""
    return lxml.etree.HTMLParser()


def parse_page(html: str, base_url: str, want_text: bool = False) -> tuple[list[str], str]:
    """Links of a page and, if asked, its visible text (scripts and styles dropped), from one parse.

    Links are absolute, normalised http(s) targets of ``<a href>``/``<area href>`` honouring
    ``<base>``; a page whose ``<meta name="robots">`` says ``nofollow`` yields none, and
    ``rel="nofollow"`` links are skipped.
    """
    try:
        # lxml refuses a str that carries an XML encoding declaration, as XHTML pages do.
        tree = lxml.etree.fromstring(_XML_DECLARATION.sub("", html, count=1), _html_parser())
    except (ValueError, lxml.etree.LxmlError):
        return [], ""
    if tree is None:
        return [], ""
    text = ""
    if want_text:
        lxml.etree.strip_elements(tree, "script", "style", "noscript", "template", with_tail=False)
        text = " ".join(" ".join(tree.itertext()).split())
    for meta in tree.iterfind(".//meta[@name]"):
        if meta.get("name", "").lower() == "robots" and "nofollow" in meta.get("content", "").lower():
            return [], text
    base = base_url
    for element in tree.iterfind(".//base[@href]"):
        base = urljoin(base_url, element.get("href", ""))
        break
    links: list[str] = []
    seen: set[str] = set()
    try:
        root = origin_of(normalize_url(base))
    except BadURL:
        return [], text
    for element in tree.xpath("//a[@href]|//area[@href]"):
        if "nofollow" in (element.get("rel") or "").lower():
            continue
        href = element.get("href", "").strip()
        try:  # root-relative links, the common case, need no urljoin
            link = normalize_url(root + href) if href[:1] == "/" and href[:2] != "//" else normalize_url(href, base)
        except BadURL:
            continue
        if link not in seen:
            seen.add(link)
            links.append(link)
    return links, text
