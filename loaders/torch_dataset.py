"""PyTorch adapter: the one module of ``loaders`` that imports torch.

``StreamingDataset`` is an ``IterableDataset`` of ready-made batches (use ``batch_size=None``); each
DataLoader worker reads its own, non-overlapping share of the rank's blocks. ``StreamingDataLoader``
is a ``DataLoader`` that also counts what it handed to the training loop, so ``state_dict()`` and
``load_state_dict()`` resume exactly (or elastically, under another world size or worker count).
Packed-token batches arrive as int32 tensors and work with ``pin_memory=True``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loaders.blocks import Counters
from loaders.loader import StreamingLoader


class StreamingDataset(IterableDataset):
    """A corpus as an IterableDataset of batches; takes the same arguments as ``StreamingLoader``."""

    def __init__(self, url: str, **loader_args: Any) -> None:
        super().__init__()
        self.loader = StreamingLoader(url, **loader_args)
        self.shared_text = False  # set by StreamingDataLoader: ship batches to the main process as bytes

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        loader = copy.copy(self.loader)  # each worker (or the main process) iterates its own copy
        loader._source = None
        loader.counters = Counters() if info is not None else self.loader.counters
        workers = info.num_workers if info is not None else 1
        if workers != self.loader.num_workers:
            loader.num_workers = workers  # a plain DataLoader: split correctly, resume state is not tracked
        # After a resume, DataLoader asks worker 0 first; it continues the stream whose batch is next.
        loader.worker_id = ((info.id if info is not None else 0) + self.loader._batches) % loader.num_workers
        shared = self.shared_text and info is not None
        text = shared and loader.seq_len is None and loader.output == "python"
        if text:
            loader.output = "utf8"
        if info is not None and self.loader.io_threads_arg is None:
            loader.io_threads = max(1, (os.cpu_count() or 1) // workers)  # the workers are the parallelism
        for batch in loader:
            if text:
                yield {_SHARED: batch}
                continue
            if shared and "tokens" in batch:
                yield dict(batch, tokens=_Array(batch["tokens"]), segment_ids=_Array(batch["segment_ids"]))
                continue
            if "tokens" in batch:
                batch = dict(batch, tokens=torch.from_numpy(batch["tokens"]),
                             segment_ids=torch.from_numpy(batch["segment_ids"]))
            yield batch


class StreamingDataLoader(DataLoader):
    """A DataLoader over a ``StreamingDataset`` that can checkpoint and resume the stream."""

    def __init__(self, dataset: StreamingDataset, num_workers: int = 0, **kwargs: Any) -> None:
        if kwargs.pop("batch_size", None) not in (None,):
            raise ValueError("the dataset yields whole batches; set batch_size on the dataset, not here")
        dataset.loader.num_workers = max(1, num_workers)
        dataset.shared_text = num_workers > 0
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        self.stream = dataset.loader

    def __iter__(self) -> Iterator[Any]:
        for batch in super().__iter__():
            if isinstance(batch, Mapping) and _SHARED in batch:
                batch = _from_shared(batch[_SHARED])
            elif isinstance(batch, Mapping) and isinstance(batch.get("tokens"), _Array):
                batch = dict(batch, tokens=self._tensor(batch["tokens"]), segment_ids=self._tensor(batch["segment_ids"]))
            self.stream._batches += 1
            if isinstance(batch, Mapping) and "position" in batch:
                streams = list(self.stream._streams or [(0, 0)] * self.stream.num_workers)
                streams[int(batch["worker"])] = tuple(int(x) for x in batch["position"])
                self.stream._streams = streams
            yield batch
        self.stream.set_epoch(self.stream.epoch + 1)  # reached only when the epoch ran to its end

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    def _tensor(self, packed: _Array) -> torch.Tensor:
        tensor = torch.frombuffer(packed.data, dtype=torch.int32).view(*packed.shape)
        return tensor.pin_memory() if self.pin_memory and torch.cuda.is_available() else tensor

    def state_dict(self) -> dict[str, Any]:
        """The stream's position after the last batch this DataLoader yielded."""
        return self.stream.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.stream.load_state_dict(state)



_SHARED = "__gristmill_shared__"


class _Array:
    """An int32 batch array on its way from a worker to the main process, as a bytearray.

    DataLoader would move a tensor into a new shared-memory segment per batch (milliseconds each) and
    its ``default_convert`` walks a bare bytearray element by element; wrapped like this it pickles as
    one copy and becomes a writable tensor in the main process without another.
    """

    __slots__ = ("data", "shape")

    def __init__(self, array: np.ndarray) -> None:
        self.data = bytearray(memoryview(np.ascontiguousarray(array)))
        self.shape = tuple(array.shape)

    def __getstate__(self) -> tuple[bytearray, tuple[int, ...]]:
        return self.data, self.shape

    def __setstate__(self, state: tuple[bytearray, tuple[int, ...]]) -> None:
        self.data, self.shape = state


def _from_shared(columns: Mapping[str, Any]) -> dict[str, list]:
    """Python lists again, made by Arrow straight from the bytes."""
    out: dict[str, list] = {}
    for name, value in columns.items():
        if isinstance(value, Mapping):
            offsets = value["offsets"]
            array = pa.LargeStringArray.from_buffers(len(offsets) // 8 - 1, pa.py_buffer(offsets),
                                                     pa.py_buffer(value["utf8"]))
            value = array.to_pylist()
        out[name] = value
    return out
