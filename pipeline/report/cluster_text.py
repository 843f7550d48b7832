"""Duplicate clusters as text for people: the list of the largest, and one cluster side by side with diffs.

Why: a threshold is right when the near duplicates it removes are copies a person would call copies.
:func:`render_cluster` prints every member of one cluster next to the representative that was kept,
with the paragraphs and words that differ marked, the estimated similarity the job used and difflib's
exact ratio, so a person can judge. Used by ``gristmill clusters`` and the demo.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Iterator
from typing import Any

_WIDE = re.compile(r"[\u1100-\u115f\u2e80-\ua4cf\uac00-\ud7a3\uf900-\ufaff\ufe30-\ufe4f\uff00-\uff60\uffe0-\uffe6]")


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: East Asian wide characters take two."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _tokens(text: str) -> list[str]:
    """Words with their trailing space; single characters for scripts written without spaces."""
    return re.findall(r"\S+\s*|\s+", text) if not _WIDE.search(text) else list(text)


def wrap(text: str, width: int) -> list[str]:
    """Lines of at most ``width`` display columns, broken between words (or characters in CJK)."""
    lines, current, used = [], "", 0
    for token in _tokens(text):
        size = display_width(token.rstrip())
        if used and used + size > width:
            lines.append(current.rstrip())
            current, used = "", 0
            token = token.lstrip()
        while display_width(token.rstrip()) > width:  # a single token longer than a line
            cut = 1
            while display_width(token[:cut + 1]) <= width:
                cut += 1
            lines.append(token[:cut])
            token = token[cut:]
        current += token
        used = display_width(current)
    if current.strip() or not lines:
        lines.append(current.rstrip())
    return lines


def _pad(text: str, width: int) -> str:
    """``text`` padded with spaces to ``width`` display columns."""
    return text + " " * max(0, width - display_width(text))


def word_diff(old: str, new: str) -> tuple[str, str]:
    """The two paragraphs with what differs marked: ``[-removed-]`` on the left, ``{+added+}`` on the right."""
    a, b = _tokens(old), _tokens(new)
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        chunk_a, chunk_b = "".join(a[i1:i2]), "".join(b[j1:j2])
        if op == "equal":
            left.append(chunk_a)
            right.append(chunk_b)
            continue
        if chunk_a:
            left.append(f"[-{chunk_a.rstrip()}-]" + chunk_a[len(chunk_a.rstrip()):])
        if chunk_b:
            right.append(f"{{+{chunk_b.rstrip()}+}}" + chunk_b[len(chunk_b.rstrip()):])
    return "".join(left), "".join(right)


def side_by_side(old: str, new: str, width: int) -> Iterator[str]:
    """Paragraph-aligned two-column diff of ``new`` against ``old``.

    Each row starts with ``=`` (same paragraph; shown on one truncated line), ``~`` (changed; words
    marked), ``-`` (only in the representative), ``+`` (only in this member) or ``m`` (the same
    paragraph at another position: moved; truncated like ``=``).
    """
    column = max(20, (width - 5) // 2)
    a = [p for p in old.splitlines() if p.strip()]
    b = [p for p in new.splitlines() if p.strip()]

    def rows(marker: str, left: str, right: str, full: bool = True) -> Iterator[str]:
        room = column if full else column - 2  # a truncated line ends in " …"
        lw = wrap(left, room) if left else [""]
        rw = wrap(right, room) if right else [""]
        if not full:
            lw = [lw[0] + (" …" if len(lw) > 1 else "")]
            rw = [rw[0] + (" …" if len(rw) > 1 else "")]
        for index in range(max(len(lw), len(rw))):
            l_text = lw[index] if index < len(lw) else ""
            r_text = rw[index] if index < len(rw) else ""
            yield f"{marker if index == 0 else ' '} {_pad(l_text, column)} │ {r_text}".rstrip()

    opcodes = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    only_a = {p for op, i1, i2, _, _ in opcodes if op != "equal" for p in a[i1:i2]}
    only_b = {p for op, _, _, j1, j2 in opcodes if op != "equal" for p in b[j1:j2]}
    moved = only_a & only_b

    def one_side(left: str, right: str) -> Iterator[str]:
        text = left or right
        if text in moved:
            yield from rows("m", left, right, full=False)
        else:
            yield from rows("-" if left else "+", left, right)

    for op, i1, i2, j1, j2 in opcodes:
        if op == "equal":
            for left, right in zip(a[i1:i2], b[j1:j2], strict=True):
                yield from rows("=", left, right, full=False)
        elif op == "replace":
            olds = [p for p in a[i1:i2] if p not in moved]
            news = [p for p in b[j1:j2] if p not in moved]
            paired = min(len(olds), len(news))
            for left, right in zip(olds[:paired], news[:paired], strict=True):
                yield from rows("~", *word_diff(left, right))
            for left in olds[paired:] + [p for p in a[i1:i2] if p in moved]:
                yield from one_side(left, "")
            for right in news[paired:] + [p for p in b[j1:j2] if p in moved]:
                yield from one_side("", right)
        elif op == "delete":
            for left in a[i1:i2]:
                yield from one_side(left, "")
        else:
            for right in b[j1:j2]:
                yield from one_side("", right)


def text_ratio(old: str, new: str) -> float:
    """difflib's similarity of the two texts' words (characters for CJK): the exact figure to compare
    with the MinHash estimate."""
    return difflib.SequenceMatcher(None, _tokens(old), _tokens(new), autojunk=False).ratio()


def cluster_summary(figures: Any) -> dict[str, Any]:
    """One cluster's figures (``duplicates.ClusterFigures``), for the list and for ``--json``."""
    return {"cluster_id": figures.id, "size": figures.size, "exact_duplicates": figures.exact,
            "near_duplicates": figures.near, "min_similarity": figures.min_similarity,
            "representative": figures.representative, "domains": sorted(figures.domains)}


