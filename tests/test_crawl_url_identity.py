"""URL identity: canonicalisation never merges two URLs that are not equivalent.

``normalize_url`` keys the seen set and the document id. Equivalent spellings (case of scheme and
host, default port, escapes' case, ``+`` for a space in a query, parameter order, tracking
parameters) must meet; anything else must stay apart. A reference reads each URL into what a server
sees (the query's decoded byte pairs) and hypothesis generates pairs of URLs one token apart.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes, urlsplit

from hypothesis import given, settings
from hypothesis import strategies as st

from gristmill.crawlers.urls import _is_tracking, normalize_url, url_id

TOKENS = st.one_of(
    st.sampled_from(["a", "b", "q", "x", "=", "&", "+", "%20", "%2B", "%26", "%3D", " ", "ä", "é", "utm_source",
                     "%e4", "%f6", "%c3%a4", "%C3%A4", "%ff", "%80", "%00", "%41", "A", ";", "/", "?"]),
    st.integers(0, 255).map(lambda b: f"%{b:02x}"),
    st.characters(blacklist_categories=("Cs",)),
)
QUERIES = st.lists(TOKENS, max_size=12).map("".join)


def server_view(url: str) -> tuple[str, list[tuple[bytes, bytes]]]:
    """What the URL asks a server for: its path and its query as decoded byte pairs (form encoding),
    tracking parameters dropped, order ignored (white space around the URL is no part of it)."""
    parts = urlsplit(url.strip())
    pairs = []
    for piece in parts.query.split("&"):
        if piece:
            name, _, value = piece.partition("=")
            raw = unquote_to_bytes(name.replace("+", " "))
            if not _is_tracking(raw.decode("utf-8", "replace")):
                pairs.append((raw, unquote_to_bytes(value.replace("+", " "))))
    return parts.path, sorted(pairs)


@settings(max_examples=600)
@given(query=QUERIES, other=QUERIES, at=st.integers(0, 12), token=TOKENS)
def test_two_urls_meet_only_when_a_server_sees_the_same(query: str, other: str, at: int, token: str) -> None:
    near = query[:at] + token + query[at + 1:]  # one token apart, where collisions hide
    for a, b in ((query, other), (query, near)):
        first, second = f"http://example.com/p?{a}", f"http://example.com/p?{b}"
        if normalize_url(first) == normalize_url(second):
            assert server_view(first) == server_view(second), (first, second, normalize_url(first))
            assert url_id(normalize_url(first)) == url_id(normalize_url(second))


@given(query=QUERIES)
def test_the_canonical_form_asks_for_the_same_and_is_stable(query: str) -> None:
    url = f"http://example.com/p?{query}"
    canonical = normalize_url(url)
    assert server_view(canonical) == server_view(url)
    assert normalize_url(canonical) == canonical


def test_latin1_escapes_stay_apart() -> None:
    assert normalize_url("http://example.com/?q=%e4") == "http://example.com/?q=%E4"
    assert normalize_url("http://example.com/?q=%e4") != normalize_url("http://example.com/?q=%f6")
    assert normalize_url("http://example.com/?q=%2B") != normalize_url("http://example.com/?q=+")
    assert normalize_url("http://example.com/?q=a+b") == normalize_url("http://example.com/?q=a%20b")
