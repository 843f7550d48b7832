"""The loader packs with the tokenizer's own end-of-document token: real tokenizers files trained here
(offline), a transformers tokenizer wrapping one, and a tiktoken Encoding built from a local rank table."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import tiktoken
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from gristmill.loaders import FileTokenizer, StreamingLoader
from gristmill.loaders.eos import NoEosError
from gristmill.loaders.tokenizers import (
    HuggingFaceTokenizer,
    TiktokenTokenizer,
    TransformersTokenizer,
    as_tokenizer,
)
from gristmill.pipeline.format import ShardWriter

TEXTS = [f"document {i}: " + " ".join(["the quick brown fox", "jumps over", "a lazy dog"][: 1 + i % 3]) * (1 + i % 4)
         for i in range(60)]
SPECIALS = ["<|endoftext|>", "</s>", "<pad>"]


def bpe(specials: list[str] = SPECIALS) -> Tokenizer:
    """A tiny byte-level BPE trained on the test texts, with the given special tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(TEXTS, trainer)
    return tokenizer


def saved(tokenizer: Tokenizer, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = str(folder / "tokenizer.json")
    tokenizer.save(path)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("corpus"))
    writer = ShardWriter(path, shard_bytes=20_000, row_group_bytes=2_000)
    writer.write([{"id": str(i), "text": text} for i, text in enumerate(TEXTS)])
    writer.commit()
    return path


def eos_count(loader: StreamingLoader, eos: int) -> tuple[int, int]:
    """(eos tokens inside documents' segments, batches) over one whole epoch."""
    count = batches = 0
    for batch in loader:
        count += int(np.count_nonzero((batch["tokens"] == eos) & (batch["segment_ids"] > 0)))
        batches += 1
    return count, batches


def packed(corpus: str, tokenizer: object, **extra: object) -> StreamingLoader:
    return StreamingLoader(corpus, batch_size=2, seq_len=64, tokenizer=tokenizer, world_size=1, rank=0, shuffle=False,
                           **extra)


def test_a_tokenizer_file_packs_with_its_own_eos(tmp_path: Path, corpus: str) -> None:
    path = saved(bpe(), tmp_path)
    loader = packed(corpus, path)
    eos = Tokenizer.from_file(path).token_to_id("<|endoftext|>")
    assert loader.tokenizer.eos_id == eos
    first = next(iter(packed(corpus, path)))
    assert np.count_nonzero(first["tokens"] == eos) >= 1  # the README's snippet: eos between documents
    assert eos_count(loader, eos)[0] == len(TEXTS)  # one per document, none inside a text


def test_the_config_beside_the_file_wins_then_the_post_processor(tmp_path: Path) -> None:
    tokenizer = bpe()
    path = saved(tokenizer, tmp_path / "config")
    Path(path).with_name("tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "</s>"}}))
    assert FileTokenizer(path).eos_id == tokenizer.token_to_id("</s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="$A <pad>", special_tokens=[
        ("<pad>", tokenizer.token_to_id("<pad>"))])
    assert FileTokenizer(saved(tokenizer, tmp_path / "template")).eos_id == tokenizer.token_to_id("<pad>")
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", tokenizer.token_to_id("</s>")), ("<pad>", 2))
    assert FileTokenizer(saved(tokenizer, tmp_path / "roberta")).eos_id == tokenizer.token_to_id("</s>")


def test_no_eos_is_an_error_unless_asked_for(tmp_path: Path, corpus: str) -> None:
    path = saved(bpe(["<pad>"]), tmp_path)
    with pytest.raises(NoEosError, match=f"{path} names no end-of-document token.*eos_id=None"):
        packed(corpus, path)
    plain = packed(corpus, path, eos_id=None)
    assert plain.tokenizer.eos_id is None and plain.state_dict()["eos_id"] is None
    tokens = np.concatenate([b["tokens"][b["segment_ids"] > 0] for b in plain])
    assert len(tokens) == sum(len(e.ids) for e in Tokenizer.from_file(path).encode_batch(TEXTS))
    chosen = packed(corpus, path, eos_id=0)
    assert eos_count(chosen, 0)[0] == len(TEXTS)
    with pytest.raises(NoEosError, match="function 'split_words'"):
        packed(corpus, split_words)


def split_words(text: str) -> list[int]:
    return [len(word) for word in text.split()]


