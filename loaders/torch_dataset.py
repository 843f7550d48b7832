"""PyTorch adapter: the one module of ``loaders`` that imports torch.

``StreamingDataset`` is an ``IterableDataset`` of ready-made batches (use ``batch_size=None``); each
DataLoader worker reads its own, non-overlapping share of the rank's blocks. ``StreamingDataLoader``
is a ``DataLoader`` that also counts what it handed to the training loop, so ``state_dict()`` and
``load_state_dict()`` resume exactly (or elastically, under another world size or worker count).
Packed-token batches arrive as int32 tensors: with ``pin_memory=True`` in pinned memory (where an
accelerator is present), and with ``device="cuda"`` already on the GPU, copied one batch ahead on a side
stream while the training step uses the previous one.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from gristmill.loaders.extras import missing_extra

try:
    import torch
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info
except ModuleNotFoundError as exc:
    raise missing_extra(exc, "torch", "gristmill.loaders.torch_dataset") from None

from gristmill.loaders.blocks import Counters  # noqa: E402  (after the check that torch is installed)
from gristmill.loaders.checks import integer, shown  # noqa: E402
from gristmill.loaders.loader import StreamingLoader  # noqa: E402
from gristmill.loaders.mixing import MixedLoader  # noqa: E402
from gristmill.loaders.units import Unit  # noqa: E402


class StreamingDataset(IterableDataset):
    """A corpus as an IterableDataset of batches; takes the same arguments as ``StreamingLoader``."""

    def __init__(self, url: str, **loader_args: Any) -> None:
        super().__init__()
        self.loader = StreamingLoader(url, **loader_args)
        self.units = False  # set by StreamingDataLoader: workers ship units of batches in shared memory

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        """Batches per epoch of this rank, as ``len(StreamingLoader)`` (so ``len(DataLoader)`` works too)."""
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        # Each worker (or the main process) iterates its own copy. Under a plain DataLoader the worker
        # count may differ from the loader's: split correctly, resume state is not tracked. After a resume,
        # DataLoader asks worker 0 first; it continues the stream whose batch is next.
        workers = info.num_workers if info is not None else 1
        loader = self.loader.for_stream(((info.id if info is not None else 0) + self.loader.batches_done) % workers,
                                        num_workers=workers,
                                        counters=Counters() if info is not None else self.loader.counters)
        if self.units and info is not None:
            pool = _SharedPool()
            for index, unit in enumerate(loader.units(UNIT_BATCHES, pool.allocate)):
                # the flags cross once: every tensor sent costs a file-descriptor handover
                yield _Shipment(unit, pool.released if index == 0 else None, pool.lent())
            return
        for batch in loader:
            yield _with_tensors(batch)


class MixedDataset(IterableDataset):
    """A ``MixedLoader`` as an IterableDataset of ``(source index, batch)``, for ``StreamingDataLoader``
    (``num_workers=0``: the mix reads its sources with their own I/O threads)."""

    def __init__(self, mix: MixedLoader) -> None:
        super().__init__()
        if not isinstance(mix, MixedLoader):
            raise TypeError(f"MixedDataset reads a MixedLoader, got {type(mix).__name__}")
        self.mix = mix

    def set_epoch(self, epoch: int) -> None:
        self.mix.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.mix)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        if get_worker_info() is not None:
            raise RuntimeError("a MixedDataset is read in the training process (num_workers=0): each worker "
                               "would replay the whole mix")
        for index, batch in self.mix:
            yield index, _with_tensors(batch)


def _with_tensors(batch: Any) -> Any:
    """A packed-token batch's arrays as tensors (views of the same memory); other batches as they are."""
    if isinstance(batch, Mapping) and "tokens" in batch:
        return dict(batch, tokens=torch.from_numpy(batch["tokens"]), segment_ids=torch.from_numpy(batch["segment_ids"]))
    return batch


