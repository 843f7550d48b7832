"""Which token ends a document, found in the tokenizer itself.

Packing documents back to back without an end-of-document token teaches a model that one document runs
into the next, so the loader asks the tokenizer for its EOS and refuses to guess silently. Where it
looks, first match wins:

1. ``tokenizer_config.json`` beside a ``tokenizer.json`` (what ``transformers`` saves): ``eos_token``;
2. the post-processor: the special token a template appends after the text (``$A </s>``), a
   Roberta/Bert processor's ``sep``;
3. the special (added) tokens: the first of the conventional names in ``EOS_NAMES``.

A ``transformers`` tokenizer answers with its ``eos_token_id``, a ``tiktoken`` Encoding with its
``eot_token``; either falls back to the steps above where it can (a fast tokenizer's backend).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

# Conventional spellings of a document's end, most specific first (GPT-2/NeoX, Llama 1-2/T5, Llama 3, Gemma).
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[EOS]", "<|eos|>")


class NoEosError(ValueError):
    """The tokenizer names no end-of-document token (and the caller did not say to pack without one)."""


def eos_from_spec(spec: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> tuple[int, str] | None:
    """(token id, where it was found) from a tokenizers JSON document and an optional tokenizer config."""
    ids = {token.get("content"): token.get("id") for token in spec.get("added_tokens") or []
           if isinstance(token, Mapping)}
    vocab = (spec.get("model") or {}).get("vocab")

    def id_of(name: object) -> int | None:
        if isinstance(name, Mapping):  # transformers saves AddedToken as {"content": ..., ...}
            name = name.get("content")
        if not isinstance(name, str):
            return None
        found = ids.get(name)
        if found is None and isinstance(vocab, Mapping):
            found = vocab.get(name)
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    if config is not None and (found := id_of(config.get("eos_token"))) is not None:
        return found, f"tokenizer_config.json's eos_token {_name(config.get('eos_token'))!r}"
    appended = _appended_by(spec.get("post_processor"))
    if appended is not None:
        name, token_id = appended
        token_id = token_id if token_id is not None else id_of(name)
        if token_id is not None:
            return token_id, f"the post-processor, which appends {name!r}"
    special = {token.get("content") for token in spec.get("added_tokens") or []
               if isinstance(token, Mapping) and token.get("special")}
    for name in EOS_NAMES:
        if name in special and (found := id_of(name)) is not None:
            return found, f"the special token {name!r}"
    return None


def _name(token: object) -> object:
    return token.get("content") if isinstance(token, Mapping) else token


def _appended_by(processor: object) -> tuple[str, int | None] | None:
    """The special token a post-processor puts after a single sequence, if any."""
    if not isinstance(processor, Mapping):
        return None
    kind = processor.get("type")
    if kind == "Sequence":
        for inner in reversed(processor.get("processors") or []):
            if (found := _appended_by(inner)) is not None:
                return found
        return None
    if kind in ("RobertaProcessing", "BertProcessing"):
        sep = processor.get("sep")
        if isinstance(sep, list) and len(sep) == 2 and isinstance(sep[0], str) and isinstance(sep[1], int):
            return sep[0], sep[1]
        return None
    if kind == "TemplateProcessing":
        single = processor.get("single") or []
        last = single[-1] if single else None
        if isinstance(last, Mapping) and isinstance(last.get("SpecialToken"), Mapping):
            name = last["SpecialToken"].get("id")
            ids = ((processor.get("special_tokens") or {}).get(name) or {}).get("ids") or []
            if isinstance(name, str):
                return name, ids[-1] if len(ids) == 1 and isinstance(ids[0], int) else None
    return None


def config_beside(path: str) -> dict[str, Any] | None:
    """The ``tokenizer_config.json`` in the folder of a ``tokenizer.json``, if there is a readable one."""
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "tokenizer_config.json")
    try:
        with open(beside, encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{beside}: not a readable tokenizer config: {exc}") from None
    return config if isinstance(config, dict) else None


def missing(what: str, looked: str) -> NoEosError:
    """The error for a tokenizer without an EOS: what was searched, and the two ways on."""
    return NoEosError(f"{what} names no end-of-document token ({looked}): pass eos_id=<token id> to the loader, "
                      "or eos_id=None to pack documents with nothing between them")
