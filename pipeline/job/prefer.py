"""The survivor policy (``--prefer``): which copy of an exact group or near-duplicate cluster survives.

Each document gets one int64 preference key when it is read (higher wins); the key travels in the
``prefer`` column wherever ``length`` travels for the choice, so every policy costs one extra column
through the shuffles, and the two-phase choice (``gristmill.dedup.cluster.survivors``) stays correct: the order
(earlier corpus first, then preference, then length, then id) is total. Policies:

- ``longest`` (default): every key 0, so the longest copy wins, as before the policy existed.
- ``domains:FILE`` (one domain a line, ``#`` comments) or ``domains=a.com,b.com``: a document whose
  domain, or the nearest parent domain of it, is listed earlier wins; unlisted domains come last.
- ``canonical``: the copy whose URL equals its ``canonical_url`` column (when the input has one);
  then https over http, then no query string, then the shortest path. Documents without a URL last.
- ``column:NAME`` (higher wins) or ``column:-NAME`` (lower wins): a numeric column of the input;
  a missing, non-numeric or NaN value comes last.
- ``earliest``: the earliest ``fetch_time``; documents without one come last.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

import fsspec
import numpy as np

from gristmill.pipeline.job.config import DedupError
from gristmill.pipeline.job.inputs import Doc, InputFile

POLICIES = ("longest", "domains:FILE", "domains=D1,D2,...", "canonical", "column:NAME", "column:-NAME", "earliest")
LAST = np.iinfo(np.int64).min  # the key of a document the policy knows nothing about
CANONICAL_COLUMN = "canonical_url"
_SIGN = np.int64(0x7FFFFFFFFFFFFFFF)
_PATH_BITS = 32
JSONL_RECORDS_CHECKED = 100  # records of a JSONL file whose fields say whether it has a policy's column


@dataclass(frozen=True)
class Preference:
    """A parsed ``--prefer`` policy and what it needs from the input (one column at most)."""

    policy: str  # "longest", "domains", "canonical", "column" or "earliest"
    spec: str  # as given (domains: the file or the inline list)
    domains: tuple[str, ...] = ()  # domains: ranked, best first
    column: str | None = None  # column: the numeric column
    lower_wins: bool = False  # column:-NAME

    @property
    def input_column(self) -> str | None:
        """The input column the key is read from, besides those every document has."""
        return {"canonical": CANONICAL_COLUMN, "column": self.column}.get(self.policy)

    def identity(self) -> str:
        """What the survivors depend on, for the job's fingerprint (a domain file by its contents)."""
        if self.policy == "domains":
            return "domains:" + hashlib.sha256("\n".join(self.domains).encode()).hexdigest()
        return self.spec

    def describe(self) -> str:
        """The policy in a few words, as the statistics record it."""
        if self.policy == "domains":
            shown = ", ".join(self.domains[:5]) + (", ..." if len(self.domains) > 5 else "")
            return f"{self.spec} ({len(self.domains)} domains: {shown})"
        return self.spec

    @cached_property
    def _ranks(self) -> dict[str, int]:
        return {domain: len(self.domains) - at for at, domain in enumerate(self.domains)}

    def keys(self, docs: Sequence[Doc]) -> np.ndarray:
        """The int64 preference key of each document (higher wins)."""
        if self.policy == "longest":
            return np.zeros(len(docs), np.int64)
        if self.policy == "domains":
            return np.array([_domain_key(d.domain, self._ranks) for d in docs], np.int64)
        if self.policy == "canonical":
            return np.array([canonical_key(d.url, d.preferred) for d in docs], np.int64)
        if self.policy == "earliest":
            return np.array([LAST if d.fetch_time is None else -_epoch_ms(d.fetch_time) for d in docs], np.int64)
        return number_keys([d.preferred for d in docs], self.lower_wins)


LONGEST = Preference("longest", "longest")


def parse_preference(spec: str | Sequence[str] | None, storage_options: Mapping[str, Any] | None = None) -> Preference:
    """The policy ``spec`` names (a job file may give a list of domains); DedupError naming what is wrong."""
    if spec is None:
        return LONGEST
    if not isinstance(spec, str):
        domains = _checked_domains(list(spec), "the prefer list")
        return Preference("domains", "domains=" + ",".join(domains), domains)
    name, colon, argument = spec.partition(":")
    if spec in ("longest", "canonical", "earliest"):
        return Preference(spec, spec)
    if spec.startswith("domains="):
        return Preference("domains", spec, _checked_domains(spec.removeprefix("domains=").split(","), spec))
    if name == "domains" and colon and argument:
        return Preference("domains", spec, _domain_file(argument, storage_options))
    if name == "column" and colon and argument.lstrip("-"):
        column = argument.lstrip("-")
        return Preference("column", spec, column=column, lower_wins=argument.startswith("-"))
    raise DedupError(f"--prefer {spec!r}: unknown survivor policy (one of: {', '.join(POLICIES)})")


