"""Text normalisation for hashing, and exact content hashes.

Two documents that differ only in Unicode form, letter case, punctuation, spacing (or, optionally,
digits) should hash alike, and so should two that differ only in characters nobody sees.
``normalize`` applies, in this order and each switchable:

0. ``ignorables``: every default-ignorable code point (soft hyphen, zero-width space and joiners, word
   joiner, BOM, tag characters, ...; ``unicode_bounds``) is removed.
1. ``nfkc``: Unicode NFKC (compatibility forms: full-width letters, ligatures, non-breaking spaces),
   of the text in UAX #15's stream-safe format, so a long run of combining marks costs linear time.
2. ``casefold``: ``str.casefold`` (stronger than lower-casing: ``Straße`` -> ``strasse``).
3. ``punctuation``: every punctuation or symbol character (general category ``P*`` or ``S*``) becomes a
   space, so ``end.Start`` still splits into two words.
4. ``digits`` (off by default): every decimal digit (category ``Nd``) becomes ``0``.
5. ``whitespace``: every run of white space (``str.isspace``) becomes one space; none at either end.

A text with nothing left but white space after steps 0-1 is blank (``is_blank``): the job rejects
it as ``empty`` and the service refuses it, so a text of invisible characters is no document.

Steps 1-2 use CPython's C implementations; steps 3-5 run compiled over the UTF-8 bytes of a whole
batch with a code point class table built once per process from ``unicodedata`` (so the result
follows the Unicode version of the running Python). ``prefold_batch`` (the job's read stage) and
``normalize_batch`` (the span pass's) run steps 0-2 compiled too, from a per-code-point table, for
every text whose characters NFKC cannot join to their neighbours (``char_folds``), and hand the rest
to CPython's: the same bytes, tested against every code point and with hypothesis.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import xxhash

from . import _constants as C
from .unicode_bounds import CGJ, DEFAULT_IGNORABLE_RANGES, bounded

# Scripts written without spaces between words: documents mostly in these get character shingles.
NO_SPACE_RANGES: tuple[tuple[int, int], ...] = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x0F00, 0x0FFF),  # Tibetan
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0x3400, 0x4DBF),  # CJK extension A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFF66, 0xFF9F),  # half-width Katakana
    (0x20000, 0x323AF),  # CJK extensions B-H
)

Texts = Sequence[str] | pa.Array | pa.ChunkedArray


@dataclass(frozen=True)
class NormalizeOptions:
    """Which normalisation steps run (see the module docstring for what each one does)."""

    nfkc: bool = True
    casefold: bool = True
    whitespace: bool = True
    punctuation: bool = True
    digits: bool = False
    ignorables: bool = True


DEFAULT_NORMALIZE = NormalizeOptions()


@functools.cache
def class_table() -> np.ndarray:
    """The class of every code point (``_constants.CLASS_*``), built once per process.

    Only planes 0-3 and the tag/variation-selector block of plane 14 hold white space, punctuation,
    symbols or digits; the rest of the code space is unassigned or private use and stays ``OTHER``.
    """
    table = np.zeros(0x110000, dtype=np.uint8)
    for cp in (*range(0x40000), *range(0xE0000, 0xE1000)):
        ch = chr(cp)
        if ch.isspace():
            table[cp] = C.CLASS_SPACE
            continue
        category = unicodedata.category(ch)
        if category[0] in "PS":
            table[cp] = C.CLASS_PUNCT
        elif category == "Nd":
            table[cp] = C.CLASS_DIGIT
    for lo, hi in NO_SPACE_RANGES:
        block = table[lo : hi + 1]
        block[block == C.CLASS_OTHER] = C.CLASS_NOSPACE
    table.flags.writeable = False
    return table


def as_strings(texts: Texts) -> list[str]:
    """The documents as a list of str; a null or non-str entry is an error naming its position."""
    if isinstance(texts, pa.ChunkedArray | pa.Array):
        texts = texts.to_pylist()
    strings = list(texts)
    for i, text in enumerate(strings):
        if not isinstance(text, str):
            kind = "null" if text is None else f"a {type(text).__name__}, not str"
            raise TypeError(f"document {i} is {kind}")
    return strings


def prefold(strings: list[str], options: NormalizeOptions) -> list[str]:
    """Steps 0-2 (default-ignorables removed, NFKC, case folding) on every document."""
    if options.ignorables or options.nfkc:
        strings, made_safe = bounded(strings, options.ignorables, options.nfkc)
    if options.nfkc:
        strings = [unicodedata.normalize("NFKC", s) for s in strings]
        for i in made_safe:  # without the CGJs that made the text stream-safe (default-ignorable, see step 0)
            strings[i] = strings[i].replace(CGJ, "")
    if options.casefold:
        strings = [s.casefold() for s in strings]
    return strings


@functools.cache
def char_folds(ignorables: bool, nfkc: bool, casefold: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 0-2 per code point, for the compiled ``prefold`` (``prefold_batch``), built once per process:
    its kind (``_constants.KEEP``, ``MAPPED``, ``CONTEXT``) and, for the mapped ones, their folded UTF-8
    bytes (``pool[starts[cp]:starts[cp + 1]]``).

    A character folds on its own (not ``CONTEXT``) when NFKC cannot join it to what precedes it: its
    decomposition starts with a starter (combining class 0) that is no second half of a canonical
    composition (nor a Hangul vowel or final jamo). A text of such characters is NFKC-normalised
    character by character (decomposing one reorders nothing across it, composing joins nothing across
    it); removing ignorables and case folding work character by character anyway. Planes 4-13 and
    15-16 hold no decomposition, no mark and no case: their characters are kept.
    """
    kind = np.full(0x110000, C.KEEP, dtype=np.uint8)
    # every code point but the surrogates and the newline, joined by newlines: a newline is a wall for
    # NFD, NFKD, NFKC and case folding (tests/test_dedup_spans.py), so one C call folds them all
    points = [*range(0x0A), *range(0x0B, 0xD800), *range(0xE000, 0x40000), *range(0xE0000, 0xE1000)]
    chars = [chr(cp) for cp in points]
    joined = "\n".join(chars)
    seconds = {*range(0x1161, 0x1176), *range(0x11A8, 0x11C3)}  # Hangul vowels and final consonants
    for ch, canonical in zip(chars, unicodedata.normalize("NFD", joined).split("\n"), strict=True):
        if canonical != ch and len(parts := unicodedata.decomposition(ch).split()) == 2:
            seconds.add(int(parts[1], 16))
    folded = unicodedata.normalize("NFKC", joined) if nfkc else joined
    folded = folded.casefold() if casefold else folded
    firsts = [text[0] for text in unicodedata.normalize("NFKD", joined).split("\n")] if nfkc else chars
    ignorable = {cp for lo, hi in DEFAULT_IGNORABLE_RANGES for cp in range(lo, hi + 1)} if ignorables else set()
    mapped: dict[int, bytes] = {}
    for cp, ch, first, out in zip(points, chars, firsts, folded.split("\n"), strict=True):
        if cp in ignorable:
            mapped[cp] = b""
        elif nfkc and (unicodedata.combining(first) or ord(first) in seconds):
            kind[cp] = C.CONTEXT
        elif out != ch:
            mapped[cp] = out.encode()
    starts = np.zeros(0x110001, dtype=np.int32)  # the pool holds some 20 KB
    lengths = np.zeros(0x110000, dtype=np.int32)
    for cp, folded in mapped.items():
        kind[cp] = C.MAPPED
        lengths[cp] = len(folded)
    np.cumsum(lengths, out=starts[1:])
    pool = np.frombuffer(b"".join(mapped[cp] for cp in sorted(mapped)), dtype=np.uint8)
    for array in (kind, starts, pool):
        array.flags.writeable = False
    return kind, starts, pool