def render_list(clusters: Any, top: int, total_docs: int) -> str:
    """The ``top`` largest clusters (a ``duplicates.Listing``), one line each, with how many documents
    all clusters hold of ``total_docs``."""
    lines = [f"{clusters.count:,} clusters with removed members, holding "
             f"{clusters.held:,} of {total_docs:,} documents; the largest {min(top, len(clusters))}:",
             f"{'#':>3}  {'cluster id':<32}  {'size':>4}  {'exact':>5}  {'near':>4}  {'min sim':>7}  representative"]
    for rank, cluster in enumerate(clusters[:top], start=1):
        sim = f"{cluster.min_similarity:.3f}" if cluster.min_similarity is not None else "-"
        lines.append(f"{rank:>3}  {cluster.id:<32}  {cluster.size:>4}  {cluster.exact:>5}  "
                     f"{cluster.near:>4}  {sim:>7}  {cluster.representative or '(in an earlier corpus)'}")
    lines.append("Show one with: gristmill clusters CORPUS --show CLUSTER_ID")
    return "\n".join(lines)


def render_cluster(cluster: Any, width: int) -> str:
    """Every member of ``cluster`` against its representative, ``width`` columns wide."""
    rep = cluster.representative
    lines = [f"cluster {cluster.id}: {cluster.size} documents ({cluster.exact} exact, {cluster.near} near duplicates)"]
    if rep is None or rep.text is None:
        lines.append("the representative is not in this corpus (removed against an earlier corpus); "
                     "members are shown against nothing")
    else:
        lines.append(f"KEPT  {rep.source}  [{rep.domain}, {rep.language}]  id {rep.id}")
    base = rep.text if rep is not None and rep.text is not None else ""
    for member in cluster.members:
        lines.append("─" * width)
        sim = "" if member.similarity is None else f"similarity {member.similarity:.3f} (MinHash estimate)"
        header = f"{member.removed_as.replace('_', ' ').upper()}  {member.source}  [{member.domain}, {member.language}]"
        lines.append(header)
        via = f"; copy of {member.duplicate_of}" if rep is None or member.duplicate_of != rep.id else ""
        text = member.text or ""
        lines.append(f"    id {member.id}  {sim}  difflib ratio {text_ratio(base, text):.3f}{via}")
        if text == base:
            lines.append("    text identical to the representative")
            continue
        left_title = "representative (kept)" if base else "(no representative)"
        column = max(20, (width - 5) // 2)
        lines.append(f"  {_pad(left_title, column)} │ this document")
        lines.extend(side_by_side(base, text, width))
    return "\n".join(lines)