def _domain_file(url: str, storage_options: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The ranked domains of a file: one a line, blank lines and ``#`` comments ignored."""
    try:
        with fsspec.open(url, "rt", encoding="utf-8", **dict(storage_options or {})) as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DedupError(f"--prefer domains:{url}: cannot read the domain file ({exc})") from None
    return _checked_domains([line.split("#", 1)[0] for line in lines], f"domain file {url}")


def _checked_domains(values: list[Any], where: str) -> tuple[str, ...]:
    """Domains as given, lower-cased, blanks dropped, each once (its first rank); one at least."""
    domains = [str(v).strip().lower().strip(".") for v in values]
    domains = [d for d in dict.fromkeys(domains) if d]
    bad = [d for d in domains if any(ch.isspace() or ch in "/:" for ch in d)]
    if bad:
        raise DedupError(f"--prefer: {where} holds {bad[0]!r}, which is not a domain")
    if not domains:
        raise DedupError(f"--prefer: {where} lists no domain")
    return tuple(domains)


def _domain_key(domain: str | None, ranks: Mapping[str, int]) -> int:
    """The rank of the domain or of its nearest listed parent (``www.a.com`` under ``a.com``); 0 if none."""
    name = (domain or "").lower().strip(".")
    while name:
        if name in ranks:
            return ranks[name]
        name = name.partition(".")[2]
    return 0


def canonical_key(url: str | None, canonical: Any) -> int:
    """A URL's cleanliness as one key: equal to its canonical URL, then https, then no query string,
    then the shorter path (bits 62, 61, 60 and the low 32); LAST without a URL."""
    if not url or "://" not in url:
        return int(LAST)
    try:
        parts = urlsplit(url)
    except ValueError:
        return int(LAST)
    is_canonical = isinstance(canonical, str) and canonical == url
    path = min(len(parts.path), 2**_PATH_BITS - 1)
    return ((int(is_canonical) << 62) | (int(parts.scheme.lower() == "https") << 61) | (int(not parts.query) << 60)
            | (2**_PATH_BITS - 1 - path))


def number_keys(values: Sequence[Any], lower_wins: bool = False) -> np.ndarray:
    """Numbers as int64 keys in the same order (higher wins; ``lower_wins`` reverses it); LAST for a
    value that is not a number."""
    numbers = np.array([_number(v) for v in values], np.float64) + 0.0  # -0.0 becomes 0.0
    bits = numbers.view(np.int64).copy()
    bits[bits < 0] ^= _SIGN  # IEEE-754 bits of negatives run backwards: flip them, order is total
    if lower_wins:
        bits = ~bits
    bits[np.isnan(numbers)] = LAST
    return bits


def _number(value: Any) -> float:
    if isinstance(value, bool) or value is None:
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return float("nan")


def _epoch_ms(when: _dt.datetime) -> int:
    return int(when.timestamp() * 1000)


def check_input_column(preference: Preference, files: Sequence[InputFile],
                       storage_options: Mapping[str, Any] | None) -> None:
    """Before any work: ``column:NAME`` needs NAME in the input. The first file of each INPUT is
    checked (a Parquet footer, or a JSONL file's first records), not every file: a billion-file input
    would take as long to check as to read. DedupError naming the file when it lacks the column."""
    if preference.policy != "column":
        return
    firsts: dict[str, InputFile] = {}
    for item in files:
        firsts.setdefault(item.origin, item)
    for item in firsts.values():
        if item.kind == "warc":
            raise DedupError(f"--prefer {preference.spec}: {item.source} is a WARC file, which has no columns")
        names = _column_names(item, storage_options)
        if names is not None and preference.column not in names:
            raise DedupError(f"--prefer {preference.spec}: {item.source} has no {preference.column!r} column "
                             f"(it has: {', '.join(sorted(names)[:20])})")


def _column_names(item: InputFile, storage_options: Mapping[str, Any] | None) -> set[str] | None:
    """The columns of a Parquet file, or the fields of a JSONL file's first JSONL_RECORDS_CHECKED records
    (a field may be absent from some); None when it cannot tell."""
    import orjson
    import pyarrow.parquet as pq

    options = dict(storage_options or {})
    try:
        if item.kind == "parquet":
            with fsspec.open(item.url, "rb", **options) as handle:
                return set(pq.read_schema(handle).names)
        names: set[str] = set()
        with fsspec.open(item.url, "rb", compression="infer", **options) as handle:
            records = (orjson.loads(line) for line in handle if line.strip())
            for _, record in zip(range(JSONL_RECORDS_CHECKED), records, strict=False):
                names.update(record if isinstance(record, dict) else ())
        return names or None
    except Exception:  # noqa: BLE001 - an unreadable file is the read stage's to reject, with its reason
        return None