class StreamingDataLoader(DataLoader):
    """A DataLoader over a ``StreamingDataset`` (or a ``MixedDataset``, read in this process) that can
    checkpoint and resume the stream."""

    def __init__(self, dataset: StreamingDataset | MixedDataset, num_workers: int = 0,
                 device: str | torch.device | None = None, **kwargs: Any) -> None:
        if isinstance(dataset, MixedLoader):
            dataset = MixedDataset(dataset)
        if not isinstance(dataset, (StreamingDataset, MixedDataset)):
            raise TypeError(f"StreamingDataLoader reads a StreamingDataset or a MixedDataset, got "
                            f"{type(dataset).__name__}; use a plain DataLoader for other datasets")
        if kwargs.pop("batch_size", None) is not None:
            raise ValueError("the dataset yields whole batches; set batch_size on the dataset, not here")
        integer(num_workers, "num_workers", minimum=0)
        if isinstance(dataset, MixedDataset) and num_workers:
            raise ValueError(f"num_workers={num_workers}: a mix is read in the training process (num_workers=0); "
                             "its sources read ahead with their own io_threads")
        self.device = _device(device)
        if self.device is not None and self.device.type == "cuda":
            kwargs.setdefault("pin_memory", True)  # a copy from pinned memory can overlap the training step
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)  # checks the other arguments
        if isinstance(dataset, MixedDataset):
            self.stream = None
            self.mix: MixedLoader | None = dataset.mix
            self._mix_state = dataset.mix.state_dict()  # the mix after the last batch handed out
            return
        self.mix = None
        self.stream = dataset.loader
        self.stream.num_workers = max(1, num_workers)
        # Units carry Python-string documents or packed tokens; Arrow and UTF-8 batches travel one by one.
        dataset.units = num_workers > 0 and (self.stream.seq_len is not None or self.stream.output == "python")

    def __iter__(self) -> Iterator[Any]:
        if self.mix is not None:
            yield from self._mixed()
            return
        batches: Iterator[Any] = itertools.chain(self._first(), self._batches())
        if self.device is not None and self.device.type == "cuda":
            batches = _copied_ahead(batches, self.device)
        for batch in batches:  # counted as handed out (the copy ahead has read one batch further)
            packed = isinstance(batch, Mapping) and "position" in batch
            self.stream.count_batch(batch["position"] if packed else None, batch["worker"] if packed else None)
            yield batch
        self.stream.set_epoch(self.stream.epoch + 1)  # reached only when the epoch ran to its end

    def _mixed(self) -> Iterator[Any]:
        """A mix's ``(source, batch)`` pairs, its state kept as of each one handed out (the copy to a
        device reads one further)."""
        states: deque[dict[str, Any]] = deque()

        def read() -> Iterator[Any]:
            for item in DataLoader.__iter__(self):
                states.append(self.mix.state_dict())  # type: ignore[union-attr]
                yield item

        pairs: Iterator[Any] = read()
        if self.device is not None and self.device.type == "cuda":
            pairs = _copied_ahead(pairs, self.device)
        for pair in pairs:
            self._mix_state = states.popleft()
            yield pair
        self._mix_state = self.mix.state_dict()  # type: ignore[union-attr]  # the epoch ran to its end

    def _first(self) -> list[Any]:
        """With workers, the first batch, read here before they start (as [batch], or []).

        Starting worker processes takes longer than reading one batch. This process reads it in its own
        thread (``io_threads=0``: no thread may be running when DataLoader forks); the workers, started
        when the next batch is asked for, continue after it exactly as after a resume.
        """
        stream = self.stream
        if self.num_workers == 0:
            return []
        reader = stream.for_stream(stream.batches_done % stream.num_workers, io_threads=0)
        batches = iter(reader)
        first = next(batches, None)
        batches.close()
        if first is None:
            return []
        first = _with_tensors(first)
        if "tokens" in first:
            first = dict(first, tokens=self._tensor(first["tokens"]), segment_ids=self._tensor(first["segment_ids"]))
        return [first]

    def _batches(self) -> Iterator[Any]:
        """The rank's batches in order, cut from the workers' units (batch ``i`` is from stream ``i % W``).

        A stream whose ``last`` unit arrived is skipped, as DataLoader skips an exhausted worker.
        """
        items = super().__iter__()
        if not self.dataset.units:  # type: ignore[attr-defined]
            yield from items
            return
        count = self.stream.num_workers
        pending: list[deque[Any]] = [deque() for _ in range(count)]
        ended = [False] * count
        held: list[tuple[list[torch.UntypedStorage], torch.Tensor, list[int]]] = []  # buffers batches may still use
        flags: list[torch.Tensor | None] = [None] * count  # each worker's release flags
        stream = self.stream.batches_done % count
        while True:
            while not pending[stream] and not ended[stream]:
                item = next(items, None)
                if item is None:
                    ended = [True] * count
                    break
                unit = item.unit
                flags[unit.worker] = flags[unit.worker] if item.released is None else item.released
                pending[unit.worker].extend(self._split(unit))
                held.append(([b.untyped_storage() for b in _buffers(unit)], flags[unit.worker], item.slots))
                held = [h for h in held if not _release(*h)]
                ended[unit.worker] |= unit.last
            if pending[stream]:
                yield pending[stream].popleft()
            elif all(ended) and not any(pending):
                return
            stream = (stream + 1) % count

    def _split(self, unit: Unit) -> list[dict[str, Any]]:
        """A unit's batches: Python strings made by Arrow from the shared bytes, or views of the token tensors."""
        bounds = np.cumsum([0, *unit.sizes]).tolist()
        if unit.positions:
            tokens, segments = self._tensor(unit.columns["packed"])
            return [{"tokens": tokens[a:b], "segment_ids": segments[a:b], "position": position, "worker": unit.worker}
                    for a, b, position in zip(bounds, bounds[1:], unit.positions)]
        rows = bounds[-1]
        columns = {name: _strings(value, rows) if isinstance(value, torch.Tensor) else value
                   for name, value in unit.columns.items()}
        return [{name: values[a:b] for name, values in columns.items()} for a, b in zip(bounds, bounds[1:])]

    def set_epoch(self, epoch: int) -> None:
        if self.mix is not None:
            self.mix.set_epoch(epoch)
            self._mix_state = self.mix.state_dict()
        else:
            self.stream.set_epoch(epoch)

    def _tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory() if self.pin_memory and torch.cuda.is_available() else tensor

    def state_dict(self) -> dict[str, Any]:
        """The stream's (or the mix's) position after the last batch this DataLoader yielded."""
        return self._mix_state if self.mix is not None else self.stream.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.mix is not None:
            self.mix.load_state_dict(state)
            self._mix_state = self.mix.state_dict()
        else:
            self.stream.load_state_dict(state)



