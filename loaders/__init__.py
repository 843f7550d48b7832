"""gristmill loaders: stream a corpus into training jobs, block by block (see docs/LOADER.md).

Importing this package imports neither torch, Ray nor aiohttp; the PyTorch adapter lives in
``gristmill.loaders.torch_dataset``.
"""

import os

# Arrow's allocator (mimalloc) reads this once, when pyarrow loads, so it is set before this package's
# first pyarrow import (a value already in the environment wins; imported after pyarrow, it changes
# nothing: docs/LOADER.md). Where huge pages were allowed, the memory of freshly decoded blocks came as
# 2 MiB pages the kernel zeroed whole: a quarter of an epoch's CPU against an object store (perf), and
# epochs about 15 % shorter without.
os.environ.setdefault("MIMALLOC_ALLOW_THP", "0")

from gristmill.loaders.blocks import Counters, LoaderError  # noqa: E402  (after the allocator's setting)
from gristmill.loaders.cache import DiskCache  # noqa: E402
from gristmill.loaders.eos import NoEosError  # noqa: E402
from gristmill.loaders.loader import StreamingLoader  # noqa: E402
from gristmill.loaders.tokenizers import (  # noqa: E402
    FROM_TOKENIZER,
    ByteTokenizer,
    CallableTokenizer,
    FileTokenizer,
    HuggingFaceTokenizer,
    TiktokenTokenizer,
    TransformersTokenizer,
)

__all__ = ["FROM_TOKENIZER", "ByteTokenizer", "CallableTokenizer", "Counters", "DiskCache", "FileTokenizer",
           "HuggingFaceTokenizer", "LoaderError", "NoEosError", "StreamingLoader", "TiktokenTokenizer",
           "TransformersTokenizer"]
