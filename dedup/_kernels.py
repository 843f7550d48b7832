"""Compiled (numba) inner loops of the dedup library.

Everything here works on whole batches: the UTF-8 bytes of all documents in one ``uint8`` array plus
``int64`` offsets, so the per-character and per-shingle work never runs in the Python interpreter.
All arithmetic is on ``uint64`` with explicitly typed constants (numba promotes ``uint64 op int64`` to
float, which would silently lose bits), and the MinHash permutations are computed exactly modulo the
Mersenne prime 2**61 - 1 (see ``_perm``), so the results are bit-identical on every machine.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._constants import (
    CLASS_DIGIT,
    CLASS_NOSPACE,
    CLASS_PUNCT,
    CLASS_SPACE,
    CONTEXT,
    KEEP,
    MERSENNE_61,
    MODE_AUTO,
    MODE_CHAR,
    MODE_WORD,
    SENTINEL,
)

_P = np.uint64(MERSENNE_61)
_M32 = np.uint64(0xFFFFFFFF)
_M29 = np.uint64((1 << 29) - 1)
_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_FMIX_1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHINGLE_SEED = np.uint64(0x9E3779B97F4A7C15)
_BAND_SEED = np.uint64(0xD6E8FEB86659FD93)
_U3 = np.uint64(3)
_U29 = np.uint64(29)
_U32 = np.uint64(32)
_U33 = np.uint64(33)
_U61 = np.uint64(61)
_SPACE = np.uint8(0x20)
_ZERO_DIGIT = np.uint8(0x30)


@njit(cache=True, inline="always")
def _fmix64(h):
    """MurmurHash3's 64-bit finaliser: a bijective avalanche mix."""
    h ^= h >> _U33
    h *= _FMIX_1
    h ^= h >> _U33
    h *= _FMIX_2
    h ^= h >> _U33
    return h


@njit(cache=True, inline="always")
def _mod_p(h):
    """``h mod (2**61 - 1)`` for any uint64 ``h``."""
    r = (h & _P) + (h >> _U61)
    if r >= _P:
        r -= _P
    return r


@njit(cache=True, inline="always")
def _perm(a_lo, a_hi, x, b):
    """``(a * x + b) mod (2**61 - 1)`` exactly, for ``a, x, b < 2**61`` (a given as 32-bit halves).

    The 122-bit product is built from four 32x32->64-bit partial products (none can overflow) and
    folded with ``2**61 == 1 (mod p)``: ``hi * 2**64 == 8 * hi`` and ``mid * 2**32`` splits at bit 29.
    The sum of the folded parts stays below 2**64, so no step wraps around.
    """
    x_lo = x & _M32
    x_hi = x >> _U32
    lo = a_lo * x_lo
    mid = a_lo * x_hi + a_hi * x_lo
    hi = a_hi * x_hi
    s = (hi << _U3) + (mid >> _U29) + ((mid & _M29) << _U32) + (lo & _P) + (lo >> _U61) + b
    s = (s & _P) + (s >> _U61)
    if s >= _P:
        s -= _P
    return s


@njit(cache=True, inline="always")
def _decode(data, i):
    """The code point starting at byte ``i`` of valid UTF-8 and its length in bytes."""
    b0 = np.int64(data[i])
    if b0 < 0x80:
        return b0, 1
    if b0 < 0xE0:
        return ((b0 & 0x1F) << 6) | (np.int64(data[i + 1]) & 0x3F), 2
    if b0 < 0xF0:
        return ((b0 & 0x0F) << 12) | ((np.int64(data[i + 1]) & 0x3F) << 6) | (np.int64(data[i + 2]) & 0x3F), 3
    return (
        ((b0 & 0x07) << 18)
        | ((np.int64(data[i + 1]) & 0x3F) << 12)
        | ((np.int64(data[i + 2]) & 0x3F) << 6)
        | (np.int64(data[i + 3]) & 0x3F)
    ), 4


@njit(cache=True)
def fold(data, offsets, table, punctuation, digits, whitespace):
    """Punctuation, digit and whitespace folding of a batch of UTF-8 documents.

    Punctuation/symbols become one space, decimal digits become ``0``, and with ``whitespace`` every
    run of white space becomes one space with none at either end. Returns new ``(data, offsets)``;
    the output is never longer than the input.
    """
    return fold_ranges(data, offsets[:-1], offsets[1:], table, punctuation, digits, whitespace)


