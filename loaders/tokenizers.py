"""Pluggable tokenizers for packed-sequence batches.

A tokenizer here turns a block's text column into one flat integer token array plus per-document
offsets, so a whole block is tokenized at once on a background thread. Three kinds:

- ``ByteTokenizer``: UTF-8 bytes are the tokens (vocabulary 256, plus ``eos_id`` 256 by default);
  computed straight from Arrow's string buffers, with no Python strings at all.
- ``CallableTokenizer``: any ``str -> list[int]`` function.
- ``FileTokenizer``: a Hugging Face ``tokenizers`` Tokenizer loaded from a local ``tokenizer.json``
  (never downloaded); ``encode_batch`` runs in Rust threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa


class Tokenizer(Protocol):
    """What the packer needs: a block's texts in, flat integer tokens and ``len + 1`` offsets out."""

    eos_id: int | None

    def encode_block(self, texts: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]: ...


def _from_lists(encoded: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    flat = np.fromiter((t for e in encoded for t in e), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


class ByteTokenizer:
    """UTF-8 bytes as tokens; the default, and the fastest (no Python strings are made)."""

    vocab_size = 257

    def __init__(self, eos_id: int | None = 256) -> None:
        self.eos_id = eos_id

    def encode_block(self, texts: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
        array = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
        if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
            array = array.cast(pa.large_binary() if pa.types.is_large_string(array.type) else pa.binary())
        if array.null_count:
            array = array.fill_null(b"")
        width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
        _, offsets_buffer, data_buffer = array.buffers()
        offsets = np.frombuffer(offsets_buffer, dtype=width)[array.offset: array.offset + len(array) + 1]
        offsets = offsets.astype(np.int64)
        data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
        # uint8 views of Arrow's buffer: the packer widens to int32 as it fills a batch, in one pass
        return data[offsets[0]: offsets[-1]], offsets - offsets[0]

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


class CallableTokenizer:
    """Wraps any ``str -> list[int]`` function (tiktoken's ``encode``, a SentencePiece processor, ...)."""

    def __init__(self, function: Callable[[str], Sequence[int]], eos_id: int | None = None) -> None:
        self.function = function
        self.eos_id = eos_id

    def encode_block(self, texts: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
        return _from_lists([self.function(t or "") for t in texts.to_pylist()])


class FileTokenizer:
    """A ``tokenizers`` Tokenizer from a local JSON file; ``eos_id`` defaults to the token named ``eos_token``."""

    def __init__(self, path: str, eos_token: str | None = None, eos_id: int | None = None) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        self.path = path
        self._tokenizer = HFTokenizer.from_file(path)
        if eos_id is None and eos_token is not None:
            eos_id = self._tokenizer.token_to_id(eos_token)
            if eos_id is None:
                raise ValueError(f"{path}: tokenizer has no token {eos_token!r}")
        self.eos_id = eos_id

    def encode_block(self, texts: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
        encodings = self._tokenizer.encode_batch([t or "" for t in texts.to_pylist()], add_special_tokens=False)
        return _from_lists([e.ids for e in encodings])

    def __getstate__(self) -> dict[str, object]:
        # The Rust tokenizer is rebuilt from its file in each DataLoader worker.
        return {"path": self.path, "eos_id": self.eos_id}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(str(state["path"]), eos_id=state["eos_id"])  # type: ignore[misc, arg-type]


def as_tokenizer(tokenizer: object) -> Tokenizer:
    """Accept a tokenizer object, a callable, a path to a ``tokenizer.json``, or ``"bytes"``."""
    if tokenizer is None or tokenizer == "bytes":
        return ByteTokenizer()
    if isinstance(tokenizer, str):
        return FileTokenizer(tokenizer)
    if hasattr(tokenizer, "encode_block"):
        return tokenizer  # type: ignore[return-value]
    if callable(tokenizer):
        return CallableTokenizer(tokenizer)
    raise TypeError(f"not a tokenizer: {tokenizer!r} (give 'bytes', a callable, a tokenizer.json path, "
                    "or an object with encode_block)")