def prefold_batch(array: pa.LargeStringArray, options: NormalizeOptions) -> tuple[np.ndarray, np.ndarray]:
    """``prepare`` of an Arrow batch: compiled for the documents whose characters all fold on their own
    (``char_folds``), the interpreter's ``prefold`` for the others; the same bytes either way."""
    from . import _kernels as K  # on first use: see dedup/_constants.py

    data, offsets = utf8_buffers(array)
    out, out_offsets, others = K.prefold_context_free(data, offsets, *char_folds(options.ignorables, options.nfkc,
                                                                                   options.casefold))
    if others.any():
        rows = np.flatnonzero(others)
        out, out_offsets = K.splice(out, out_offsets, *prepare(array.take(pa.array(rows)), options), rows)
    out.flags.writeable = False
    return out, out_offsets


def normalize_batch(array: pa.LargeStringArray, options: NormalizeOptions) -> tuple[np.ndarray, np.ndarray]:
    """Steps 0-5 of an Arrow batch, the normalised texts one after the other with their offsets: in one
    compiled pass for the texts whose characters all fold on their own (``char_folds``), through the
    interpreter's ``prefold`` for the others; the same bytes either way."""
    from . import _kernels as K  # on first use: see dedup/_constants.py

    data, offsets = utf8_buffers(array)
    out, out_offsets, others = normalize_ranges(data, offsets[:-1], offsets[1:], options)
    if others.any():
        rows = np.flatnonzero(others)
        out, out_offsets = K.splice(out, out_offsets, *fold_prepared(*prepare(array.take(pa.array(rows)), options),
                                                                     options), rows)
    return out, out_offsets


