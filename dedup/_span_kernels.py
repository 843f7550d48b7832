"""Compiled (numba) inner loops of span splitting and hashing (``gristmill.dedup.spans``).

All of them run over the UTF-8 bytes of a whole batch (one ``uint8`` array, ``int64`` offsets), so no
per-line or per-span work runs in the interpreter:

- ``scan``: where every span lies (byte and code point offsets), with the rules of the module
  docstring of ``spans`` (the regular expressions there are the reference, ``tests/span_reference.py``);
- ``mark`` / ``locate``: the batch with a newline inserted at every span boundary that has none, so the
  whole documents can be normalised at once (a newline never takes part in NFKC, case folding or the
  removal of ignorables, so the normalised document splits there exactly as its pieces would), and
  where each span lies in the normalised batch;
- ``xxh64``: XXH64 (seed 0) of byte ranges, bit for bit the reference algorithm (``xxhash.xxh64``),
  reading bytes one by one so the result is the same on every platform.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._constants import CLASS_SPACE
from ._kernels import _U29, _U32, _U33, _decode

LINE, PARAGRAPH, SENTENCES = 0, 1, 2  # span modes
_NEWLINE = 0x0A
_P1 = np.uint64(11400714785074694791)
_P2 = np.uint64(14029467366897019727)
_P3 = np.uint64(1609587929392839161)
_P4 = np.uint64(9650029242287828579)
_P5 = np.uint64(2870177450012600261)
_V4_SEED = np.uint64((-11400714785074694791) % 2**64)  # seed 0 - P1, modulo 2**64
_V1_SEED = np.uint64((11400714785074694791 + 14029467366897019727) % 2**64)
_U8 = np.uint64(8)
_U64 = np.uint64(64)


@njit(cache=True, inline="always")
def _is_latin_end(cp):
    return cp == 0x2E or cp == 0x21 or cp == 0x3F or cp == 0x2026  # . ! ? …


@njit(cache=True, inline="always")
def _is_cjk_end(cp):
    return cp == 0x3002 or cp == 0xFF01 or cp == 0xFF1F or cp == 0x0964 or cp == 0x061F or cp == 0x06D4  # 。！？।؟۔


@njit(cache=True, inline="always")
def _is_closer(cp):
    # " ' ” ’ » ) ] ） 」 』 】 〕 》 〉
    return (cp == 0x22 or cp == 0x27 or cp == 0x201D or cp == 0x2019 or cp == 0xBB or cp == 0x29 or cp == 0x5D
            or cp == 0xFF09 or cp == 0x300D or cp == 0x300F or cp == 0x3011 or cp == 0x3015 or cp == 0x300B
            or cp == 0x3009)


@njit(cache=True, inline="always")
def _is_hspace(cp):
    return cp == 0x20 or cp == 0x09 or cp == 0x0D or cp == 0x0C or cp == 0x0B  # [ \t\r\f\v]


@njit(cache=True, inline="always")
def _skip_closers(data, i, end):
    """Past a run of closing quotes and brackets from byte ``i``: (byte, code points passed)."""
    n = 0
    while i < end:
        cp, size = _decode(data, i)
        if not _is_closer(cp):
            break
        i += size
        n += 1
    return i, n


@njit(cache=True, inline="always")
def _skip_hspace(data, i, end):
    n = 0
    while i < end and _is_hspace(np.int64(data[i])):
        i += 1
        n += 1
    return i, n


@njit(cache=True)
def _sentence_end(data, i, cp, end, table):
    """The end of the sentence starting at byte ``i`` (code point ``cp``), before byte ``end`` (the
    document's end): (byte, code point, whether the sentence is white space only). A sentence ends at
    the latest after the newline that ends its line."""
    blank = True
    while i < end:
        byte = data[i]
        if byte == _NEWLINE:
            return i + 1, cp + 1, blank
        if byte < 0x80 and byte != 0x2E and byte != 0x21 and byte != 0x3F:  # ASCII, no full stop
            if blank and table[byte] != CLASS_SPACE:
                blank = False
            i += 1
            cp += 1
            continue
        c, size = _decode(data, i)
        if _is_latin_end(c) or _is_cjk_end(c):
            latin = _is_latin_end(c)
            r, rcp = i, cp
            while r < end:  # the run of full stops of the same kind
                c2, size2 = _decode(data, r)
                if not (_is_latin_end(c2) if latin else _is_cjk_end(c2)):
                    break
                r += size2
                rcp += 1
            r, passed = _skip_closers(data, r, end)
            rcp += passed
            if latin and r < end:
                c2, _ = _decode(data, r)
                if not (_is_hspace(c2) or c2 == _NEWLINE):
                    i, cp = r, rcp  # not a sentence end: none inside this run either
                    blank = False
                    continue
            r, passed = _skip_hspace(data, r, end)
            rcp += passed
            if r < end and data[r] == _NEWLINE:
                r += 1
                rcp += 1
            return r, rcp, False
        if table[c] != CLASS_SPACE:
            blank = False
        i += size
        cp += 1
    return i, cp, blank


@njit(cache=True)
def _line_end(data, i, cp, end, table):
    """The end of the line starting at byte ``i`` (after its newline): (byte, code point, blank)."""
    blank = True
    while i < end and blank:
        if data[i] == _NEWLINE:
            return i + 1, cp + 1, True
        c, size = _decode(data, i)
        i += size
        cp += 1
        if table[c] != CLASS_SPACE:
            blank = False
    while i < end:  # once not blank, only the newline and the number of code points matter
        byte = data[i]
        i += 1
        if byte == _NEWLINE:
            return i, cp + 1, blank
        if (byte & 0xC0) != 0x80:
            cp += 1
    return i, cp, blank


@njit(cache=True)
def _paragraph_end(data, i, end, table):
    """The end of the paragraph whose first character starts at byte ``i`` and whose document has no
    character but white space from byte ``end``: after the blank line(s) and the white space following
    them up to the start of the next paragraph's line (its indent is its own), or -1: the document's end."""
    _, size = _decode(data, i)
    i += size
    while i < end:
        if data[i] == _NEWLINE:
            r, _ = _skip_hspace(data, i + 1, end)
            if r < end and data[r] == _NEWLINE:
                line = r
                while True:  # the white space up to the next paragraph (there is one: r < end)
                    c, size = _decode(data, r)
                    if table[c] != CLASS_SPACE:
                        return line
                    r += size
                    if c == _NEWLINE:
                        line = r
        _, size = _decode(data, i)
        i += size
    return -1


@njit(cache=True)
def _scan_document(data, first, last, table, mode, group, d, fill, count, doc, spans):
    """Spans of document ``d`` (bytes ``first:last``) from row ``count`` of ``doc`` and ``spans`` (start
    byte, end byte, start code point, end code point); written only with ``fill``. Returns the new count."""
    i, cp = first, 0
    if mode == PARAGRAPH:
        tail = first  # after the last character that is not white space
        while i < last:
            c, size = _decode(data, i)
            i += size
            if table[c] != CLASS_SPACE:
                tail = i
        # a paragraph starts at the start of its first line: its indent, left behind by a cut, would join
        # what follows
        i = start = first
        start_cp = 0
        while i < tail:
            c, size = _decode(data, i)
            if table[c] == CLASS_SPACE:
                i += size
                cp += 1
                if c == _NEWLINE:
                    start, start_cp = i, cp
                continue
            stop = _paragraph_end(data, i, tail, table)
            stop = last if stop < 0 else stop
            stop_cp = start_cp
            j = start
            while j < stop:
                if (data[j] & 0xC0) != 0x80:
                    stop_cp += 1
                j += 1
            if fill:
                doc[count] = d
                spans[count, 0], spans[count, 1], spans[count, 2], spans[count, 3] = (start - first, stop - first,
                                                                                      start_cp, stop_cp)
            count += 1
            i = start = stop
            cp = start_cp = stop_cp
        return count
    while i < last:
        if mode == LINE:
            stop, stop_cp, blank = _line_end(data, i, cp, last, table)
            if not blank:
                if fill:
                    doc[count] = d
                    spans[count, 0], spans[count, 1], spans[count, 2], spans[count, 3] = (i - first, stop - first,
                                                                                          cp, stop_cp)
                count += 1
            i, cp = stop, stop_cp
            continue
        stop, stop_cp, blank = i, cp, True  # ``group`` sentences at a time, from the start of each line
        for _ in range(group):
            stop, stop_cp, piece_blank = _sentence_end(data, stop, stop_cp, last, table)
            blank = blank and piece_blank
            if stop >= last or data[stop - 1] == _NEWLINE:  # a sentence never crosses a line's end
                break
        if not blank:
            # a span that starts inside its line leaves the line's newline: cut, it would join what is
            # left of the line to the next one
            inside = i > first and data[i - 1] != _NEWLINE and data[stop - 1] == _NEWLINE
            if fill:
                doc[count] = d
                spans[count, 0], spans[count, 1] = i - first, stop - first - inside
                spans[count, 2], spans[count, 3] = cp, stop_cp - inside
            count += 1
        i, cp = stop, stop_cp
    return count


@njit(cache=True)
def scan(data, offsets, table, mode, group):
    """Every span of a batch: (document, (n, 4) array of start byte, end byte, start code point, end code
    point, bytes relative to the document). Blank spans (white space only) are left out."""
    n = offsets.shape[0] - 1
    doc = np.empty(0, dtype=np.int64)
    spans = np.empty((0, 4), dtype=np.int64)
    total = 0  # counted first, then written: no guess at the number of spans
    for d in range(n):
        total = _scan_document(data, offsets[d], offsets[d + 1], table, mode, group, d, False, total, doc, spans)
    doc = np.empty(total, dtype=np.int64)
    spans = np.empty((total, 4), dtype=np.int64)
    count = 0
    for d in range(n):
        count = _scan_document(data, offsets[d], offsets[d + 1], table, mode, group, d, True, count, doc, spans)
    return doc, spans


@njit(cache=True)
def mark(data, offsets, doc, spans):
    """The batch with a newline inserted at every span boundary not already after one (nor at either end
    of its document), and per span where its ends lie in it: the number of newlines before each end
    (-1: the document's end) and whether a newline was inserted at its end."""
    n = offsets.shape[0] - 1
    m = doc.shape[0]
    out = np.empty(data.shape[0] + 2 * m, dtype=np.uint8)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    lines = np.empty((m, 2), dtype=np.int64)
    inserted = np.zeros(m, dtype=np.bool_)
    o = 0
    s = 0
    for d in range(n):
        first, last = offsets[d], offsets[d + 1]
        i, newlines, marked_at = first, 0, -1
        while s < m and doc[s] == d:
            for side in range(2):
                p = first + spans[s, side]
                while i < p:  # copy up to the boundary, counting newlines
                    if data[i] == _NEWLINE:
                        newlines += 1
                    out[o] = data[i]
                    o += 1
                    i += 1
                if p == last:
                    lines[s, side] = -1
                    continue
                if p > first and data[p - 1] != _NEWLINE and marked_at != p:
                    out[o] = _NEWLINE
                    o += 1
                    newlines += 1
                    marked_at = p
                if side == 1 and marked_at == p:
                    inserted[s] = True
                lines[s, side] = newlines
            s += 1
        while i < last:
            out[o] = data[i]
            o += 1
            i += 1
        out_offsets[d + 1] = o
    return out[:o], out_offsets, lines, inserted


@njit(cache=True)
def locate(data, offsets, doc, lines, inserted):
    """Per span, its start and end bytes in the normalised marked batch (see ``mark``): right after the
    newline numbered by ``lines``, without the newline ``mark`` inserted at its end."""
    m = doc.shape[0]
    starts = np.empty(m, dtype=np.int64)
    ends = np.empty(m, dtype=np.int64)
    current, i, newlines = -1, 0, 0
    for s in range(m):
        d = doc[s]
        if d != current:
            current, i, newlines = d, offsets[d], 0
        for side in range(2):
            k = lines[s, side]
            if k < 0:
                position = offsets[d + 1]
            else:
                while newlines < k:
                    if data[i] == _NEWLINE:
                        newlines += 1
                    i += 1
                position = i
            if side == 0:
                starts[s] = position
            else:
                ends[s] = position - 1 if inserted[s] else position
    return starts, ends


@njit(cache=True, inline="always")
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> (_U64 - np.uint64(r)))


@njit(cache=True, inline="always")
def _read(data, i, size):
    v = np.uint64(0)
    for k in range(size):
        v |= np.uint64(data[i + k]) << (_U8 * np.uint64(k))
    return v


@njit(cache=True, inline="always")
def _round(acc, lane):
    acc += lane * _P2
    return _rotl(acc, 31) * _P1


@njit(cache=True, inline="always")
def _merge(acc, v):
    acc ^= _round(np.uint64(0), v)
    return acc * _P1 + _P4


@njit(cache=True)
def _xxh64(data, i, end):
    length = end - i
    if length >= 32:
        v1, v2, v3, v4 = _V1_SEED, _P2, np.uint64(0), _V4_SEED
        while i + 32 <= end:
            v1 = _round(v1, _read(data, i, 8))
            v2 = _round(v2, _read(data, i + 8, 8))
            v3 = _round(v3, _read(data, i + 16, 8))
            v4 = _round(v4, _read(data, i + 24, 8))
            i += 32
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        h = _merge(_merge(_merge(_merge(h, v1), v2), v3), v4)
    else:
        h = _P5
    h += np.uint64(length)
    while i + 8 <= end:
        h ^= _round(np.uint64(0), _read(data, i, 8))
        h = _rotl(h, 27) * _P1 + _P4
        i += 8
    if i + 4 <= end:
        h ^= _read(data, i, 4) * _P1
        h = _rotl(h, 23) * _P2 + _P3
        i += 4
    while i < end:
        h ^= np.uint64(data[i]) * _P5
        h = _rotl(h, 11) * _P1
        i += 1
    h ^= h >> _U33
    h *= _P2
    h ^= h >> _U29
    h *= _P3
    h ^= h >> _U32
    return h


@njit(cache=True)
def xxh64(data, offsets):
    """XXH64 (seed 0) of every range ``offsets[i]:offsets[i + 1]``, and its length in code points."""
    n = offsets.shape[0] - 1
    hashes = np.empty(n, dtype=np.uint64)
    chars = np.zeros(n, dtype=np.int64)
    for s in range(n):
        hashes[s] = _xxh64(data, offsets[s], offsets[s + 1])
        for i in range(offsets[s], offsets[s + 1]):
            if (data[i] & 0xC0) != 0x80:
                chars[s] += 1
    return hashes, chars


@njit(cache=True, inline="always")
def _size(lead):
    return 1 if lead < 0xC0 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4


@njit(cache=True)
def cut(data, offsets, doc, starts, ends):
    """The batch without the code point ranges ``starts[c]:ends[c]`` of document ``doc[c]`` (sorted by
    document, then disjoint and in order): the new bytes and offsets, and the bytes each cut took."""
    n = offsets.shape[0] - 1
    m = doc.shape[0]
    out = np.empty(data.shape[0], dtype=np.uint8)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    taken = np.zeros(m, dtype=np.int64)
    o, c = 0, 0
    for d in range(n):
        i, last, cp = offsets[d], offsets[d + 1], 0
        while c < m and doc[c] == d:
            kept = i
            while cp < starts[c]:
                i += _size(data[i])
                cp += 1
            out[o: o + i - kept] = data[kept: i]
            o += i - kept
            first = i
            while cp < ends[c]:
                i += _size(data[i])
                cp += 1
            taken[c] = i - first
            c += 1
        out[o: o + last - i] = data[i: last]
        o += last - i
        out_offsets[d + 1] = o
    return out[:o], out_offsets, taken
