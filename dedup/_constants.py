"""Constants shared by the compiled kernels (``_kernels``) and the modules that call them.

Kept apart so that importing ``dedup`` loads no numba: the kernels (and numba's ~100 MB of compiler
state) load on the first call that needs them, so a process that only plans work (the dedup job's
driver choosing bands, ``gristmill stats``) never pays for them.
"""

from __future__ import annotations

import numpy as np

# Character classes of the lookup table built in ``gristmill.dedup.normalize``.
CLASS_OTHER = 0
CLASS_SPACE = 1
CLASS_PUNCT = 2
CLASS_DIGIT = 3
CLASS_NOSPACE = 4  # a letter of a script written without spaces between words (CJK, Thai, ...)

# How steps 0-2 of the normalisation treat a code point (``normalize.char_folds``): kept as it is,
# replaced by its folded form, or only foldable with its neighbours (the interpreter's path).
KEEP = 0
MAPPED = 1
CONTEXT = 2

MERSENNE_61 = (1 << 61) - 1
SENTINEL = np.uint64(0xFFFFFFFFFFFFFFFF)  # signature value of a document without any shingle

MODE_WORD = 0
MODE_CHAR = 1
MODE_AUTO = 2
