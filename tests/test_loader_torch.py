"""The PyTorch adapter with real DataLoader worker processes (CPU torch)."""

from __future__ import annotations

import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gristmill.loaders import StreamingLoader  # noqa: E402
from gristmill.loaders.mixing import MixedLoader  # noqa: E402
from gristmill.loaders.torch_dataset import MixedDataset, StreamingDataLoader, StreamingDataset  # noqa: E402
from tests.test_loader import make_corpus  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str]]:
    path = str(tmp_path_factory.mktemp("torch-corpus"))
    return path, make_corpus(path, 1000, seed=12)


def loader_for(path: str, workers: int, **kwargs: object) -> StreamingDataLoader:
    args = {"batch_size": 8, "columns": ["id"], "seed": 5, "rank": 1, "world_size": 2, "shuffle_window": 48}
    args.update(kwargs)
    return StreamingDataLoader(StreamingDataset(path, **args), num_workers=workers)


def test_workers_read_the_ranks_rows_once(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    in_process = sorted(i for b in StreamingLoader(path, batch_size=8, columns=["id"], seed=5, rank=1, world_size=2,
                                                   shuffle_window=48) for i in b["id"])
    loader = loader_for(path, 2)
    got = [i for b in loader for i in b["id"]]
    assert sorted(got) == in_process and len(set(got)) == len(got)
    assert loader.stream.epoch == 1  # the DataLoader advanced the epoch at its end


@pytest.mark.parametrize("stop_after", [7, 20])
def test_exact_resume_with_two_workers(corpus: tuple[str, list[str]], stop_after: int) -> None:
    path, _ = corpus
    full = [b["id"] for b in loader_for(path, 2)]
    first = loader_for(path, 2)
    head = []
    for batch in first:
        head.append(batch["id"])
        if len(head) == stop_after:
            break
    resumed = loader_for(path, 2)
    resumed.load_state_dict(first.state_dict())
    assert head + [b["id"] for b in resumed] == full


def test_elastic_resume_two_workers_to_none(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    everything = sorted(i for b in loader_for(path, 0) for i in b["id"])
    first = loader_for(path, 2)
    head = []
    for batch in first:
        head += batch["id"]
        if len(head) >= 8 * 9:
            break
    resumed = loader_for(path, 0)
    resumed.load_state_dict(first.state_dict())
    rest = [i for b in resumed for i in b["id"]]
    assert sorted(head + rest) == everything
    assert max(collections.Counter(head + rest).values()) == 1


def test_packed_batches_are_int32_tensors_with_pin_memory(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    dataset = StreamingDataset(path, batch_size=4, seq_len=64, seed=1, world_size=1, rank=0)
    loader = StreamingDataLoader(dataset, num_workers=2, pin_memory=True)
    batches = list(loader)
    assert batches and all(b["tokens"].dtype == torch.int32 and b["tokens"].shape[1] == 64 for b in batches)
    assert all(b["segment_ids"].shape == b["tokens"].shape for b in batches)
    real = sum(int((b["segment_ids"] > 0).sum()) for b in batches)
    assert real == sum(len(t.encode()) + 1 for t in corpus[1])  # every byte plus one eos per document


@pytest.mark.parametrize("keep", [True, False])
def test_token_batches_stay_intact_while_workers_reuse_buffers(corpus: tuple[str, list[str]], keep: bool) -> None:
    path, _ = corpus
    args = {"batch_size": 2, "seq_len": 32, "seed": 3, "world_size": 1, "rank": 0}
    streams = [[b["tokens"] for b in StreamingLoader(path, num_workers=2, worker_id=w, **args)] for w in range(2)]
    expected = [s[i] for i in range(max(map(len, streams))) for s in streams if i < len(s)]  # round-robin
    loader = StreamingDataLoader(StreamingDataset(path, **args), num_workers=2)
    # Held batches must never be overwritten; dropped ones let the workers reuse their buffers.
    got = [b["tokens"] if keep else b["tokens"].clone() for b in loader]
    assert len(got) == len(expected) > 2 * 16  # more units than a worker's pool has buffers
    assert all(np.array_equal(g.numpy(), e) for g, e in zip(got, expected))


def test_arrow_batches_through_workers_keep_the_ranks_order(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    as_units = [b["id"] for b in loader_for(path, 2)]
    one_by_one = [b.column("id").to_pylist() for b in loader_for(path, 2, output="arrow")]
    assert one_by_one == as_units


@pytest.mark.parametrize("steps", [61, 2000])  # ranks stop early; ranks run short and pad
def test_packed_units_keep_the_step_quota_across_ranks(corpus: tuple[str, list[str]], steps: int) -> None:
    path, _ = corpus
    args = {"batch_size": 2, "seq_len": 48, "seed": 6, "world_size": 2, "steps_per_epoch": steps}
    for rank in range(2):
        streams = [[b["tokens"] for b in StreamingLoader(path, rank=rank, num_workers=2, worker_id=w, **args)]
                   for w in range(2)]
        expected = [streams[i % 2][i // 2] for i in range(steps)]
        got = [b["tokens"].numpy() for b in StreamingDataLoader(StreamingDataset(path, rank=rank, **args),
                                                                 num_workers=2)]
        assert len(got) == steps and all(np.array_equal(g, e) for g, e in zip(got, expected))


def test_pin_memory_thread_passes_units_and_their_release_flags_through() -> None:
    from torch.utils.data._utils.pin_memory import pin_memory

    from gristmill.loaders.torch_dataset import _SharedPool, _Shipment
    from gristmill.loaders.units import Unit

    pool = _SharedPool()
    buffer = pool.allocate(10, np.uint8)
    shipment = _Shipment(Unit(0, sizes=[1], columns={"text": buffer}), pool.released, pool.lent())
    assert pin_memory(shipment) is shipment  # the flags stay the shared tensor the worker reads
    assert shipment.slots == [0] and not pool.released[0]


def test_shared_pool_reuses_a_released_buffer_for_a_larger_unit_of_another_type() -> None:
    from gristmill.loaders.torch_dataset import _SharedPool

    pool = _SharedPool()
    first = pool.allocate(1000, np.uint8)
    slots = pool.lent()
    memory = first.untyped_storage().data_ptr()
    del first
    pool.released[slots] = 1  # what the main process does once it let go of the unit
    grown = pool.allocate(2_000_000, np.int32)  # units grow; packed tokens are int32
    assert grown.untyped_storage().data_ptr() == memory and grown.is_shared()
    assert grown.dtype == torch.int32 and grown.numel() == 2_000_000
    lent = pool.allocate(10, np.uint8)  # the first buffer is lent again: the next unit gets its own
    assert lent.untyped_storage().data_ptr() != memory


def test_bad_dataloader_arguments_are_refused_before_the_dataset_changes(corpus: tuple[str, list[str]]) -> None:
    dataset = StreamingDataset(corpus[0], batch_size=8, columns=["id"], world_size=1, rank=0)
    with pytest.raises(TypeError, match="reads a StreamingDataset or a MixedDataset, got TensorDataset"):
        StreamingDataLoader(torch.utils.data.TensorDataset(torch.zeros(2)))  # type: ignore[arg-type]
    for arguments, message in [({"num_workers": -1}, "num_workers must be >= 0"),
                               ({"num_workers": 1.5}, "num_workers must be an integer"),
                               ({"batch_size": 4}, "set batch_size on the dataset"),
                               ({"prefetch_factor": 2}, "prefetch_factor")]:  # DataLoader's own check
        with pytest.raises((TypeError, ValueError), match=message):
            StreamingDataLoader(dataset, **arguments)
    assert dataset.loader.num_workers == 1 and not dataset.units


def test_a_refused_state_leaves_the_dataloader_where_it_was(corpus: tuple[str, list[str]]) -> None:
    path, _ = corpus
    full = [b["id"] for b in loader_for(path, 2)]
    first = loader_for(path, 2)
    for _ in zip(range(7), first):
        pass
    state = first.state_dict()
    resumed = loader_for(path, 2)
    resumed.load_state_dict(state)
    for bad, name in [({**state, "batches": -1}, "'batches'"), ({**state, "seed": 6}, "'seed'"),
                      ({**state, "corpus": "0" * 32}, "another corpus")]:
        with pytest.raises(ValueError, match=name):
            resumed.load_state_dict(bad)
    assert [b["id"] for b in resumed] == full[7:]


def _mix(paths: list[str]) -> MixedLoader:
    packed = StreamingLoader(paths[0], batch_size=4, seq_len=32, seed=1, world_size=1, rank=0)
    documents = StreamingLoader(paths[1], batch_size=4, columns=["id"], seed=2, world_size=1, rank=0)
    return MixedLoader([packed, documents], [0.7, 0.3], seed=4, steps_per_epoch=60)


def _key(pair: tuple[int, dict]) -> tuple:
    index, batch = pair
    return (index, tuple(np.asarray(batch["tokens"]).ravel().tolist()) if "tokens" in batch else tuple(batch["id"]))


def test_a_mix_streams_through_the_dataloader_as_tensors_and_resumes(tmp_path_factory: pytest.TempPathFactory) -> None:
    paths = [str(tmp_path_factory.mktemp(f"mix{i}")) for i in range(2)]
    for index, path in enumerate(paths):
        make_corpus(path, 200, seed=20 + index, name_prefix=f"m{index}")
    direct = [_key(pair) for pair in _mix(paths)]
    loader = StreamingDataLoader(MixedDataset(_mix(paths)), pin_memory=True)
    assert len(loader) == 60
    pairs = list(loader)
    assert [_key(pair) for pair in pairs] == direct and {i for i, _ in pairs} == {0, 1}
    assert all(b["tokens"].dtype == torch.int32 for i, b in pairs if i == 0)
    assert loader.mix.epoch == 1 and loader.state_dict()["epoch"] == 1  # the epoch ran to its end

    first = StreamingDataLoader(_mix(paths))  # a MixedLoader itself is taken too
    head = [_key(pair) for _, pair in zip(range(23), first)]
    resumed = StreamingDataLoader(MixedDataset(_mix(paths)))
    resumed.load_state_dict(first.state_dict())
    assert head + [_key(pair) for pair in resumed] == direct


def test_a_mix_with_dataloader_workers_is_refused_in_one_line(tmp_path: object) -> None:
    path = str(tmp_path)
    make_corpus(path, 20, seed=1)
    mix = MixedLoader([StreamingLoader(path, batch_size=4, world_size=1, rank=0)], [1.0])
    with pytest.raises(ValueError, match=r"^num_workers=2: a mix is read in the training process"):
        StreamingDataLoader(MixedDataset(mix), num_workers=2)
