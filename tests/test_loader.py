"""StreamingLoader against real Parquet corpora written by pipeline.format.ShardWriter."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from gristmill.loaders import (
    ByteTokenizer,
    CallableTokenizer,
    DiskCache,
    FileTokenizer,
    LoaderError,
    StreamingLoader,
)
from gristmill.loaders.blocks import BlockSource, Counters
from gristmill.loaders.mixing import MixedLoader
from gristmill.loaders.plan import EpochOrder, Generation, plan_generation
from gristmill.loaders.prefetch import Prefetcher
from gristmill.pipeline.format import Corpus, ShardWriter

WORDS = np.array("the of and a to in is was he for it with as his on be at by i this had not are but from or "
                 "have an they which one you were her all she there would their we him been has when who will "
                 "more no if out so said what up its about into than them can only other new some could time "
                 "these two may then do first any my now such like our over man me even most made after also "
                 "did many before must through back years where much your way well down should because each "
                 "just those people mr how too little state good very make world still own see men work long "
                 "été naïve 日本語 данные".split())


def make_corpus(path: str, rows: int, seed: int = 0, *, shard_bytes: int = 40_000, row_group_bytes: int = 6_000,
                name_prefix: str = "part", storage_options: dict | None = None) -> list[str]:
    """Random-length documents of random words: shards and row groups of uneven sizes. Returns the texts."""
    rng = np.random.default_rng(seed)
    texts = []
    for index in range(rows):
        words = WORDS[rng.integers(0, len(WORDS), size=int(rng.integers(1, 120)))]
        texts.append(f"{name_prefix}-{index}: " + " ".join(words))
    writer = ShardWriter(path, shard_bytes=shard_bytes, row_group_bytes=row_group_bytes, name_prefix=name_prefix,
                         storage_options=storage_options)
    for start in range(0, rows, 97):  # several writes, as a pipeline would
        writer.write([{"id": f"{name_prefix}-{i}", "text": texts[i]} for i in range(start, min(rows, start + 97))])
    writer.commit()
    return texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    path = str(tmp_path_factory.mktemp("corpus"))
    texts = make_corpus(path, 2001)
    return path, texts


def ids_of(loader: StreamingLoader, limit: int | None = None) -> list[list[str]]:
    batches = []
    for batch in loader:
        batches.append(batch["id"])
        if limit is not None and len(batches) == limit:
            break
    return batches


def flat(batches: list[list[str]]) -> list[str]:
    return [x for b in batches for x in b]


def test_corpus_has_uneven_shards_and_blocks(corpus: tuple[str, list[str]]) -> None:
    shards = Corpus.open(corpus[0]).shards
    assert len(shards) >= 3
    assert len({s.rows for s in shards}) > 1
    assert len({rg.rows for s in shards for rg in s.row_groups}) > 1


def test_single_rank_epoch_reads_every_document_once(corpus: tuple[str, list[str]]) -> None:
    path, texts = corpus
    loader = StreamingLoader(path, batch_size=16, columns=["id", "text"], seed=3, world_size=1, rank=0)
    seen = []
    for batch in loader:
        assert set(batch) == {"id", "text"} and len(batch["id"]) == len(batch["text"]) <= 16
        seen += batch["text"]
    assert sorted(seen) == sorted(texts)
    assert seen != texts  # shuffled
    assert loader.epoch == 1
    counters = loader.counters.as_dict()
    assert counters["blocks_fetched"] == sum(len(s.row_groups) for s in loader.corpus.shards)
    assert counters["bytes_read"] > 0 and counters["blocks_per_batch"] > 2


def test_shuffle_off_reads_manifest_order(corpus: tuple[str, list[str]]) -> None:
    path, texts = corpus
    loader = StreamingLoader(path, batch_size=50, columns=["text"], shuffle=False, world_size=1, rank=0)
    assert [t for b in loader for t in b["text"]] == texts


def test_each_epoch_and_seed_shuffles_differently(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    first = flat(ids_of(StreamingLoader(path, batch_size=32, columns=["id"], seed=1, world_size=1, rank=0), 5))
    again = flat(ids_of(StreamingLoader(path, batch_size=32, columns=["id"], seed=1, world_size=1, rank=0), 5))
    other = flat(ids_of(StreamingLoader(path, batch_size=32, columns=["id"], seed=2, world_size=1, rank=0), 5))
    later = StreamingLoader(path, batch_size=32, columns=["id"], seed=1, world_size=1, rank=0)
    later.set_epoch(1)
    assert first == again
    assert first != other
    assert first != flat(ids_of(later, 5))


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ranks_cover_the_epoch_without_overlap(corpus: tuple[str, list[str]], world_size: int) -> None:
    path, texts = corpus
    per_rank = [flat(ids_of(StreamingLoader(path, batch_size=16, columns=["id"], seed=5, rank=r,
                                            world_size=world_size))) for r in range(world_size)]
    counts = collections.Counter(flat(per_rank))
    assert set(counts) == {f"part-{i}" for i in range(len(texts))}  # no gaps
    padding = world_size * len(per_rank[0]) - len(texts)
    assert 0 <= padding < world_size  # DistributedSampler-style padding, nothing else repeats
    assert sum(c - 1 for c in counts.values()) == padding
    assert len({len(p) for p in per_rank}) == 1


def test_drop_last_gives_full_batches_and_no_repeats(corpus: tuple[str, list[str]]) -> None:
    path, texts = corpus
    per_rank = [ids_of(StreamingLoader(path, batch_size=32, columns=["id"], rank=r, world_size=3, drop_last=True))
                for r in range(3)]
    everything = flat([b for rank in per_rank for b in rank])
    assert all(len(b) == 32 for rank in per_rank for b in rank)
    assert len(everything) == len(set(everything)) == (len(texts) // 96) * 96


def test_workers_split_a_ranks_blocks_without_overlap(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    whole = flat(ids_of(StreamingLoader(path, batch_size=16, columns=["id"], rank=1, world_size=2)))
    parts = [ids_of(StreamingLoader(path, batch_size=16, columns=["id"], rank=1, world_size=2, worker_id=w,
                                    num_workers=3)) for w in range(3)]
    assert sorted(flat([b for p in parts for b in p])) == sorted(whole)
    assert [len(p) for p in parts] == [len(range(w, sum(map(len, parts)), 3)) for w in range(3)]


def test_equal_batch_counts_every_epoch_with_uneven_shards(tmp_path: str) -> None:
    path = str(tmp_path)
    make_corpus(path, 1237, seed=9, shard_bytes=30_000, row_group_bytes=3_000)
    for drop_last in (False, True):
        loaders = [StreamingLoader(path, batch_size=10, columns=["id"], rank=r, world_size=4, drop_last=drop_last)
                   for r in range(4)]
        for epoch in range(3):
            counts = [sum(1 for _ in loader) for loader in loaders]
            assert len(set(counts)) == 1 and counts[0] == len(loaders[0]) > 0
            assert all(loader.epoch == epoch + 1 for loader in loaders)


@pytest.mark.parametrize("stop_after", [0, 1, 5, 17, 40, 62])
def test_exact_resume_equals_uninterrupted_stream(corpus: tuple[str, list[str]], stop_after: int) -> None:
    path, _ = corpus

    def make() -> StreamingLoader:
        return StreamingLoader(path, batch_size=16, columns=["id"], seed=7, rank=1, world_size=2,
                               shuffle_window=96)

    reference = make()
    full = ids_of(reference) + ids_of(reference)  # two epochs
    first = make()
    got = ids_of(first, stop_after) if stop_after else []
    state = first.state_dict()
    assert set(state) >= {"seed", "epoch", "batches", "world_size"} and len(str(state)) < 400
    resumed = make()
    resumed.load_state_dict(state)
    rest = ids_of(resumed) + ids_of(resumed)
    assert got + rest[: len(full) - len(got)] == full


def test_resume_at_epoch_end_continues_with_next_epoch(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    loader = StreamingLoader(path, batch_size=64, columns=["id"], world_size=1, rank=0)
    ids_of(loader)
    second = ids_of(loader)
    state_loader = StreamingLoader(path, batch_size=64, columns=["id"], world_size=1, rank=0)
    ids_of(state_loader)
    resumed = StreamingLoader(path, batch_size=64, columns=["id"], world_size=1, rank=0)
    resumed.load_state_dict(state_loader.state_dict())
    assert ids_of(resumed) == second


def test_elastic_resume_two_ranks_to_one(tmp_path: str) -> None:
    path = str(tmp_path)
    texts = make_corpus(path, 1200, seed=4)  # even, so two ranks need no padding
    ranks = [StreamingLoader(path, batch_size=16, columns=["id"], seed=11, rank=r, world_size=2, shuffle_window=80)
             for r in range(2)]
    read = flat([b for loader in ranks for b in ids_of(loader, 13)])
    state = ranks[0].state_dict()
    single = StreamingLoader(path, batch_size=16, columns=["id"], seed=11, rank=0, world_size=1, shuffle_window=80)
    single.load_state_dict(state)
    rest = flat(ids_of(single))
    assert sorted(read + rest) == sorted(f"part-{i}" for i in range(len(texts)))
    # and it can be checkpointed again, mid-way, and resumed exactly
    again = StreamingLoader(path, batch_size=16, columns=["id"], seed=11, rank=0, world_size=1, shuffle_window=80)
    again.load_state_dict(state)
    head = flat(ids_of(again, 9))
    final = StreamingLoader(path, batch_size=16, columns=["id"], seed=11, rank=0, world_size=1, shuffle_window=80)
    final.load_state_dict(again.state_dict())
    assert head + flat(ids_of(final)) == rest


def test_elastic_resume_two_workers_to_one_and_one_rank_to_three(tmp_path: str) -> None:
    path = str(tmp_path)
    texts = make_corpus(path, 900, seed=6)
    workers = [StreamingLoader(path, batch_size=8, columns=["id"], rank=0, world_size=1, worker_id=w,
                               num_workers=2) for w in range(2)]
    streams = [iter(w) for w in workers]
    read = []
    for step in range(21):  # DataLoader's round-robin order
        read += next(streams[step % 2])["id"]
    state = workers[0].state_dict()
    state["batches"] = 21  # what StreamingDataLoader records: batches the rank handed out
    three = [StreamingLoader(path, batch_size=8, columns=["id"], rank=r, world_size=3) for r in range(3)]
    for loader in three:
        loader.load_state_dict(state)
    rest = [flat(ids_of(loader)) for loader in three]
    assert len({len(r) for r in rest}) == 1
    counts = collections.Counter(read + flat(rest))
    assert set(counts) == {f"part-{i}" for i in range(len(texts))}
    assert sum(c - 1 for c in counts.values()) < 3  # only the re-split's padding repeats


def test_plan_generations_are_pure_arithmetic() -> None:
    rows = np.array([5, 9, 3, 7, 11, 1])  # 36 rows: two ranks, no padding
    order = EpochOrder.build(rows, seed=1, epoch=0, shuffle=True)
    gen = Generation(world_size=2, workers=1, batch_size=4, window=8)
    specs, _ = plan_generation(order.total, [], gen, seed=1, epoch=0, shuffle=True, drop_last=False,
                               by_batches=True)
    consumed = [sorted(spec.window(0)[:3].tolist()) for spec in specs]
    history = [Generation(2, 1, 4, 8, (3, 3))]
    after, _ = plan_generation(order.total, history, Generation(1, 1, 4, 8), seed=1, epoch=0, shuffle=True,
                               drop_last=False, by_batches=True)
    remaining = after[0].positions.array().tolist()
    assert sorted(remaining + consumed[0] + consumed[1]) == list(range(order.total))


def test_prefetch_stays_within_its_byte_budget(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    loader = StreamingLoader(path, batch_size=16, columns=["text"], world_size=1, rank=0, shuffle_window=64)
    order, specs, _ = loader._plan()
    source = loader.source
    biggest = max(source.block_nbytes(b) for b in range(len(source.layout.rows)))
    budget = 3 * biggest
    prefetcher = Prefetcher(source, order, specs[0], 0, lambda t: (t, t.nbytes), budget_bytes=budget, threads=4,
                            counters=Counters())
    peaks, rows = [], 0
    for window in prefetcher:
        peaks.append(prefetcher.used_bytes)
        window_need = sum(source.block_nbytes(b) for b in window.data)
        assert prefetcher.used_bytes <= max(budget, 2 * window_need) + 2 * biggest
        rows += len(window.rows)
    assert rows == order.total and max(peaks) > 0


def test_stored_bytes_are_read_ahead_within_their_share_and_each_block_once(corpus: tuple[str, list[str]]) -> None:
    """With the decoded budget full (a slow consumer holding its window), the next windows' stored bytes
    are already being read, within the read-ahead share; no block is read twice for it."""
    path, _ = corpus
    loader = StreamingLoader(path, batch_size=16, columns=["text"], world_size=1, rank=0, shuffle_window=64)
    order, specs, _ = loader._plan()
    source = loader.source
    biggest = max(source.block_nbytes(b) for b in range(len(source.layout.rows)))
    footers = loader.counters.bytes_read  # block_nbytes read every shard's footer
    prefetcher = Prefetcher(source, order, specs[0], 0, lambda t: (t, t.nbytes), budget_bytes=3 * biggest,
                            threads=2, counters=loader.counters)
    held, rows = [], 0
    for window in prefetcher:
        time.sleep(0.02)  # the consumer is the slow part
        held.append(prefetcher._ahead_bytes)
        assert prefetcher._ahead_bytes <= prefetcher.ahead_budget
        rows += len(window.rows)
    assert rows == order.total
    assert loader.counters.reads_ahead > 0 and max(held) > 0
    assert loader.counters.bytes_read - footers == int(source.layout.length.sum())


def test_packing_keeps_every_token_once_and_marks_boundaries(corpus: tuple[str, list[str]]) -> None:
    path, texts = corpus
    loader = StreamingLoader(path, batch_size=4, seq_len=128, world_size=1, rank=0, seed=2)
    tokens, segments = [], []
    for batch in loader:
        assert batch["tokens"].dtype == np.int32 and batch["tokens"].shape[1] == 128
        tokens.append(batch["tokens"].ravel())
        segments.append(batch["segment_ids"].ravel())
    tokens_all, segments_all = np.concatenate(tokens), np.concatenate(segments)
    real = tokens_all[segments_all > 0]
    pieces = np.split(real, np.flatnonzero(real == 256) + 1)
    decoded = sorted(bytes(p[:-1].astype(np.uint8)).decode("utf-8") for p in pieces if len(p))
    assert decoded == sorted(texts)
    # a new segment starts right after each eos inside a row
    grid_t, grid_s = np.concatenate([b.reshape(-1, 128) for b in tokens]), \
        np.concatenate([s.reshape(-1, 128) for s in segments])
    eos_rows, eos_cols = np.nonzero((grid_t == 256) & (grid_s > 0))
    inside = eos_cols < 127
    after = grid_s[eos_rows[inside], eos_cols[inside] + 1]
    assert np.all((after == grid_s[eos_rows[inside], eos_cols[inside]] + 1) | (after == 0))


@pytest.mark.parametrize("stop_after", [1, 6, 23])
def test_packed_resume_is_exact(corpus: tuple[str, list[str]], stop_after: int) -> None:
    path, _ = corpus

    def make() -> StreamingLoader:
        return StreamingLoader(path, batch_size=3, seq_len=100, world_size=1, rank=0, seed=4, shuffle_window=60)

    full = [b["tokens"] for b in make()]
    first = make()
    head = [b["tokens"] for _, b in zip(range(stop_after), first)]
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    rest = [b["tokens"] for b in resumed]
    assert len(head) + len(rest) == len(full)
    assert all(np.array_equal(a, b) for a, b in zip(head + rest, full))


def test_packed_ranks_yield_equal_step_counts(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    loaders = [StreamingLoader(path, batch_size=2, seq_len=64, rank=r, world_size=3) for r in range(3)]
    counts = [sum(1 for _ in loader) for loader in loaders]
    assert len(set(counts)) == 1 and counts[0] == len(loaders[0]) > 0


def test_packed_elastic_resume_needs_and_uses_all_rank_states(tmp_path: str) -> None:
    path = str(tmp_path)
    texts = make_corpus(path, 600, seed=8)
    make = lambda r, w: StreamingLoader(path, batch_size=2, seq_len=64, rank=r, world_size=w, seed=1,  # noqa: E731
                                        steps_per_epoch=10_000)
    ranks = [make(r, 2) for r in range(2)]
    streams = [[batch for _, batch in zip(range(7), loader)] for loader in ranks]
    single = make(0, 1)
    with pytest.raises(ValueError, match="merge_state_dicts"):
        single.load_state_dict(ranks[0].state_dict())
    single.load_state_dict(StreamingLoader.merge_state_dicts([r.state_dict() for r in ranks]))
    streams.append(list(single))
    whole: collections.Counter[str] = collections.Counter()
    for stream in streams:
        real = np.concatenate([b["tokens"][b["segment_ids"] > 0] for b in stream])
        for piece in np.split(real, np.flatnonzero(real == 256) + 1):
            whole[bytes(piece[:-1].astype(np.uint8)).decode("utf-8", "replace")] += 1
    found = collections.Counter({t: whole[t] for t in texts if whole[t]})
    # every document is read once; the two cut by the checkpoint are not replayed, only their heads were read
    assert len(found) >= len(texts) - 2 and max(found.values()) == 1


def test_tokenizers_callable_and_file(tmp_path: str, corpus: tuple[str, list[str]]) -> None:
    import pyarrow as pa
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[EOS]": 1, **{w: i + 2 for i, w in enumerate(sorted(set(WORDS.tolist())))}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    file = os.path.join(str(tmp_path), "tokenizer.json")
    tok.save(file)
    texts = pa.array(["the of and", "été naïve", ""])
    flat_ids, offsets = FileTokenizer(file, eos_token="[EOS]").encode_block(texts)
    assert offsets.tolist() == [0, 3, 5, 5] and flat_ids[:3].tolist() == [vocab["the"], vocab["of"], vocab["and"]]
    flat_c, offsets_c = CallableTokenizer(lambda s: [len(w) for w in s.split()], eos_id=None).encode_block(texts)
    assert flat_c.tolist() == [3, 2, 3, 3, 5] and offsets_c.tolist() == [0, 3, 5, 5]
    flat_b, offsets_b = ByteTokenizer().encode_block(pa.chunked_array([texts.slice(1)]))
    assert bytes(flat_b.astype(np.uint8)) == "été naïve".encode() and offsets_b.tolist() == [0, 12, 12]
    path, _ = corpus
    loader = StreamingLoader(path, batch_size=2, seq_len=16, tokenizer=file, eos_id=vocab["[EOS]"], world_size=1,
                             rank=0)
    batch = next(iter(loader))
    assert batch["tokens"].max() < len(vocab) and loader.tokenizer.eos_id == vocab["[EOS]"]


def test_corrupted_shard_is_named(tmp_path: str) -> None:
    path = str(tmp_path)
    make_corpus(path, 400, seed=2)
    shard = Corpus.open(path).shards[0]
    target = os.path.join(path, shard.path)
    rg = shard.row_groups[0]
    with open(target, "r+b") as handle:
        handle.seek(rg.offset + rg.length // 3)
        handle.write(os.urandom(rg.length // 3))
    with pytest.raises(LoaderError, match=shard.path):
        for _ in StreamingLoader(path, batch_size=8, shuffle=False, world_size=1, rank=0):
            pass


def test_single_flipped_byte_is_caught_by_verify_checksums(tmp_path: str) -> None:
    path = str(tmp_path)
    make_corpus(path, 400, seed=2)
    shard = Corpus.open(path).shards[1]
    target = os.path.join(path, shard.path)
    with open(target, "r+b") as handle:
        handle.seek(shard.row_groups[0].offset + 10)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(LoaderError, match=f"{shard.path}.*checksum"):
        for _ in StreamingLoader(path, batch_size=8, verify_checksums=True, world_size=1, rank=0):
            pass


def test_missing_and_truncated_shards_are_named(tmp_path: str) -> None:
    path = str(tmp_path)
    make_corpus(path, 400, seed=2)
    shards = Corpus.open(path).shards
    os.remove(os.path.join(path, shards[0].path))
    with pytest.raises(LoaderError, match=f"{shards[0].path}.*missing"):
        list(StreamingLoader(path, batch_size=8, shuffle=False, world_size=1, rank=0))
    with open(os.path.join(path, shards[1].path), "r+b") as handle:
        handle.truncate(shards[1].bytes // 2)
    loader = StreamingLoader(path, batch_size=8, shuffle=False, world_size=1, rank=0)
    with pytest.raises(LoaderError, match=shards[1].path):
        BlockSource(loader.corpus, ["text"]).read(len(shards[0].row_groups))


def test_transient_storage_errors_are_retried(corpus: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    path, texts = corpus
    loader = StreamingLoader(path, batch_size=64, columns=["text"], world_size=1, rank=0, io_threads=1)
    real = loader.corpus.fs.cat_file
    failures = {"left": 3}

    def flaky(*args: object, **kwargs: object) -> bytes:
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionResetError("connection reset by peer")
        return real(*args, **kwargs)

    monkeypatch.setattr(loader.corpus.fs, "cat_file", flaky)
    assert sorted(t for b in loader for t in b["text"]) == sorted(texts)
    assert loader.counters.retries == 3


def test_disk_cache_respects_its_limit_and_serves_later_epochs(corpus: tuple[str, list[str]], tmp_path: str) -> None:
    path, texts = corpus
    sizes = [rg.length for s in Corpus.open(path).shards for rg in s.row_groups]
    limit = sum(sizes) // 2
    cache_dir = os.path.join(str(tmp_path), "cache")
    loader = StreamingLoader(path, batch_size=64, columns=["text"], world_size=1, rank=0, cache_dir=cache_dir,
                             cache_bytes=limit)
    for _ in range(2):
        assert sorted(t for b in loader for t in b["text"]) == sorted(texts)
    on_disk = sum(e.stat().st_size for e in os.scandir(cache_dir))
    assert on_disk <= limit and loader.counters.cache_hits > 0


def test_a_consumer_that_stops_early_leaves_no_disk_cache_pin(corpus: tuple[str, list[str]], tmp_path: str) -> None:
    """Blocks being read or held are pinned in the node's cache; a consumer that stops mid-epoch (and a
    block read ahead that no window took) must not leave them pinned, or no process could evict them."""
    path, _ = corpus
    loader = StreamingLoader(path, batch_size=16, columns=["text"], world_size=1, rank=0, shuffle_window=64,
                             cache_dir=os.path.join(str(tmp_path), "cache"))
    batches = iter(loader)
    for _ in range(6):
        next(batches)
    cache = loader.source.cache
    assert cache is not None and cache._pins  # the windows in hand, and reads ahead
    batches.close()
    assert not cache._pins and not cache._held
    for _ in loader:
        pass
    assert not cache._pins and not cache._held


def test_disk_cache_never_evicts_a_pinned_block(tmp_path: str) -> None:
    cache = DiskCache(str(tmp_path), max_bytes=164)  # one 60-byte block fits (+16 digest, +64 bookkeeping), two do not
    assert cache.put("a", b"x" * 60)
    cache.pin("a")
    assert not cache.put("b", b"y" * 60)  # would need to evict "a", which is in use
    assert cache.get("a") == b"x" * 60 and cache.get("b") is None
    cache.unpin("a")
    assert cache.put("b", b"y" * 60) and cache.get("a") is None and cache.get("b") == b"y" * 60


def test_bad_columns_and_rank_are_rejected(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    with pytest.raises(LoaderError, match="no column"):
        next(iter(StreamingLoader(path, columns=["nope"], world_size=1, rank=0)))
    with pytest.raises(ValueError, match="rank"):
        StreamingLoader(path, rank=2, world_size=2)


def test_rank_and_world_size_come_from_torchrun_environment(corpus: tuple[str, list[str]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "5")
    loader = StreamingLoader(corpus[0])
    assert (loader.rank, loader.world_size) == (2, 5)


def test_arrow_output_matches_python_output(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    make = lambda output: StreamingLoader(path, batch_size=16, columns=["id", "text"], output=output,  # noqa: E731
                                          world_size=1, rank=0)
    python = [b for b in make("python")]
    arrow = [b.to_pydict() for b in make("arrow")]
    assert python == arrow


def test_mixing_follows_weights_and_resumes(tmp_path: str) -> None:
    paths = [os.path.join(str(tmp_path), name) for name in ("a", "b", "c")]
    for index, path in enumerate(paths):
        make_corpus(path, 300 + 200 * index, seed=index, name_prefix=f"src{index}")
    weights = [0.5, 0.3, 0.2]

    def make() -> MixedLoader:
        sources = [StreamingLoader(p, batch_size=4, columns=["id"], world_size=1, rank=0) for p in paths]
        return MixedLoader(sources, weights, seed=3, steps_per_epoch=1500)

    mixed = make()
    order = [(i, tuple(b["id"])) for i, b in mixed]
    shares = np.bincount([i for i, _ in order], minlength=3) / len(order)
    assert np.allclose(shares, weights, atol=0.04)
    assert all(b[0].startswith(f"src{i}-") for i, b in order)
    first = make()
    head = [(i, tuple(b["id"])) for _, (i, b) in zip(range(611), first)]
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + [(i, tuple(b["id"])) for i, b in resumed] == order


def test_importing_loaders_pulls_no_torch_ray_or_aiohttp() -> None:
    code = ("import sys, loaders, loaders.mixing; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'aiohttp'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_importing_loaders_first_keeps_arrow_off_huge_pages() -> None:
    """The allocator setting is in place before pyarrow loads, and a job's own setting wins."""
    code = "import os, sys, loaders; print('pyarrow' in sys.modules, os.environ.get('MIMALLOC_ALLOW_THP'))"
    env = {k: v for k, v in os.environ.items() if k != "MIMALLOC_ALLOW_THP"}
    run = lambda env: subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,  # noqa: E731
                                     check=True, env=env).stdout.split()
    assert run(env) == ["True", "0"]
    assert run({**env, "MIMALLOC_ALLOW_THP": "1"}) == ["True", "1"]