@njit(cache=True, inline="always")
def _fold_char(source, i, length, cp, table, punctuation, digits, whitespace, out, o, start, pending_space):
    """Steps 3-5 of one code point (its ``length`` UTF-8 bytes at ``source[i]``), written at ``out[o]``
    in a range whose output began at ``start``: the next ``o`` and whether a space is pending."""
    cls = table[cp]
    if punctuation and cls == CLASS_PUNCT:
        cls = CLASS_SPACE
        if not whitespace:
            out[o] = _SPACE
            return o + 1, pending_space
    if whitespace and cls == CLASS_SPACE:
        return o, o > start
    if pending_space:
        out[o] = _SPACE
        o += 1
    if digits and cls == CLASS_DIGIT:
        out[o] = _ZERO_DIGIT
        return o + 1, False
    for k in range(length):
        out[o + k] = source[i + k]
    return o + length, False


@njit(cache=True)
def fold_ranges(data, starts, ends, table, punctuation, digits, whitespace):
    """``fold`` of the byte ranges ``starts[i]:ends[i]`` of ``data`` (the spans of a batch), each
    folded on its own: the folded ranges one after the other, with their offsets."""
    n = starts.shape[0]
    total = 0
    for d in range(n):
        total += ends[d] - starts[d]
    out = np.empty(total, dtype=np.uint8)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    o = 0
    for d in range(n):
        i = starts[d]
        end = ends[d]
        start = o
        pending_space = False
        while i < end:
            cp, length = _decode(data, i)
            o, pending_space = _fold_char(data, i, length, cp, table, punctuation, digits, whitespace, out, o, start,
                                          pending_space)
            i += length
        out_offsets[d + 1] = o
    return out[:o], out_offsets


@njit(cache=True)
def normalize_ranges(data, starts, ends, kind, pool_starts, pool, widest, table, punctuation, digits, whitespace,
                     room):
    """Steps 0-5 (``prefold`` then ``fold``) of the byte ranges ``starts[i]:ends[i]`` of ``data``, each
    on its own, in one pass where every character of the range folds on its own (``kind``, ``pool_starts``
    and ``pool`` from ``normalize.char_folds``): the normalised ranges one after the other, their offsets,
    and per range whether it needs its context (left empty, for the interpreter's ``prefold``). The output
    gets ``room`` bytes, plus ``widest``, the most one character can write; offsets of None when it needs
    more (a text whose case folding grows it)."""
    n = starts.shape[0]
    out = np.empty(room + widest, dtype=np.uint8)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    context = np.zeros(n, dtype=np.bool_)
    o = 0
    for r in range(n):
        i = starts[r]
        end = ends[r]
        start = o
        pending_space = False
        while i < end:
            if o > room:
                return out, None, context
            if data[i] < 0x80 and kind[data[i]] == KEEP:
                o, pending_space = _fold_char(data, i, 1, np.int64(data[i]), table, punctuation, digits, whitespace,
                                              out, o, start, pending_space)
                i += 1
                continue
            cp, size = _decode(data, i)
            k = kind[cp]
            if k == CONTEXT:
                context[r] = True
                o = start
                break
            if k == KEEP:
                o, pending_space = _fold_char(data, i, size, cp, table, punctuation, digits, whitespace, out, o, start,
                                              pending_space)
            else:
                j = pool_starts[cp]
                while j < pool_starts[cp + 1]:
                    folded, length = _decode(pool, j)
                    o, pending_space = _fold_char(pool, j, length, folded, table, punctuation, digits, whitespace,
                                                  out, o, start, pending_space)
                    j += length
            i += size
        out_offsets[r + 1] = o
    return out[:o], out_offsets, context


@njit(cache=True)
def _tokens(data, start, end, table, punctuation, digits, char_mode, out):
    """Hash every token of one document into ``out``; returns the number of tokens.

    A token is a run of characters that are neither white space nor (with ``punctuation``) a
    punctuation/symbol character; in ``char_mode`` each such character is a token of its own. A
    token's hash is FNV-1a over its UTF-8 bytes (a folded digit counts as ``0``) followed by fmix64.
    """
    count = 0
    h = _FNV_OFFSET
    open_token = False
    i = start
    while i < end:
        cp, length = _decode(data, i)
        cls = table[cp]
        if cls == CLASS_SPACE or (punctuation and cls == CLASS_PUNCT):
            if open_token:
                out[count] = _fmix64(h)
                count += 1
                open_token = False
                h = _FNV_OFFSET
            i += length
            continue
        if digits and cls == CLASS_DIGIT:
            h = (h ^ np.uint64(0x30)) * _FNV_PRIME
        else:
            for k in range(length):
                h = (h ^ np.uint64(data[i + k])) * _FNV_PRIME
        open_token = True
        if char_mode:
            out[count] = _fmix64(h)
            count += 1
            open_token = False
            h = _FNV_OFFSET
        i += length
    if open_token:
        out[count] = _fmix64(h)
        count += 1
    return count


