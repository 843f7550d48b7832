"""MinHash signatures for whole batches of documents.

A signature value is ``min over shingles x of (a_j * x + b_j) mod (2**61 - 1)`` for permutation j,
computed exactly (no uint64 wrap-around) in one compiled loop per batch. What a shingle is:

- ``word``: ``ngram`` consecutive tokens, a token being a run of characters that are neither white
  space nor (with punctuation folding) punctuation or symbols, i.e. the words of ``normalize(text)``.
- ``char``: ``char_ngram`` consecutive characters of ``normalize(text)`` with white space removed,
  for scripts written without spaces (Chinese, Japanese, Thai, ...).
- ``auto`` (default): ``char`` for a document when at least ``nospace_fraction`` of its token
  characters belong to such a script (``NO_SPACE_RANGES``), else ``word``.

A document with fewer tokens than n is one shingle made of all its tokens. A document without any
token (empty, white space or punctuation only) gets ``SENTINEL`` (2**64 - 1) for every permutation;
real values are always below 2**61 - 1.

Hashes (all deterministic, independent of the process, platform and numba version):
token = fmix64(FNV-1a-64(utf8 bytes)), shingle = fmix64 chained over its token hashes then mod
2**61 - 1, and the permutation parameters ``a_j in [1, p)``, ``b_j in [0, p)`` come from a
splitmix64 stream of ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _constants as C
from .normalize import DEFAULT_NORMALIZE, NormalizeOptions, Texts, class_table, prepare

DEFAULT_SEED = 0x6772697374  # "grist"
SENTINEL = int(C.SENTINEL)
MERSENNE_61 = C.MERSENNE_61
_MODES = {"word": C.MODE_WORD, "char": C.MODE_CHAR, "auto": C.MODE_AUTO}
_MASK64 = (1 << 64) - 1


def splitmix64(seed: int, count: int) -> list[int]:
    """``count`` outputs of the splitmix64 generator started at ``seed`` (a stable, tiny PRNG)."""
    state = seed & _MASK64
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        out.append(z ^ (z >> 31))
    return out


def permutations(num_perm: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(a, b)`` parameters of the ``num_perm`` hash permutations for ``seed``."""
    stream = splitmix64(seed, 2 * num_perm)
    a = np.array([1 + v % (MERSENNE_61 - 1) for v in stream[0::2]], dtype=np.uint64)
    b = np.array([v % MERSENNE_61 for v in stream[1::2]], dtype=np.uint64)
    return a, b


@dataclass(frozen=True)
class MinHasher:
    """Computes ``(n_docs, num_perm)`` uint64 MinHash signatures; picklable, so Ray can ship it."""

    num_perm: int = 128
    ngram: int = 5
    shingle: str = "auto"
    char_ngram: int = 5
    seed: int = DEFAULT_SEED
    normalize: NormalizeOptions = DEFAULT_NORMALIZE
    nospace_fraction: float = 0.3
    _a: np.ndarray = field(init=False, repr=False, compare=False)
    _b: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.shingle not in _MODES:
            raise ValueError(f"shingle must be one of {sorted(_MODES)}, not {self.shingle!r}")
        for name in ("num_perm", "ngram", "char_ngram"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        a, b = permutations(self.num_perm, self.seed)
        object.__setattr__(self, "_a", a)
        object.__setattr__(self, "_b", b)

    def signatures(self, texts: Texts) -> np.ndarray:
        """Signatures of a list of str or an Arrow string array, one row per document."""
        return self.signatures_with_modes(texts)[0]

    def signatures_with_modes(self, texts: Texts) -> tuple[np.ndarray, np.ndarray]:
        """Signatures plus, per document, whether char shingles were used (True) or word shingles."""
        return self.signatures_prepared(*prepare(texts, self.normalize))

    def signatures_prepared(self, data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Signatures of a batch already passed through ``normalize.prepare`` with these options."""
        from . import _kernels as K  # on first use: see dedup/_constants.py

        sig, modes = K.minhash(
            data,
            offsets,
            class_table(),
            self.normalize.punctuation,
            self.normalize.digits,
            _MODES[self.shingle],
            self.ngram,
            self.char_ngram,
            self.nospace_fraction,
            self._a,
            self._b,
        )
        return sig, modes == C.MODE_CHAR
