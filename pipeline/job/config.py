"""What a dedup job is asked to do: :class:`DedupConfig` (the command line and the TOML job file), the
hashing parameters it implies, and :class:`DedupError` for a job that cannot run as configured."""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gristmill.dedup.spans import MIN_SPAN_CHARS, SpanMode, SpanModeError
from gristmill.pipeline.format.signature_index import IndexParams, ParamsError, params_for
from gristmill.pipeline.job.datasets import WORK_FOLDER
from gristmill.pipeline.job.inputs.faults import with_client_retries
from gristmill.pipeline.job.partitions import PARTITION_BYTES

SEND_BUFFER_BYTES = 64 * 1024 * 1024


class DedupError(Exception):
    """The job cannot run as configured (bad options, an incompatible --against corpus)."""


@dataclass
class DedupConfig:
    """Everything ``gristmill dedup`` takes; the TOML job file holds the same keys."""

    inputs: list[str]
    output: str
    threshold: float = 0.8
    num_perm: int = 128
    ngram: int = 5
    bands: int | None = None  # with rows: override the (bands, rows) choose_bands picks
    rows: int | None = None
    verify: bool = True  # link a candidate pair only when its estimated Jaccard reaches the threshold
    seed: int | None = None
    text_column: str = "text"
    id_column: str = "id"
    max_doc_bytes: int = 10 * 1024 * 1024
    split_bytes: int = 64 * 1024 * 1024
    num_partitions: int | None = None  # partitions of every shuffle; default: by the rows each carries
    partition_bytes: int = PARTITION_BYTES  # rows (in memory) a reducer is sized to hold: sets the counts
    spill_bytes: int = 1024 * 1024 * 1024  # a reducer sorting more rows than this spills sorted runs to disk
    cc_rows_per_task: int = 4_000_000  # rows a connected-components task reads, ~170 bytes each at its peak
    removed: str | None = None
    against: list[str] = field(default_factory=list)  # earlier corpora; one may be given as a string
    shard_bytes: int = 256 * 1024 * 1024
    row_group_bytes: int = 4 * 1024 * 1024
    prefer: str | list[str] = "longest"  # the survivor policy (pipeline.job.prefer); a list: ranked domains
    spans: str | None = None  # span-level dedup after document dedup: line, paragraph or sentences:N
    span_min_docs: int = 2  # a span cut is one in at least this many (kept) documents
    span_min_chars: int = MIN_SPAN_CHARS  # spans of fewer normalised characters are never cut
    min_chars: int = 50  # a document cut under this many characters is removed (reason: spans)
    keep_work: bool = False
    work_dir: str | None = None  # the intermediate results' folder (any fsspec URL); None: OUTPUT/_work
    overwrite: bool = False  # replace a committed corpus another job wrote in output/removed
    storage_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # one earlier corpus may be given as a string (the job file's `against = "..."`); each counts once
        against = [self.against] if isinstance(self.against, str) else list(self.against or [])
        # Folders as absolute paths: Ray's workers need not share the driver's working folder (a cluster
        # started elsewhere), and the manifest names --removed for `clusters`, which runs from anywhere.
        self.against = list(dict.fromkeys(map(_absolute, against)))
        self.output = _absolute(self.output)
        self.removed = _absolute(self.removed) if self.removed else self.removed
        self.work_dir = _absolute(self.work_dir) if self.work_dir else self.work_dir
        # an S3 client that retries throttles and resets itself, unless the user chose its retries
        self.storage_options = with_client_retries(self.storage_options or {}, self.urls)
        if self.spans is not None:
            try:
                SpanMode.parse(self.spans)
            except SpanModeError as exc:
                raise DedupError(str(exc)) from None
            if self.span_min_docs < 2 or min(self.span_min_chars, self.min_chars) < 0:
                raise DedupError("--span-min-docs must be at least 2, --span-min-chars and --min-chars at least 0")

    SPAN_FIELDS = ("spans", "span_min_docs", "span_min_chars", "min_chars")

    @property
    def span_options(self) -> dict[str, Any]:
        """The span options, as the fingerprint and the manifest record them (none when --spans is off,
        so a job without it keeps the fingerprint and the bytes it had before spans existed)."""
        if self.spans is None:
            return {}
        return {name: getattr(self, name) for name in self.SPAN_FIELDS}

    @property
    def urls(self) -> list[str]:
        """Every folder and INPUT the job touches."""
        return [*self.inputs, self.output, *([self.removed] if self.removed else []), *self.against,
                *([self.work_dir] if self.work_dir else [])]

    @property
    def default_work_url(self) -> str:
        return posixpath.join(self.output.rstrip("/"), WORK_FOLDER)

    @property
    def work_url(self) -> str:
        """The work folder: ``work_dir``, or ``_work`` inside the output."""
        return (self.work_dir or self.default_work_url).rstrip("/")

    @property
    def send_bytes(self) -> int:
        """What a task buffers of the rows it sends before writing them out as a run: more only saves
        ranged reads, so it stays at SEND_BUFFER_BYTES however large ``spill_bytes`` is."""
        return min(self.spill_bytes, SEND_BUFFER_BYTES)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> DedupConfig:
        """Build from a TOML job file's table (unknown keys are an error naming them)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise DedupError(f"unknown job option(s): {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        return cls(**dict(values))


def index_params(config: DedupConfig) -> IndexParams:
    """The hashing parameters of the job (its signature index records them); DedupError when impossible."""
    try:
        return params_for(config.threshold, config.num_perm, config.ngram, bands=config.bands, rows=config.rows,
                          seed=config.seed, verify=config.verify)
    except ParamsError as exc:
        raise DedupError(str(exc)) from None


def _absolute(url: str) -> str:
    """A local folder as an absolute path; a store's URL as it is."""
    return url if "://" in url else os.path.abspath(url)
