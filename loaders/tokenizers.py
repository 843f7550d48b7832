"""Pluggable tokenizers for packed-sequence batches.

A tokenizer here turns a block's text column into one flat integer token array plus per-document
offsets, so a whole block is tokenized at once on a background thread, through the library's own
batch encoder. What the loader accepts as ``tokenizer=`` (``as_tokenizer``):

- ``"bytes"`` (the default) / ``ByteTokenizer``: UTF-8 bytes are the tokens (vocabulary 256, plus
  ``eos_id`` 256); computed straight from Arrow's string buffers, with no Python strings at all.
- a path to a ``tokenizer.json`` / ``FileTokenizer``, or a ``tokenizers.Tokenizer`` object
  (``HuggingFaceTokenizer``): ``encode_batch`` in Rust threads; nothing is ever downloaded.
- a ``transformers`` tokenizer (``TransformersTokenizer``): its batch ``__call__``.
- a ``tiktoken`` Encoding (``TiktokenTokenizer``): ``encode_ordinary_batch``.
- any ``str -> list[int]`` function (``CallableTokenizer``), or an object with ``encode_block``.

The end-of-document token comes from the tokenizer itself (loaders/eos.py); a tokenizer that names
none is refused unless the caller passes ``eos_id`` (a token id, or ``None`` to pack without one).
"""

from __future__ import annotations

import enum
import itertools
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from gristmill.loaders.eos import EOS_NAMES, config_beside, eos_from_spec, missing
from gristmill.loaders.extras import missing_extra


class _FromTokenizer(enum.Enum):
    FROM_TOKENIZER = "the tokenizer's own"

    def __repr__(self) -> str:
        return "FROM_TOKENIZER"


FROM_TOKENIZER = _FromTokenizer.FROM_TOKENIZER
"""``eos_id``'s default: the token the tokenizer names as its end of document (an error when it names none)."""
EosChoice = int | None | _FromTokenizer


class Tokenizer(Protocol):
    """What the packer needs: a block's texts in, flat integer tokens and ``len + 1`` offsets out."""

    eos_id: int | None

    def encode_block(self, texts: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]: ...


def _texts(texts: pa.ChunkedArray | pa.Array) -> list[str]:
    return [t or "" for t in texts.to_pylist()]