@njit(cache=True)
def _is_nospace_script(data, start, end, table, punctuation, min_fraction):
    """True when at least ``min_fraction`` of the token characters belong to a script without spaces."""
    total = 0
    nospace = 0
    i = start
    while i < end:
        cp, length = _decode(data, i)
        cls = table[cp]
        if not (cls == CLASS_SPACE or (punctuation and cls == CLASS_PUNCT)):
            total += 1
            if cls == CLASS_NOSPACE:
                nospace += 1
        i += length
    return total > 0 and nospace >= min_fraction * total


@njit(cache=True)
def minhash(data, offsets, table, punctuation, digits, mode, word_ngram, char_ngram, nospace_fraction, a, b):
    """MinHash signatures of a batch: ``(n_docs, len(a))`` uint64, values in ``[0, 2**61 - 1)``.

    Shingles are n consecutive tokens; a shingle's hash chains fmix64 over its token hashes and is
    reduced mod 2**61 - 1. A document with fewer than n tokens is one shingle of all its tokens; one
    without tokens gets ``SENTINEL`` everywhere. Returns the signatures and the mode used per document.
    """
    n = offsets.shape[0] - 1
    num_perm = a.shape[0]
    sig = np.empty((n, num_perm), dtype=np.uint64)
    used_mode = np.empty(n, dtype=np.uint8)
    longest = 0
    for d in range(n):
        longest = max(longest, offsets[d + 1] - offsets[d])
    scratch = np.empty(max(longest, 1), dtype=np.uint64)
    for d in range(n):
        start = offsets[d]
        end = offsets[d + 1]
        char_mode = mode == MODE_CHAR
        if mode == MODE_AUTO:
            char_mode = _is_nospace_script(data, start, end, table, punctuation, nospace_fraction)
        used_mode[d] = MODE_CHAR if char_mode else MODE_WORD
        ngram = char_ngram if char_mode else word_ngram
        count = _tokens(data, start, end, table, punctuation, digits, char_mode, scratch)
        if count == 0:
            sig[d, :] = SENTINEL
            continue
        span = min(ngram, count)
        shingles = count - span + 1
        for s in range(shingles):  # in place: shingle s reads tokens s .. s+span-1 only
            h = _SHINGLE_SEED
            for k in range(span):
                h = _fmix64(h ^ scratch[s + k])
            scratch[s] = _mod_p(h)
        for j in range(num_perm):
            aj_lo = a[j] & _M32  # masked here so the compiler knows both halves fit 32 bits
            aj_hi = a[j] >> _U32
            bj = b[j]
            best = SENTINEL
            for s in range(shingles):
                v = _perm(aj_lo, aj_hi, scratch[s], bj)
                if v < best:
                    best = v
            sig[d, j] = best
    return sig, used_mode


@njit(cache=True)
def band_hashes(signatures, bands, rows):
    """One uint64 per (document, band): fmix64 chained over the band's rows, seeded by the band index."""
    n = signatures.shape[0]
    out = np.empty((n, bands), dtype=np.uint64)
    for d in range(n):
        for k in range(bands):
            h = _fmix64(_BAND_SEED ^ np.uint64(k))
            for r in range(k * rows, (k + 1) * rows):
                h = _fmix64(h ^ signatures[d, r])
            out[d, k] = h
    return out


@njit(cache=True)
def _find(parent, x):
    while parent[x] != x:
        parent[x] = parent[parent[x]]  # path halving
        x = parent[x]
    return x


@njit(cache=True)
def union_edges(parent, left, right):
    """Union-find over ``parent`` for every edge; the root of a set is always its smallest index."""
    for e in range(left.shape[0]):
        ra = _find(parent, left[e])
        rb = _find(parent, right[e])
        if ra < rb:
            parent[rb] = ra
        elif rb < ra:
            parent[ra] = rb