def normalize_ranges(data: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     options: NormalizeOptions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 0-5 of each byte range ``starts[i]:ends[i]`` of UTF-8 ``data`` on its own, compiled: the
    normalised ranges with their offsets, and which ranges hold a character that needs its neighbours
    (left empty: the caller folds those through ``prefold``)."""
    from . import _kernels as K  # on first use: see dedup/_constants.py

    folds = char_folds(options.ignorables, options.nfkc, options.casefold)
    widest = _widest_fold(options.ignorables, options.nfkc, options.casefold)
    room = int((ends - starts).sum())
    while True:
        out, offsets, context = K.normalize_ranges(data, starts, ends, *folds, widest, class_table(),
                                                   options.punctuation, options.digits, options.whitespace, room)
        if offsets is not None:
            return out, offsets, context
        room *= 2


@functools.cache
def _widest_fold(ignorables: bool, nfkc: bool, casefold: bool) -> int:
    """The most UTF-8 bytes steps 0-5 write for one character: its longest folded form (or a 4-byte
    character kept as it is) and a pending space before it; once per process, not per batch."""
    starts = char_folds(ignorables, nfkc, casefold)[1]
    return max(4, int(np.diff(starts).max())) + 1


def is_blank(prefolded: str) -> bool:
    """Whether a text passed through ``prefold`` has nothing left but white space."""
    return not prefolded or prefolded.isspace()


def utf8_batch(strings: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes of all documents in one array, with int64 offsets (``n + 1`` of them)."""
    try:
        array = pa.array(strings, type=pa.large_string())
    except (pa.ArrowInvalid, UnicodeEncodeError):
        for i, s in enumerate(strings):
            try:
                s.encode("utf-8")
            except UnicodeEncodeError as err:
                raise ValueError(f"document {i} is not valid Unicode: {err}") from None
        raise
    return utf8_buffers(array)


def utf8_buffers(array: pa.LargeStringArray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes and int64 offsets (``n + 1``) of a large_string array, without a copy."""
    _, offsets_buf, data_buf = array.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int64)[array.offset : array.offset + len(array) + 1]
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    data.flags.writeable = False  # always the same array type, so numba compiles each kernel once
    return data, offsets


def prepare(texts: Texts, options: NormalizeOptions) -> tuple[np.ndarray, np.ndarray]:
    """Steps 0-2 applied and the batch encoded: the input of the compiled kernels."""
    return utf8_batch(prefold(as_strings(texts), options))


def fold_prepared(
    data: np.ndarray, offsets: np.ndarray, options: NormalizeOptions
) -> tuple[np.ndarray, np.ndarray]:
    """Steps 3-5 on a prepared batch: the fully normalised UTF-8 bytes and their offsets."""
    from . import _kernels as K  # on first use: see dedup/_constants.py

    return K.fold(data, offsets, class_table(), options.punctuation, options.digits, options.whitespace)


def normalize(text: str, options: NormalizeOptions = DEFAULT_NORMALIZE) -> str:
    """The normalised form of one text (the exact input of ``content_hash``)."""
    data, offsets = fold_prepared(*prepare([text], options), options)
    return data[: offsets[1]].tobytes().decode("utf-8")


def hashes_of_folded(data: np.ndarray, offsets: np.ndarray) -> list[str]:
    """32-hex xxh3-128 of every document of an already normalised batch."""
    view = memoryview(data)
    bounds = offsets.tolist()
    return [xxhash.xxh3_128_hexdigest(view[bounds[i] : bounds[i + 1]]) for i in range(len(bounds) - 1)]


def content_hashes(texts: Texts, options: NormalizeOptions = DEFAULT_NORMALIZE) -> list[str]:
    """32-hex xxh3-128 of each normalised text: equal exactly when the normalised texts are equal."""
    return hashes_of_folded(*fold_prepared(*prepare(texts, options), options))


def content_hash(text: str, options: NormalizeOptions = DEFAULT_NORMALIZE) -> str:
    """32-hex xxh3-128 of one normalised text."""
    return content_hashes([text], options)[0]