def _from_lists(encoded: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=int(offsets[-1]))
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
    """Wraps any ``str -> list[int]`` function (a SentencePiece processor's ``encode``, ...).

    A function cannot be asked for its end-of-document token, so ``eos_id`` is required (``None``: none).
    """

    def __init__(self, function: Callable[[str], Sequence[int]], eos_id: int | None) -> None:
        self.function = function
        self.eos_id = eos_id

    def encode_block(self, texts: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
        return _from_lists([self.function(t) for t in _texts(texts)])


class HuggingFaceTokenizer:
    """A ``tokenizers.Tokenizer`` object; ``eos_id`` defaults to the one it names (loaders/eos.py)."""

    def __init__(self, tokenizer: Any, eos_id: EosChoice = FROM_TOKENIZER, *, name: str = "the tokenizer",
                 config: dict[str, Any] | None = None) -> None:
        self._tokenizer = tokenizer
        if eos_id is FROM_TOKENIZER:
            found = eos_from_spec(json.loads(tokenizer.to_str()), config)
            if found is None:
                raise missing(name, "no tokenizer_config.json eos_token, no end token in the post-processor, no "
                                    f"special token named {' '.join(EOS_NAMES)}")
            eos_id = found[0]
        self.eos_id = eos_id

    def encode_block(self, texts: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
        encodings = self._tokenizer.encode_batch(_texts(texts), add_special_tokens=False)
        return _from_lists([e.ids for e in encodings])


class FileTokenizer(HuggingFaceTokenizer):
    """A ``tokenizers`` Tokenizer from a local JSON file, with the ``tokenizer_config.json`` beside it.

    ``eos_token`` names the end-of-document token explicitly; otherwise ``eos_id`` (default: found).
    """

    def __init__(self, path: str | os.PathLike[str], eos_token: str | None = None,
                 eos_id: EosChoice = FROM_TOKENIZER) -> None:
        try:
            from tokenizers import Tokenizer as RustTokenizer
        except ModuleNotFoundError as exc:
            raise missing_extra(exc, "tokenizers", "FileTokenizer") from None

        self.path = os.fspath(path)
        tokenizer = RustTokenizer.from_file(self.path)
        if eos_token is not None:
            eos_id = tokenizer.token_to_id(eos_token)
            if eos_id is None:
                raise ValueError(f"{self.path}: tokenizer has no token {eos_token!r}")
        config = config_beside(self.path) if eos_id is FROM_TOKENIZER else None
        super().__init__(tokenizer, eos_id, name=self.path, config=config)

    def __getstate__(self) -> dict[str, object]:
        # The Rust tokenizer is rebuilt from its file in each DataLoader worker.
        return {"path": self.path, "eos_id": self.eos_id}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(str(state["path"]), eos_id=state["eos_id"])  # type: ignore[misc, arg-type]


class TransformersTokenizer:
    """A ``transformers`` tokenizer as it is: its batch call, and its ``eos_token_id`` (or, when that is
    unset, the end token its fast backend names)."""

    def __init__(self, tokenizer: Any, eos_id: EosChoice = FROM_TOKENIZER) -> None:
        self._tokenizer = tokenizer
        if eos_id is FROM_TOKENIZER:
            eos_id = tokenizer.eos_token_id
            backend = getattr(tokenizer, "backend_tokenizer", None)
            if eos_id is None and backend is not None:
                found = eos_from_spec(json.loads(backend.to_str()))
                eos_id = None if found is None else found[0]
            if eos_id is None:
                name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
                raise missing(f"transformers tokenizer {name!r}",
                              "eos_token_id is None and its backend names no end token")
        self.eos_id = eos_id

    def encode_block(self, texts: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
        # verbose=False: a document longer than the model's context is not a problem when packing
        encoded = self._tokenizer(_texts(texts), add_special_tokens=False, return_attention_mask=False,
                                  return_token_type_ids=False, verbose=False)
        return _from_lists(encoded["input_ids"])


class TiktokenTokenizer:
    """A ``tiktoken`` Encoding as it is: ``encode_ordinary_batch`` (a document's text that spells a
    special token stays text), and its ``<|endoftext|>`` (``eot_token``) as the end of document."""

    def __init__(self, encoding: Any, eos_id: EosChoice = FROM_TOKENIZER) -> None:
        self._encoding = encoding
        if eos_id is FROM_TOKENIZER:
            name = next((n for n in EOS_NAMES if n in encoding.special_tokens_set), None)
            if name is None:
                raise missing(f"tiktoken encoding {encoding.name!r}",
                              f"no special token named {' '.join(EOS_NAMES)}")
            eos_id = encoding.encode_single_token(name)
        self.eos_id = eos_id

    def encode_block(self, texts: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
        return _from_lists(self._encoding.encode_ordinary_batch(_texts(texts)))


def _instance_of(value: object, module: str, name: str) -> bool:
    """``isinstance(value, module.name)`` without importing ``module`` (a caller that made ``value`` has)."""
    loaded = sys.modules.get(module)
    kind = getattr(loaded, name, None) if loaded is not None else None
    return isinstance(kind, type) and isinstance(value, kind)


def as_tokenizer(tokenizer: object, eos_id: EosChoice = FROM_TOKENIZER) -> Tokenizer:
    """The loader's ``tokenizer=`` as a ``Tokenizer``, with the end-of-document token ``eos_id`` (by
    default the tokenizer's own; ``NoEosError`` when it names none)."""
    if tokenizer is None or (isinstance(tokenizer, str) and tokenizer == "bytes"):
        return ByteTokenizer() if eos_id is FROM_TOKENIZER else ByteTokenizer(eos_id)
    if isinstance(tokenizer, str | os.PathLike):
        return FileTokenizer(tokenizer, eos_id=eos_id)
    if hasattr(tokenizer, "encode_block"):
        own = getattr(tokenizer, "eos_id", None)
        if eos_id is not FROM_TOKENIZER and eos_id != own:
            raise ValueError(f"eos_id={eos_id!r} disagrees with the tokenizer's own eos_id={own!r}: give it in one "
                             "place")
        return tokenizer  # type: ignore[return-value]
    if _instance_of(tokenizer, "tokenizers", "Tokenizer"):
        return HuggingFaceTokenizer(tokenizer, eos_id)
    if _instance_of(tokenizer, "transformers", "PreTrainedTokenizerBase"):
        return TransformersTokenizer(tokenizer, eos_id)
    if _instance_of(tokenizer, "tiktoken", "Encoding"):
        return TiktokenTokenizer(tokenizer, eos_id)
    if callable(tokenizer):
        if eos_id is FROM_TOKENIZER:
            raise missing(f"the function {getattr(tokenizer, '__name__', tokenizer)!r}",
                          "a plain function cannot be asked")
        return CallableTokenizer(tokenizer, eos_id)
    raise TypeError(f"not a tokenizer: {tokenizer!r} (give 'bytes', a tokenizer.json path, a tokenizers.Tokenizer, "
                    "a transformers tokenizer, a tiktoken Encoding, a str -> list[int] function, or an object with "
                    "encode_block)")