@njit(cache=True)
def roots(parent):
    """The root of every element (compressing every path on the way)."""
    out = np.empty(parent.shape[0], dtype=np.int64)
    for i in range(parent.shape[0]):
        out[i] = _find(parent, i)
    return out


@njit(cache=True)
def unicode_hazards(data, offsets, flags, ignorable, leads_with_mark, shortest):
    """Per document of a batch (UTF-8 ``data``; ``offsets`` count characters, not bytes): whether it
    holds a flagged ``ignorable`` character, and whether it holds a run of at least ``shortest``
    characters flagged ``leads_with_mark`` or ``ignorable`` (removing ignorables can join two runs);
    see ``unicode_bounds.bounded``. ASCII bytes, flagged never, cost one comparison."""
    n = offsets.shape[0] - 1
    has_ignorable = np.zeros(n, dtype=np.bool_)
    has_long_run = np.zeros(n, dtype=np.bool_)
    either = ignorable | leads_with_mark
    i = 0
    for d in range(n):
        run = 0
        for _ in range(offsets[d], offsets[d + 1]):
            if data[i] < 0x80:
                i += 1
                run = 0
                continue
            cp, size = _decode(data, i)
            i += size
            f = flags[cp]
            if f & ignorable:
                has_ignorable[d] = True
            if f & either:
                run += 1
                if run >= shortest:
                    has_long_run[d] = True
            else:
                run = 0
    return has_ignorable, has_long_run


@njit(cache=True)
def _prefold_document(data, first, last, kind, starts, pool, out, o):
    """Steps 0-2 of one document from the per-code-point table (see ``normalize.char_folds``), written
    from ``out[o]`` when ``out`` is given; -1 when a character needs its context."""
    i = first
    while i < last:
        if data[i] < 0x80 and kind[data[i]] == KEEP:
            if out.shape[0]:
                out[o] = data[i]
            o += 1
            i += 1
            continue
        cp, size = _decode(data, i)
        k = kind[cp]
        if k == CONTEXT:
            return -1
        if k == KEEP:
            if out.shape[0]:
                out[o: o + size] = data[i: i + size]
            o += size
        else:
            length = starts[cp + 1] - starts[cp]
            if out.shape[0]:
                out[o: o + length] = pool[starts[cp]: starts[cp + 1]]
            o += length
        i += size
    return o


@njit(cache=True)
def prefold_context_free(data, offsets, kind, starts, pool):
    """Steps 0-2 (ignorables, NFKC, case folding) of every document whose characters all fold on their
    own; the others come back empty, flagged, for the interpreter's ``prefold``."""
    n = offsets.shape[0] - 1
    none = np.empty(0, dtype=np.uint8)
    sizes = np.empty(n, dtype=np.int64)
    for d in range(n):
        sizes[d] = _prefold_document(data, offsets[d], offsets[d + 1], kind, starts, pool, none, 0)
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    for d in range(n):
        out_offsets[d + 1] = out_offsets[d] + max(sizes[d], 0)
    out = np.empty(out_offsets[n], dtype=np.uint8)
    for d in range(n):
        if sizes[d] >= 0:
            _prefold_document(data, offsets[d], offsets[d + 1], kind, starts, pool, out, out_offsets[d])
    return out, out_offsets, sizes < 0


@njit(cache=True)
def splice(data, offsets, other, other_offsets, rows):
    """The batch with documents ``rows`` (ascending) replaced by those of ``other``, in order."""
    n = offsets.shape[0] - 1
    out_offsets = np.zeros(n + 1, dtype=np.int64)
    r = 0
    for d in range(n):
        if r < rows.shape[0] and rows[r] == d:
            out_offsets[d + 1] = out_offsets[d] + other_offsets[r + 1] - other_offsets[r]
            r += 1
        else:
            out_offsets[d + 1] = out_offsets[d] + offsets[d + 1] - offsets[d]
    out = np.empty(out_offsets[n], dtype=np.uint8)
    r = 0
    for d in range(n):
        if r < rows.shape[0] and rows[r] == d:
            out[out_offsets[d]: out_offsets[d + 1]] = other[other_offsets[r]: other_offsets[r + 1]]
            r += 1
        else:
            out[out_offsets[d]: out_offsets[d + 1]] = data[offsets[d]: offsets[d + 1]]
    return out, out_offsets
