"""Input discovery and parsing for ``gristmill dedup``: Parquet, JSONL (plain, .gz, .zst), WARC, corpora.

One module a job: ``discover`` (INPUT arguments to files), ``splits`` (the split planner), ``records``
(the types and shared helpers), ``streams`` (decompression, bounded lines), one module per format
(``jsonl``, ``parquet``, ``warc``), ``readers`` (a piece read whatever its format) and ``faults`` (a
storage fault told from damaged data).

Every record a file holds comes out of :func:`read_piece` as either a :class:`Doc` or a
:class:`Reject` naming the file and the position (line, row or byte offset), so a malformed line, a
truncated stream or a corrupt Parquet file is accounted for and never stops the job. Files are cut
into :class:`Split` s of :class:`Piece` s (deterministic: sorted names, a byte budget per split; an
uncompressed file may be cut, a compressed one is whole) that the job processes in parallel; a
piece reads the records that start in its byte range, with the positions a whole read gives. A
document's key is ``split << 32 | ordinal``, so key order is input order whatever the split size.

How damage is counted (the job's identity kept + exact + near + rejected = input rests on it):

- A record whose decoding fails in any way is one reject at its position; reading goes on with the
  next record (JSONL: the next line; Parquet: the next row or row group; WARC: the next line that
  starts a record, so a damaged record never merges into its neighbour).
- A compressed stream that ends without its proper end (a truncated .gz or .zst) or breaks off
  (corrupt data) keeps the records read whole before the damage; the unreadable rest is one
  ``corrupt`` reject naming the last line (or byte offset) read whole.
- A WARC record is checked against its Content-Length, the empty lines that must follow it, and its
  WARC-Block-Digest / WARC-Payload-Digest when present; a record that fails is one ``corrupt`` reject.
- A Parquet row group that cannot be decoded counts its rows; a file whose footer cannot be read is one
  reject for the file: a corpus shard counts the rows its manifest lists, any other file counts one
  (its record count is unknown, and the reason says so).
- A storage fault is no damage (``faults``): a throttle, a reset or a timeout is retried; a file that is
  missing, refused, or still failing after the retries raises :class:`InputUnreadable` naming it, and
  the job stops rather than lose its documents.
"""

from gristmill.pipeline.job.inputs.discover import COMPRESSIONS, JSONL_SUFFIXES, classify, resolve_inputs
from gristmill.pipeline.job.inputs.faults import InputUnreadable
from gristmill.pipeline.job.inputs.readers import read_file, read_piece
from gristmill.pipeline.job.inputs.records import (
    KEY_BITS,
    Doc,
    InputError,
    InputFile,
    Piece,
    ReadOptions,
    Reject,
    Split,
    domain_of,
    generated_id,
)
from gristmill.pipeline.job.inputs.splits import (
    SPLIT_MAX_PIECES,
    count_newlines,
    cuttable,
    fetch_counted,
    needs_line_count,
    number_lines,
    plan_splits,
)
from gristmill.pipeline.job.inputs.streams import RAW_RECORD_EXPANSION

__all__ = [
    "COMPRESSIONS", "JSONL_SUFFIXES", "KEY_BITS", "RAW_RECORD_EXPANSION", "SPLIT_MAX_PIECES", "Doc", "InputError",
    "InputFile", "InputUnreadable", "Piece", "ReadOptions", "Reject", "Split", "classify", "count_newlines", "cuttable", "fetch_counted", "domain_of",
    "generated_id", "needs_line_count", "number_lines", "plan_splits", "read_file", "read_piece", "resolve_inputs",
]