def test_a_tokenizers_object_is_used_as_it_is(corpus: str) -> None:
    tokenizer = bpe()
    loader = packed(corpus, tokenizer)
    assert isinstance(loader.tokenizer, HuggingFaceTokenizer)
    assert loader.tokenizer.eos_id == tokenizer.token_to_id("<|endoftext|>")
    flat, offsets = loader.tokenizer.encode_block(pa.array(TEXTS[:3]))
    expected = [e.ids for e in tokenizer.encode_batch(TEXTS[:3], add_special_tokens=False)]
    assert flat.tolist() == sum(expected, []) and np.diff(offsets).tolist() == [len(e) for e in expected]


def test_a_transformers_tokenizer(tmp_path: Path, corpus: str) -> None:
    path = saved(bpe(), tmp_path)
    fast = PreTrainedTokenizerFast(tokenizer_file=path, eos_token="</s>")
    loader = packed(corpus, fast)
    assert isinstance(loader.tokenizer, TransformersTokenizer)
    assert loader.tokenizer.eos_id == fast.eos_token_id == fast.convert_tokens_to_ids("</s>")
    flat, offsets = loader.tokenizer.encode_block(pa.array(TEXTS[:4]))
    expected = fast(TEXTS[:4], add_special_tokens=False)["input_ids"]
    assert flat.tolist() == sum(expected, []) and np.diff(offsets).tolist() == [len(e) for e in expected]
    assert eos_count(loader, fast.eos_token_id)[0] == len(TEXTS)
    # no eos_token set: the special token its backend names
    bare = PreTrainedTokenizerFast(tokenizer_file=path)
    assert bare.eos_token_id is None and as_tokenizer(bare).eos_id == fast.convert_tokens_to_ids("<|endoftext|>")
    restored = pickle.loads(pickle.dumps(loader.tokenizer))  # DataLoader workers under spawn
    assert restored.encode_block(pa.array(TEXTS[:4]))[0].tolist() == flat.tolist()


def tiny_encoding(specials: dict[str, int]) -> tiktoken.Encoding:
    """A byte-level encoding with a few merges, built from a local rank table (nothing downloaded)."""
    ranks = {bytes([i]): i for i in range(256)}
    for merge in (b"th", b"he", b"the", b"ox", b"fox"):
        ranks[merge] = len(ranks)
    return tiktoken.Encoding("tiny", pat_str=r"""'s|\s?\w+|\s?[^\s\w]+|\s+""", mergeable_ranks=ranks,
                             special_tokens=specials)


def test_a_tiktoken_encoding(corpus: str) -> None:
    encoding = tiny_encoding({"<|endoftext|>": 300})
    loader = packed(corpus, encoding)
    assert isinstance(loader.tokenizer, TiktokenTokenizer) and loader.tokenizer.eos_id == encoding.eot_token == 300
    texts = [*TEXTS[:3], "a text that spells <|endoftext|> stays text"]
    flat, offsets = loader.tokenizer.encode_block(pa.array(texts))
    expected = encoding.encode_ordinary_batch(texts)
    assert flat.tolist() == sum(expected, []) and 300 not in flat.tolist()
    assert eos_count(loader, 300)[0] == len(TEXTS)
    assert pickle.loads(pickle.dumps(loader.tokenizer)).eos_id == 300
    with pytest.raises(NoEosError, match="tiktoken encoding 'tiny'"):
        as_tokenizer(tiny_encoding({"<|im_start|>": 300}))


def test_an_explicit_eos_id_overrides_and_must_not_contradict(tmp_path: Path, corpus: str) -> None:
    path = saved(bpe(), tmp_path)
    assert packed(corpus, path, eos_id=7).tokenizer.eos_id == 7
    assert packed(corpus, "bytes", eos_id=None).tokenizer.eos_id is None
    with pytest.raises(ValueError, match="disagrees with the tokenizer's own eos_id=.*one place"):
        packed(corpus, FileTokenizer(path), eos_id=7)
    with pytest.raises(ValueError, match="eos_id applies to packed tokens only"):
        StreamingLoader(corpus, eos_id=3)


def test_file_tokenizer_survives_pickling_with_its_eos(tmp_path: Path) -> None:
    path = saved(bpe(), tmp_path)
    tokenizer = FileTokenizer(os.fspath(path))
    assert pickle.loads(pickle.dumps(tokenizer)).eos_id == tokenizer.eos_id
