"""A dedup corpus's rejects file: the input records ``gristmill dedup`` could not turn into documents.

Shared by ``gristmill dedup`` (which explains a run whose every record was rejected) and
``gristmill rejects`` (which lists them). The file can hold millions of rows, so it is only ever read
in record batches, and the reason tally groups reasons that differ only in their numbers ("invalid
UTF-8 at byte 7" and "... at byte 9" are one reason), which keeps it small and makes it informative.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gristmill.pipeline.format import Corpus, CorpusError

EXTRA_KEY = "rejects"  # the manifest's extra entry naming the rejects file
TOP_REASONS = 5
_NUMBER = r"(^|[ (])\d+\b"  # a number standing alone, as in "at byte 7" (not the 8 of "UTF-8"); RE2 syntax
_MISSING_FIELD = re.compile(r"no (?P<field>'[^']*') (?:field|column)(?: \(has: (?P<found>.*)\))?")  # inputs' wording


def rejects_path(corpus: Corpus) -> str | None:
    """The rejects file the manifest names, checked to lie inside the corpus; None when it names none
    (only corpora written by ``gristmill dedup`` record rejects)."""
    name = corpus.manifest.extra.get(EXTRA_KEY)
    return None if name is None else corpus.member_path(name, "rejects file")


def reject_batches(corpus: Corpus, path: str, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The rejects file in record batches (bounded memory); a missing or unreadable file is a CorpusError."""
    try:
        with corpus.fs.open(path, "rb") as handle:
            yield from pq.ParquetFile(handle, page_checksum_verification=True).iter_batches(columns=list(columns) if columns else None,
                                                           use_threads=False)
    except FileNotFoundError:
        raise CorpusError(f"{path}: the rejects file the manifest of {corpus.url} names is missing") from None
    except (pa.ArrowException, OSError) as exc:
        raise CorpusError(f"{path}: unreadable rejects file: {exc}") from None


def tally(corpus: Corpus, path: str) -> Counter[tuple[str, str]]:
    """Input records rejected per (kind, reason), each number standing alone in a reason replaced by ``N``."""
    counts: Counter[tuple[str, str]] = Counter()
    for batch in reject_batches(corpus, path, ["kind", "reason", "count"]):
        grouped = pa.table({
            "kind": batch.column("kind"),
            "reason": pc.replace_substring_regex(batch.column("reason"), _NUMBER, r"\1N"),
            "count": batch.column("count"),
        }).group_by(["kind", "reason"]).aggregate([("count", "sum")])
        for kind, reason, count in zip(*(grouped.column(c).to_pylist() for c in ("kind", "reason", "count_sum")),
                                       strict=True):
            counts[(kind, reason)] += count
    return counts


def render_tally(counts: Counter[tuple[str, str]], top: int = TOP_REASONS) -> list[str]:
    """Records rejected per kind, then the ``top`` most common reasons, for people."""
    by_kind: Counter[str] = Counter()
    for (kind, _), count in counts.items():
        by_kind[kind] += count
    lines = [f"{sum(by_kind.values()):,} input records rejected: "
             + ", ".join(f"{kind} {count:,}" for kind, count in by_kind.most_common())]
    lines += [f"  {count:>12,}  {kind}: {reason}" for (kind, reason), count in counts.most_common(top)]
    if len(counts) > top:
        lines.append(f"  ... and {len(counts) - top} more reasons (gristmill rejects CORPUS lists every record)")
    return lines


def text_field_hint(counts: Counter[tuple[str, str]]) -> str | None:
    """When the commonest reason is a missing text field, what to do about it; None otherwise."""
    if not counts:
        return None
    (_, reason), _ = counts.most_common(1)[0]
    match = _MISSING_FIELD.search(reason)
    if match is None:
        return None
    found = match.group("found")
    fields = f" (they have: {found})" if found else ""
    return (f"hint: the records have no {match.group('field')} field{fields}; name the field that holds the text "
            "with --text-column NAME")
