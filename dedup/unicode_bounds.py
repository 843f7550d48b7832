"""Unicode hazards of normalisation: invisible characters and unbounded runs of combining marks.

- Default-ignorable code points (Unicode's ``Default_Ignorable_Code_Point``: soft hyphen, zero-width
  space and joiners, word joiner, BOM, bidi controls, variation selectors, tag characters, ...) render
  as nothing, so a copy sprinkled with them looks identical yet hashes apart; they are removed.
- NFKC puts each run of non-starters (combining marks) in canonical order with an insertion sort, so a
  run of n marks of alternating classes costs O(n^2) (a 320 KB run took ~24 s). UAX #15's stream-safe
  text format bounds every run: after 30 non-starters a COMBINING GRAPHEME JOINER (U+034F, itself
  default-ignorable, so removed again after NFKC) starts a new run. Real text never has such runs, so
  a cheap scan leaves ordinary documents untouched and only long runs take the per-character path.
"""

from __future__ import annotations

import functools
import unicodedata

import numpy as np

# Default_Ignorable_Code_Point, DerivedCoreProperties.txt (unchanged from Unicode 14 to 16).
DEFAULT_IGNORABLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
    (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
    (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)
# UAX #15: a stream-safe text has at most this many non-starters in a row.
MAX_NON_STARTERS = 30
CGJ = "\u034f"


IGNORABLE = 1  # flags of ``code_point_flags``
LEADS_WITH_MARK = 2


@functools.cache
def _tables() -> tuple[np.ndarray, dict[str, tuple[int, int, bool]], int]:
    """Built once per process from ``unicodedata`` over planes 0-3 and 14 (the others hold no mark and
    no decomposition):

    - the flags of every code point (``IGNORABLE``; ``LEADS_WITH_MARK`` when its NFKD decomposition
      starts with a non-starter);
    - per character whose decomposition starts or ends with non-starters: (leading count, trailing
      count, whether it is non-starters only), UAX #15's counts;
    - the shortest run of ``LEADS_WITH_MARK`` characters that can exceed ``MAX_NON_STARTERS``, even
      after a character with the most trailing non-starters.
    """
    flags = np.zeros(0x110000, dtype=np.uint8)
    for lo, hi in DEFAULT_IGNORABLE_RANGES:
        flags[lo : hi + 1] = IGNORABLE
    counts: dict[str, tuple[int, int, bool]] = {}
    for cp in (*range(0x40000), *range(0xE0000, 0xE1000)):
        ch = chr(cp)
        if not unicodedata.combining(ch) and not unicodedata.decomposition(ch):
            continue
        marks = [unicodedata.combining(c) != 0 for c in unicodedata.normalize("NFKD", ch)]
        leading = next((i for i, m in enumerate(marks) if not m), len(marks))
        trailing = next((i for i, m in enumerate(reversed(marks)) if not m), len(marks))
        if leading or trailing:
            counts[ch] = (leading, trailing, leading == len(marks))
        if leading:
            flags[cp] |= LEADS_WITH_MARK
    flags.flags.writeable = False
    most_leading = max(lead for lead, _, _ in counts.values())
    most_trailing = max(trail for _, trail, _ in counts.values())
    return flags, counts, (MAX_NON_STARTERS - most_trailing) // most_leading + 1


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def remove_ignorables(text: str) -> str:
    """``text`` without its default-ignorable code points."""
    if text.isascii():
        return text
    points = _code_points(text)
    keep = (_tables()[0][points] & IGNORABLE) == 0
    return text if keep.all() else points[keep].tobytes().decode("utf-32-le", "surrogatepass")


def stream_safe(text: str) -> str:
    """``text`` in UAX #15's stream-safe format: a CGJ after every ``MAX_NON_STARTERS`` non-starters
    (counted in the NFKD decomposition), so NFKC's reordering stays linear in the text's length.
    Only runs long enough to need one take the per-character path."""
    if text.isascii():
        return text
    flags, counts, shortest = _tables()
    marks = np.concatenate(([False], (flags[_code_points(text)] & LEADS_WITH_MARK) != 0, [False]))
    edges = np.diff(marks.view(np.int8))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    long = ends - starts >= shortest
    if not long.any():
        return text
    pieces: list[str] = []
    done = 0
    for run_start, run_end in zip(starts[long].tolist(), ends[long].tolist(), strict=True):
        start = max(run_start - 1, 0)  # the character before the run may end with non-starters
        pieces.append(text[done:start])
        run = 0
        for ch in text[start:run_end]:
            leading, trailing, marks_only = counts.get(ch, (0, 0, False))
            if run + leading > MAX_NON_STARTERS:
                pieces.append(CGJ)
                run = 0
            pieces.append(ch)
            run = run + leading if marks_only else trailing
        done = run_end
    pieces.append(text[done:])
    return "".join(pieces)


def bounded(strings: list[str], ignorables: bool, safe: bool) -> tuple[list[str], list[int]]:
    """The batch with default-ignorables removed (``ignorables``) and in stream-safe format (``safe``),
    and the documents that got a CGJ (to remove again after NFKC).

    One compiled pass over the batch finds the few documents that hold an ignorable or a run of marks
    long enough to matter; only those are rewritten, so ordinary text pays a UTF-8 encode and one
    look-up a non-ASCII character.
    """
    if all(s.isascii() for s in strings):
        return strings, []
    from . import _kernels as K  # on first use: see dedup/_constants.py

    flags, _, shortest = _tables()
    offsets = np.zeros(len(strings) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in strings], out=offsets[1:])
    data = np.frombuffer("".join(strings).encode("utf-8", "surrogatepass"), dtype=np.uint8)
    has_ignorable, has_long_run = K.unicode_hazards(data, offsets, flags,
                                                    IGNORABLE if ignorables else 0, LEADS_WITH_MARK, shortest)
    out = list(strings)
    for i in np.flatnonzero(has_ignorable).tolist():
        out[i] = remove_ignorables(out[i])
    made_safe = np.flatnonzero(has_long_run).tolist() if safe else []
    for i in made_safe:
        out[i] = stream_safe(out[i])
    return out, made_safe
