"""Streaming from an S3-protocol server on loopback (moto's standalone server through s3fs)."""

from __future__ import annotations

import os

import pytest

from gristmill.loaders import LoaderError, StreamingLoader
from gristmill.pipeline.format import Corpus
from tests.test_loader import make_corpus

pytestmark = pytest.mark.timeout(120)


@pytest.fixture()
def s3_corpus(s3_server: dict, s3_bucket: str) -> tuple[str, dict, list[str]]:
    url = f"{s3_bucket}/corpus"
    options = s3_server["storage_options"]
    return url, options, make_corpus(url, 700, seed=3, storage_options=options)


def test_streams_with_ranged_reads(s3_corpus: tuple[str, dict, list[str]]) -> None:
    url, options, texts = s3_corpus
    corpus = Corpus.open(url, options)
    total = sum(s.bytes for s in corpus.shards)
    seen, read = [], 0
    for rank in range(2):
        loader = StreamingLoader(url, batch_size=16, columns=["text"], rank=rank, world_size=2,
                                 storage_options=options)
        seen += [t for b in loader for t in b["text"]]
        counters = loader.counters.as_dict()
        # each rank fetched only its own blocks (plus footers): ranged reads, not whole objects
        assert 0 < counters["bytes_read"] < total
        read += counters["bytes_read"]
    assert sorted(set(seen)) == sorted(texts)
    blocks = sum(rg.length for s in corpus.shards for rg in s.row_groups)
    footers = sum(s.footer_length for s in corpus.shards)
    assert blocks <= read <= blocks + 2 * footers + 2 * max(rg.length for s in corpus.shards for rg in s.row_groups)


def test_disk_cache_serves_the_second_epoch(s3_corpus: tuple[str, dict, list[str]], tmp_path: str) -> None:
    url, options, texts = s3_corpus
    loader = StreamingLoader(url, batch_size=32, columns=["text"], world_size=1, rank=0, storage_options=options,
                             cache_dir=os.path.join(str(tmp_path), "cache"), cache_bytes=1 << 30)
    first = sorted(t for b in loader for t in b["text"])
    remote = loader.counters.bytes_read
    second = sorted(t for b in loader for t in b["text"])
    assert first == second == sorted(texts)
    assert loader.counters.bytes_read == remote  # nothing fetched from S3 again
    assert loader.counters.cache_hits >= loader.counters.blocks_fetched // 2


def test_corrupted_object_is_named_by_url(s3_corpus: tuple[str, dict, list[str]]) -> None:
    url, options, _ = s3_corpus
    corpus = Corpus.open(url, options)
    shard = corpus.shards[0]
    data = bytearray(corpus.fs.cat_file(corpus.shard_path(shard)))
    rg = shard.row_groups[0]
    data[rg.offset + 8: rg.offset + rg.length - 8] = os.urandom(rg.length - 16)
    corpus.fs.pipe_file(corpus.shard_path(shard), bytes(data))
    with pytest.raises(LoaderError, match=f"{url}/{shard.path}"):
        list(StreamingLoader(url, batch_size=16, shuffle=False, world_size=1, rank=0, storage_options=options))