def test_utf8_output_matches_python_output(corpus: tuple[str, list[str]]) -> None:
    import pyarrow as pa

    path, _ = corpus
    make = lambda output: StreamingLoader(path, batch_size=16, columns=["id", "text"], output=output,  # noqa: E731
                                          world_size=1, rank=0)
    python = list(make("python"))
    decoded = []
    for batch in make("utf8"):
        decoded.append({c: pa.LargeStringArray.from_buffers(len(v["offsets"]) // 8 - 1, pa.py_buffer(v["offsets"]),
                                                             pa.py_buffer(v["utf8"])).to_pylist()
                        for c, v in batch.items()})
    assert decoded == python


def test_blocks_decoded_in_batches_stream_as_whole_blocks(corpus: tuple[str, list[str]],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A block decoded in several record batches (as big blocks are) gives the same batches, in every output."""
    import gristmill.loaders.blocks  # noqa: F401
    from gristmill import loaders

    path, texts = corpus

    def stream(batch_bytes: int) -> list:
        monkeypatch.setattr(loaders.blocks, "DECODE_BATCH_BYTES", batch_bytes)
        args = {"batch_size": 16, "columns": ["id", "text"], "seed": 5, "world_size": 1, "rank": 0}
        utf8 = [{c: (v["offsets"], v["utf8"]) for c, v in b.items()} for b in StreamingLoader(path, output="utf8", **args)]
        arrow = [b.to_pydict() for b in StreamingLoader(path, output="arrow", **args)]
        tokens = [b["tokens"] for b in StreamingLoader(path, seq_len=64, **args)]
        return [list(StreamingLoader(path, **args)), utf8, arrow, tokens]

    loader = StreamingLoader(path, columns=["text"], world_size=1, rank=0)
    monkeypatch.setattr(loaders.blocks, "DECODE_BATCH_BYTES", 2_000)
    chunks = [loader.source.read(b).column("text").num_chunks for b in range(len(loader.source.layout.rows))]
    assert sum(c > 1 for c in chunks) >= 0.8 * len(chunks)  # (a shard's last, small block may take one)
    whole, batched = stream(1 << 40), stream(2_000)
    assert batched[:3] == whole[:3]
    assert len(batched[3]) == len(whole[3]) and all(np.array_equal(a, b) for a, b in zip(batched[3], whole[3]))
    assert batched[0] == batched[2]  # (python and arrow agree, so the comparison above is not of empty streams)
    assert sorted(t for b in batched[0] for t in b["text"]) == sorted(texts)


@pytest.mark.parametrize("seq_len", [None, 64])
def test_units_hold_the_streams_batches_in_growing_runs(corpus: tuple[str, list[str]], seq_len: int | None) -> None:
    import pyarrow as pa

    path, _ = corpus
    args = {"batch_size": 4, "columns": ["id", "cluster_size"], "seed": 3, "world_size": 1, "rank": 0,
            "num_workers": 2, "worker_id": 1, "shuffle_window": 40, "seq_len": seq_len}
    batches = list(StreamingLoader(path, **args))
    units = list(StreamingLoader(path, **args).units(4))
    assert units[-1].last and not units[-1].sizes and all(not u.last for u in units[:-1])
    assert [len(u.sizes) for u in units[:3]] == [1, 2, 4] and max(len(u.sizes) for u in units) == 4
    cut = []
    for unit in units[:-1]:
        bounds = np.cumsum([0, *unit.sizes]).tolist()
        if seq_len:
            tokens = np.asarray(unit.columns["packed"])[0]
            cut += [{"tokens": tokens[a:b], "position": p} for a, b, p in zip(bounds, bounds[1:], unit.positions)]
            continue
        rows, data = bounds[-1], np.asarray(unit.columns["id"])
        offsets, text = data[:8 * (rows + 1)], data[8 * (rows + 1):]
        ids = pa.LargeStringArray.from_buffers(rows, pa.py_buffer(offsets), pa.py_buffer(text)).to_pylist()
        cut += [{"id": ids[a:b], "cluster_size": unit.columns["cluster_size"][a:b]} for a, b in zip(bounds, bounds[1:])]
    assert len(cut) == len(batches)
    for got, want in zip(cut, batches):
        if seq_len:
            assert np.array_equal(got["tokens"], want["tokens"]) and got["position"] == want["position"]
        else:
            assert got == want


@pytest.mark.parametrize("seq_len", [None, 50])
def test_reading_in_the_calling_thread_gives_the_same_stream(corpus: tuple[str, list[str]], seq_len: int | None) -> None:
    import threading

    path, _ = corpus
    args = {"batch_size": 5, "columns": ["id"], "seed": 8, "world_size": 1, "rank": 0, "shuffle_window": 45,
            "seq_len": seq_len}
    key = "tokens" if seq_len else "id"
    before = set(threading.enumerate())
    stream = iter(StreamingLoader(path, io_threads=0, **args))
    first = next(stream)
    assert set(threading.enumerate()) <= before  # nothing runs beside the caller, so a fork here is safe
    got = [first[key]] + [b[key] for b in stream]
    threaded = [b[key] for b in StreamingLoader(path, **args)]
    assert len(got) == len(threaded) and all(np.array_equal(a, b) for a, b in zip(got, threaded))


@pytest.mark.parametrize("io_threads", [0, 2])
def test_a_windows_blocks_are_freed_once_the_next_window_is_read(corpus: tuple[str, list[str]],
                                                                   io_threads: int) -> None:
    import weakref

    path, _ = corpus
    loader = StreamingLoader(path, batch_size=16, columns=["text"], world_size=1, rank=0, shuffle_window=64,
                             io_threads=io_threads)
    order, specs, _ = loader._plan()
    seen: list = []  # every Window stays referenced, as the batching generators' frames keep theirs
    previous: dict[int, weakref.ref] = {}
    for window in loader._prefetcher(order, specs[0], 0, lambda t: (t, t.nbytes), 1.0):
        # Blocks the last window does not share with this one must be gone although its Window object is
        # still referenced, or each window is decoded into fresh memory while the last one's is still held.
        assert all(ref() is None for block, ref in previous.items() if block not in window.data)
        previous = {block: weakref.ref(table) for block, table in window.data.items()}
        seen.append(window)
    assert len(seen) > 3 and not any(w.data for w in seen)


def test_footers_are_kept_within_a_byte_bound(corpus: tuple[str, list[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one footer only, every shard's footer is read again when needed: same batches."""
    import gristmill.loaders.blocks  # noqa: F401
    from gristmill import loaders

    path, _ = corpus
    expected = ids_of(StreamingLoader(path, batch_size=16, columns=["id"], seed=5, world_size=1, rank=0))
    monkeypatch.setattr(loaders.blocks, "FOOTER_CACHE_BYTES", 1)
    loader = StreamingLoader(path, batch_size=16, columns=["id"], seed=5, world_size=1, rank=0)
    assert ids_of(loader) == expected
    assert len(loader.source._footers) == 1 and loader.counters.footers_dropped > 0
