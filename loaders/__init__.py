"""gristmill loaders: stream a corpus into training jobs, block by block (see docs/LOADER.md).

Importing this package imports neither torch, Ray nor aiohttp; the PyTorch adapter lives in
``loaders.torch_dataset``.
"""

from loaders.blocks import Counters, LoaderError
from loaders.cache import DiskCache
from loaders.loader import StreamingLoader
from loaders.tokenizers import ByteTokenizer, CallableTokenizer, FileTokenizer

__all__ = ["ByteTokenizer", "CallableTokenizer", "Counters", "DiskCache", "FileTokenizer", "LoaderError",
           "StreamingLoader"]