def _device(device: object) -> torch.device | None:
    """``device`` checked: None, a CPU, or a CUDA device this machine has (else a clear ValueError)."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a torch.device or a string such as 'cuda:0', got {shown(device)}")
    try:
        found = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device={shown(device)} is not a device torch knows ({exc})") from None
    if found.type not in ("cpu", "cuda"):
        raise ValueError(f"device={shown(device)}: batches can be copied ahead to 'cpu' or 'cuda' devices only")
    if found.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={shown(device)} needs CUDA, which this machine or torch build lacks "
                             f"(torch {torch.__version__}: torch.cuda.is_available() is False); leave device "
                             "out or use 'cpu'")
        if found.index is not None and found.index >= torch.cuda.device_count():
            raise ValueError(f"device={shown(device)}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return found


def _copied_ahead(batches: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """Each batch's tensors copied to ``device`` on a side stream while the previous batch is in use.

    The consumer's stream waits for that batch's copy only (an event recorded after it), and each tensor
    is marked as used on that stream, so the caching allocator does not reuse its memory too early.
    """
    side = torch.cuda.Stream(device)
    ahead = None
    for batch in batches:
        with torch.cuda.stream(side):
            moved = _to_device(batch, device)
            copied = torch.cuda.Event()
            copied.record(side)
        if ahead is not None:
            yield _ready(*ahead, device)
        ahead = (moved, copied)
    if ahead is not None:
        yield _ready(*ahead, device)


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, tuple):  # a mix's (source index, batch)
        return tuple(_to_device(part, device) for part in batch)
    if not isinstance(batch, Mapping):
        return batch
    return {key: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
            for key, value in batch.items()}


def _ready(batch: Any, copied: torch.cuda.Event, device: torch.device) -> Any:
    current = torch.cuda.current_stream(device)
    current.wait_event(copied)
    for part in batch if isinstance(batch, tuple) else (batch,):  # a mix's (source index, batch)
        if isinstance(part, Mapping):
            for value in part.values():
                if isinstance(value, torch.Tensor):
                    value.record_stream(current)
    return batch


UNIT_BATCHES = 32  # about 1,000 documents (12 MB here) a unit; 8 and 128 measured no better on 2 cores


@dataclass
class _Shipment:
    """A unit plus the shared flags that hand its buffers back to the worker.

    A class rather than a tuple, so that DataLoader's pin-memory thread passes it through untouched
    (it would copy the flags tensor into pinned memory, where the worker never sees them).
    """

    unit: Unit
    released: torch.Tensor | None  # sent with a worker's first unit only
    slots: list[int]


class _SharedPool:
    """Shared-memory buffers a worker reuses once the main process has released them.

    A fresh shared-memory buffer page-faults on every 4 KiB page it is first written to (for packed
    tokens that system time was most of a worker's CPU). The main process releases a unit's buffers
    by setting their flags in a small shared tensor once nothing there refers to them; a worker that
    finds no released buffer large enough replaces one, or allocates outside the pool (it never waits).
    Buffers are created in shared memory directly (``share_memory_()`` would first fill a private
    buffer and then copy it over, faulting every page twice) and with room to spare, so the buffers of
    the small first units are large enough for the later ones.
    """

    SLOTS = 16
    MIN_BYTES = 32 * 1024**2

    def __init__(self) -> None:
        self.released = torch.ones(self.SLOTS, dtype=torch.int8).share_memory_()
        self.storages: list[torch.UntypedStorage | None] = [None] * self.SLOTS
        self._lent: list[int] = []

    def allocate(self, size: int, dtype: Any) -> torch.Tensor:
        kind = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
        nbytes = size * np.dtype(dtype).itemsize
        free = [slot for slot in range(self.SLOTS) if self.released[slot]]
        held = [slot for slot in free if self.storages[slot] is not None]
        fits = [slot for slot in held if self.storages[slot].nbytes() >= nbytes]  # type: ignore[union-attr]
        if fits:
            slot = min(fits, key=lambda s: self.storages[s].nbytes())  # type: ignore[union-attr]
        elif free:
            # Replace a released buffer that is too small before filling an empty slot: a pool that kept
            # every small buffer would run out of slots before a large one came back.
            slot = max(held, key=lambda s: self.storages[s].nbytes()) if held else free[0]  # type: ignore[union-attr]
            self.storages[slot] = None  # (unmapped before the new one is mapped)
            self.storages[slot] = torch.UntypedStorage._new_shared(max(nbytes + nbytes // 4, self.MIN_BYTES))
        else:
            return _typed(torch.UntypedStorage._new_shared(nbytes), kind, size)
        self.released[slot] = 0
        self._lent.append(slot)
        return _typed(self.storages[slot], kind, size)  # type: ignore[arg-type]

    def lent(self) -> list[int]:
        """The slots handed out since the last call (the buffers of the unit about to be sent)."""
        slots, self._lent = self._lent, []
        return slots


def _typed(storage: torch.UntypedStorage, kind: torch.dtype, size: int) -> torch.Tensor:
    """The first ``size`` elements of a byte storage as a flat tensor of ``kind``."""
    return torch.empty(0, dtype=kind).set_(storage, 0, (size,))


def _buffers(unit: Unit) -> list[torch.Tensor]:
    return [value for value in unit.columns.values() if isinstance(value, torch.Tensor)]


def _release(storages: list[torch.UntypedStorage], released: torch.Tensor, slots: list[int]) -> bool:
    """Hand a unit's buffers back to its worker once nothing but this list refers to them; True if done.

    Strings are copies, so document units go back at once; token batches are views of the buffers,
    which go back when the training loop has dropped every tensor made from them.
    """
    # the storage's C++ reference count: tensors and views of it anywhere in this process, plus ours
    if any(torch._C._storage_Use_Count(s._cdata) > 1 for s in storages):
        return False
    released[slots] = 1
    return True


def _strings(buffer: torch.Tensor, rows: int) -> list[str]:
    """Python strings made by Arrow, in one call, from a unit's column: int64 offsets, then UTF-8 bytes."""
    data = buffer.numpy()
    head = 8 * (rows + 1)
    return pa.LargeStringArray.from_buffers(rows, pa.py_buffer(data[:head]), pa.py_buffer(data[head:])).to_pylist()
