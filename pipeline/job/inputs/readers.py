"""One piece of one file read as documents and rejects, whatever its format."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from gristmill.pipeline.job.inputs.faults import after_failure, fault_class, raise_storage_fault
from gristmill.pipeline.job.inputs.jsonl import read_jsonl
from gristmill.pipeline.job.inputs.parquet import read_parquet
from gristmill.pipeline.job.inputs.records import (
    Doc,
    InputFile,
    Piece,
    ReadOptions,
    Reject,
    describe,
    file_reject,
)
from gristmill.pipeline.job.inputs.warc import read_warc

READERS = {"jsonl": read_jsonl, "parquet": read_parquet, "warc": read_warc}


def read_file(item: InputFile, options: ReadOptions,
              storage_options: Mapping[str, Any] | None = None) -> Iterator[Doc | Reject]:
    """Every record of one whole file, as documents or rejects; never raises for bad content."""
    return read_piece(Piece(item), options, storage_options)


def read_piece(piece: Piece, options: ReadOptions,
               storage_options: Mapping[str, Any] | None = None) -> Iterator[Doc | Reject]:
    """Every record that starts in one piece of a file, as documents or rejects, with the positions
    (line, row, byte offset) a whole read gives; never raises for bad content.

    A storage fault is not bad content (``faults``): a transient one (a throttle, a reset) reads the
    piece again with backoff, passing over the records already given (a read is deterministic); a
    missing file, or one still failing after the retries, raises ``InputUnreadable`` naming it, which
    fails the job rather than lose its documents. (A shard a corpus's manifest lists and that is gone
    is that corpus's damage: one reject counting the rows the manifest gives it.) What else escapes
    the readers (they isolate each record) ends the piece with one "corrupt" reject for what was not
    read. What concerns the whole file (a Parquet footer or text column that cannot be used) is
    reported by its first piece alone, so a cut file's rejects count as a whole one's.
    """
    given = 0  # records yielded so far, by any try
    for number in itertools.count():
        try:
            for record in itertools.islice(_records(piece, options, storage_options), given, None):
                given += 1
                yield record
            return
        except Exception as exc:  # noqa: BLE001 - after_failure re-raises what is not a storage fault
            after_failure(piece.file.url, exc, number)


def _records(piece: Piece, options: ReadOptions, storage_options: Mapping[str, Any] | None) -> Iterator[Doc | Reject]:
    item, accounted = piece.file, 0
    try:
        for record in READERS[item.kind](piece, options, storage_options):
            accounted += record.count if isinstance(record, Reject) else 1
            yield record
    except Exception as exc:  # noqa: BLE001 - whatever it is, the job goes on with the next file
        if item.rows is None or fault_class(exc) != "missing":  # a corpus's gone shard: its manifest's rows
            raise_storage_fault(exc)
        if accounted and piece.whole:
            yield file_reject(item, f"after record {accounted}", "corrupt",
                               f"reading stopped ({describe(exc)}); the rest of the file is lost", 0, accounted)
        elif accounted:
            yield Reject(item.source, f"after record {accounted} from byte {piece.start}", "corrupt",
                         f"reading stopped ({describe(exc)}); the rest of bytes {piece.start}-{piece.end or item.size} "
                         "is lost; its record count is unknown, counted as one", 0)
        elif piece.start == 0:
            yield file_reject(item, "file", "corrupt", f"unreadable file ({describe(exc)})", item.size)
