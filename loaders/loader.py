"""``StreamingLoader``: batches of documents or packed token sequences from a gristmill corpus URL.

See docs/LOADER.md for the training-script API. The loader reads blocks (row groups) with one ranged
read each, plans every epoch from the manifest alone (loaders/plan.py), prefetches on background
threads within a byte budget (loaders/prefetch.py) and checkpoints as a handful of numbers.
"""

from __future__ import annotations

import math
import os
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (imported up front: its first import inside a batch costs seconds under load)

from loaders.blocks import BlockSource, Counters, check_columns
from loaders.cache import DiskCache
from loaders.checks import INT32_MAX, INT32_MIN, flag, integer, optional_integer, shown
from loaders.concurrency import room_for_reads
from loaders.plan import EpochOrder, Generation, Split, StreamSpec, consumed_by_batches, plan_generation
from loaders.prefetch import Prefetcher, Window, read_inline
from loaders.state import STATE_VERSION, Resume, SavedState, as_mapping, corpus_fingerprint, parse_state
from loaders.tokenizers import FROM_TOKENIZER, EosChoice, as_tokenizer
from pipeline.format import Corpus

OUTPUTS = ("python", "arrow", "utf8")
DEFAULT_PREFETCH_BYTES = 256 * 1024 * 1024
DEFAULT_WINDOW_BLOCKS = 8


def distributed_defaults() -> tuple[int, int]:
    """(rank, world_size) from an initialised torch.distributed, else torchrun's environment, else (0, 1).

    torch is only consulted when the training script has already imported it.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return _environment_int("RANK", 0), _environment_int("WORLD_SIZE", 1)


def _environment_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={shown(text)} is not an integer; fix it, or pass rank= and "
                         "world_size= to the loader") from None


def _column_names(columns: object) -> list[str]:
    """``columns`` as a non-empty list of distinct names (a bare string would be read as its letters)."""
    if isinstance(columns, str):
        raise TypeError(f"columns must be a list of column names such as [{shown(columns)}], not a string")
    if not isinstance(columns, Iterable):
        raise TypeError(f"columns must be a list of column names, got {shown(columns)}")
    names = list(columns)
    if not names or not all(isinstance(name, str) for name in names) or len(set(names)) != len(names):
        raise ValueError(f"columns must be one or more distinct column names, got {shown(names)}")
    return names


class StreamingLoader:
    """An iterable of batches over a corpus; one ``for`` loop is one epoch.

    Document batches are ``{column: list}`` (``output="python"``), a ``pyarrow.Table``
    (``output="arrow"``), or, for moving batches between processes, ``{column: {"offsets", "utf8"}}``
    byte strings for text columns (``output="utf8"``; other columns stay lists). With ``seq_len`` set, batches are ``{"tokens", "segment_ids"}`` int32 arrays of
    shape ``[batch_size, seq_len]``: documents packed back to back (each followed by the tokenizer's
    own end-of-document token, or ``eos_id`` when given; loaders/tokenizers.py), ``segment_ids`` numbering the documents within a row from 1 and 0 for padding, so
    boundaries are recoverable. ``worker_id``/``num_workers`` are set by the PyTorch adapter.
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        batch_size: int = 32,
        columns: Sequence[str] = ("text",),
        shuffle: bool = True,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        drop_last: bool = False,
        seq_len: int | None = None,
        tokenizer: object = None,
        eos_id: EosChoice = FROM_TOKENIZER,
        pad_id: int = 0,
        steps_per_epoch: int | None = None,
        shuffle_window: int | None = None,
        prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
        io_threads: int | None = None,
        max_reads: int = 64,
        coalesce_bytes: int = 4 * 1024 * 1024,
        cache_dir: str | None = None,
        cache_bytes: int = 16 * 1024**3,
        verify_checksums: bool = False,
        retries: int = 4,
        output: str = "python",
        storage_options: Mapping[str, Any] | None = None,
        worker_id: int = 0,
        num_workers: int = 1,
    ) -> None:
        if not isinstance(url, (str, os.PathLike)):
            raise TypeError(f"url must be a corpus folder or URL string, got {shown(url)}")
        if output not in OUTPUTS:
            raise ValueError(f"output must be one of {OUTPUTS}, got {shown(output)}")
        self.seq_len = optional_integer(seq_len, "seq_len", minimum=1)
        if self.seq_len is None:
            for name, value in (("tokenizer", tokenizer), ("steps_per_epoch", steps_per_epoch),
                                ("eos_id", None if eos_id is FROM_TOKENIZER else eos_id)):
                if value is not None:
                    raise ValueError(f"{name} applies to packed tokens only: set seq_len as well, or leave {name} out")
        elif output != "python":
            raise ValueError(f"output={output!r} applies to document batches; packed-token batches are always "
                             "{'tokens', 'segment_ids'} arrays")
        self.url = os.fspath(url)
        self.batch_size = integer(batch_size, "batch_size", minimum=1)
        self.columns = _column_names(columns)
        self.shuffle = flag(shuffle, "shuffle")
        self.seed = integer(seed, "seed", minimum=0)
        if rank is None or world_size is None:
            default_rank, default_world = distributed_defaults()
            rank = default_rank if rank is None else rank
            world_size = default_world if world_size is None else world_size
        self.world_size = integer(world_size, "world_size", minimum=1)
        self.rank = integer(rank, "rank", minimum=0)
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not in [0, {self.world_size}): ranks count from 0 to world_size - 1")
        self.drop_last = flag(drop_last, "drop_last")
        if eos_id is not FROM_TOKENIZER:
            optional_integer(eos_id, "eos_id", minimum=INT32_MIN, maximum=INT32_MAX)
        self.tokenizer = as_tokenizer(tokenizer, eos_id) if self.seq_len is not None else None
        if self.tokenizer is not None:
            optional_integer(self.tokenizer.eos_id, "the tokenizer's eos_id", minimum=INT32_MIN, maximum=INT32_MAX)
        self.pad_id = integer(pad_id, "pad_id", minimum=INT32_MIN, maximum=INT32_MAX)
        self.steps_per_epoch = optional_integer(steps_per_epoch, "steps_per_epoch", minimum=1)
        shuffle_window = optional_integer(shuffle_window, "shuffle_window", minimum=1)
        self.prefetch_bytes = integer(prefetch_bytes, "prefetch_bytes", minimum=1)
        io_threads = optional_integer(io_threads, "io_threads", minimum=0)
        self.io_threads = min(4, os.cpu_count() or 1) if io_threads is None else io_threads
        self.max_reads = integer(max_reads, "max_reads", minimum=1)
        self.coalesce_bytes = integer(coalesce_bytes, "coalesce_bytes", minimum=0)
        self.output = output
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise TypeError(f"storage_options must be a dict of fsspec options, got {shown(storage_options)}")
        self.storage_options = dict(storage_options or {})
        self.num_workers = integer(num_workers, "num_workers", minimum=1)
        self.worker_id = integer(worker_id, "worker_id", minimum=0, maximum=self.num_workers - 1)
        self.verify_checksums = flag(verify_checksums, "verify_checksums")
        self.retries = integer(retries, "retries", minimum=0)
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a local folder path, got {shown(cache_dir)}")
        self.cache_dir = None if cache_dir is None else os.fspath(cache_dir)
        self.cache_bytes = integer(cache_bytes, "cache_bytes", minimum=1)
        self.counters = Counters()
        self.corpus = Corpus.open(self.url, room_for_reads(self.url, self.storage_options, self.max_reads))
        check_columns(self.corpus, self._read_columns)
        self._source: BlockSource | None = None
        rows = max(1, self.corpus.num_rows)
        blocks = max(1, sum(len(s.row_groups) for s in self.corpus.shards))
        window = shuffle_window or DEFAULT_WINDOW_BLOCKS * math.ceil(rows / blocks)
        self.window = math.ceil(window / self.batch_size) * self.batch_size  # whole batches: none straddles windows
        self._fingerprint: str | None = None  # of the corpus, computed when a state is first saved or loaded
        self.epoch = 0
        self._history: list[Generation] = []
        self._batches = 0  # batches this rank has yielded in the current generation
        self._streams: list[tuple[int, int]] | None = None  # token mode: (docs, tokens) per worker stream
        self._tokens_per_row: float | None = None

    # -- configuration the plan depends on --------------------------------------------------------
    @property
    def source(self) -> BlockSource:
        """Opened lazily so a loader pickled into a DataLoader worker opens its own connections."""
        if self._source is None:
            cache = DiskCache(self.cache_dir, self.cache_bytes) if self.cache_dir else None
            self._source = BlockSource(self.corpus, self._read_columns, retries=self.retries, cache=cache,
                                       verify_checksums=self.verify_checksums, counters=self.counters,
                                       max_reads=self.max_reads, coalesce_bytes=self.coalesce_bytes)
        return self._source

    @property
    def _read_columns(self) -> list[str]:
        return ["text"] if self.seq_len else self.columns

    def _generation(self) -> Generation:
        return Generation(self.world_size, self.num_workers, self.batch_size, self.window)

    def _plan(self) -> tuple[EpochOrder, list[StreamSpec], Split]:
        order = EpochOrder.build(self.source.layout.rows, self.seed, self.epoch, self.shuffle)
        specs, split = plan_generation(order.total, self._history, self._generation(), seed=self.seed,
                                       epoch=self.epoch, shuffle=self.shuffle, drop_last=self.drop_last,
                                       by_batches=self.seq_len is None)
        return order, specs, split

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning at the next iteration (each epoch has its own shuffle)."""
        self.epoch = integer(epoch, "epoch", minimum=0)
        self._history = []
        self._batches = 0
        self._streams = None

    def __len__(self) -> int:
        """Batches this rank yields in a whole epoch (document mode, or token mode with a step count)."""
        steps = self._steps()
        if steps is not None:
            return steps
        if self.seq_len is not None:
            raise TypeError("a packed-token epoch has no length unless steps_per_epoch is set or world_size > 1")
        _, _, split = self._plan()
        return math.ceil(split.per_rank / self.batch_size)

    # -- checkpoints ------------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        """What the sample order depends on besides the generation; a state resumes only a loader that matches."""
        if self._fingerprint is None:
            self._fingerprint = corpus_fingerprint(self.corpus.shards)
        eos_id = None if self.tokenizer is None or self.tokenizer.eos_id is None else int(self.tokenizer.eos_id)
        return {"corpus": self._fingerprint, "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "seq_len": self.seq_len, "eos_id": eos_id}

    def state_dict(self) -> dict[str, Any]:
        """A few numbers that resume the stream exactly at the next batch (see docs/LOADER.md)."""
        state: dict[str, Any] = {
            "version": STATE_VERSION, **self._identity(), "epoch": self.epoch,
            "world_size": self.world_size, "workers": self.num_workers, "batch_size": self.batch_size,
            "window": self.window, "batches": self._batches,
            "history": [[g.world_size, g.workers, g.batch_size, g.window, list(g.consumed)]
                        for g in self._history],
        }
        if self.seq_len is not None:
            state["streams"] = {str(self.rank): [list(p) for p in (self._streams or [])]}
        return state

    @staticmethod
    def merge_state_dicts(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Combine every rank's state (token mode) so it can resume under a different world size."""
        if not states:
            raise ValueError("merge_state_dicts needs the state of every rank, got none")
        merged = dict(as_mapping(states[0], "loader"))
        merged["streams"] = {}
        for index, state in enumerate(states):
            state = as_mapping(state, "loader")
            for key in (set(merged) | set(state)) - {"streams", "batches"}:
                if state.get(key) != merged.get(key):
                    raise ValueError(f"states[{index}] has {key}={shown(state.get(key))}, states[0] {shown(merged.get(key))}: "
                                     "merge the states of one checkpoint, one per rank")
            streams = state.get("streams")
            if not isinstance(streams, Mapping):
                raise ValueError(f"states[{index}] has no packed-token 'streams'; document states need no merging")
            for rank, positions in streams.items():
                if rank in merged["streams"]:
                    raise ValueError(f"states[{index}] repeats rank {rank}: give each rank's state once")
                merged["streams"][rank] = positions
        return merged

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved state: the next batch is the one that followed it.

        Under the same world size, workers and batch size this is exact; otherwise (elastic) the rows the
        old ranks had not read are re-divided among the new ones, none lost or repeated. A state of another
        corpus or order, or with any field out of range, is refused (ValueError naming the field) before
        anything changes.
        """
        self._restore(self._check_state(state))

    def _check_state(self, state: object) -> Resume:
        """Where ``state`` resumes this loader, once every field is checked against this corpus and plan."""
        saved: SavedState = parse_state(state, self._identity())
        generation = saved.generation
        specs, split = plan_generation(self.corpus.num_rows, saved.history, generation, seed=self.seed,
                                       epoch=saved.epoch, shuffle=self.shuffle, drop_last=self.drop_last,
                                       by_batches=self.seq_len is None)
        if self.seq_len is None:
            limit = math.ceil(split.per_rank / generation.batch_size)
        else:
            limit = self.steps_per_epoch
            # What the rank's batches so far could hold: every document passed, and the tokens of the one
            # under way, went out in them (each document with its eos at least), so a position further on
            # is not one a run reached: it would skip documents unread and pad out the epoch instead.
            held = saved.batches * generation.batch_size * self.seq_len
            eos = 0 if self.tokenizer is None or self.tokenizer.eos_id is None else 1
            for rank, positions in saved.streams.items():
                for worker, (documents, tokens) in enumerate(positions):
                    name = f"state field 'streams[{str(rank)!r}][{worker}]' is [{documents}, {tokens}]"
                    rows = len(specs[rank * generation.workers + worker].positions)
                    if documents > rows or (documents == rows and tokens):
                        raise ValueError(f"{name}, past the end of that stream ({rows} documents)")
                    if documents * eos + tokens > held:
                        raise ValueError(f"{name}, more than the {saved.batches} batches of {generation.batch_size} x "
                                         f"{self.seq_len} tokens in 'batches' could have held")
        if limit is not None and saved.batches > limit:
            raise ValueError(f"state field 'batches' is {saved.batches}, but a rank has {limit} batches in this "
                             "epoch under the state's world_size, workers and batch_size")
        if generation == self._generation():
            streams = saved.streams.get(self.rank) or None
            if self.seq_len is not None and streams is None and saved.batches:
                raise ValueError(f"state field 'streams' has no position for rank {self.rank}, which had yielded "
                                 f"{saved.batches} batches: load this rank's own state")
            return Resume(saved.epoch, saved.history, saved.batches, streams)
        # Elastic: close the saved generation with what every one of its streams consumed.
        if self.seq_len is None:
            per_rank = consumed_by_batches(split, generation.workers, generation.batch_size, saved.batches)
            consumed = tuple(per_rank * generation.world_size)
        else:
            if sorted(saved.streams) != list(range(generation.world_size)):
                raise ValueError("an elastic resume of packed-token batches needs every rank's state: pass "
                                 "StreamingLoader.merge_state_dicts([state of rank 0, rank 1, ...])")
            consumed = tuple(documents + (1 if tokens else 0) for rank in range(generation.world_size)
                             for documents, tokens in saved.streams[rank] or [(0, 0)] * generation.workers)
        closed = Generation(generation.world_size, generation.workers, generation.batch_size, generation.window,
                            consumed)
        return Resume(saved.epoch, [*saved.history, closed], 0, None)

    def _restore(self, resume: Resume) -> None:
        self.set_epoch(resume.epoch)
        self._history = list(resume.history)
        self._batches = resume.batches
        self._streams = resume.streams

    # -- iteration --------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        order, specs, split = self._plan()
        spec = specs[self.rank * self.num_workers + self.worker_id]
        if self.seq_len is None:
            batches = self._documents(order, spec, split)
        else:
            batches = self._packed(order, spec)
        yield from batches
        self.set_epoch(self.epoch + 1)

    def units(self, max_batches: int, allocate: Callable[[int, Any], Any] = np.empty) -> Iterator[Unit]:
        """This worker's stream as ``Unit``s of up to ``max_batches`` batches, then one empty ``last`` unit.

        For moving batches between processes in few, large pieces (the PyTorch adapter's workers). Units
        grow 1, 2, 4, … batches so the first batch is not held back, and every worker's units have the
        same sizes, so DataLoader's round-robin delivers them in the order the batches are needed.
        ``allocate(size, dtype)`` makes each flat buffer (e.g. in shared memory); ``np.asarray`` of it must
        be a writable view. Batches counted here are the worker's; the receiver counts the rank's.
        """
        order, specs, split = self._plan()
        spec = specs[self.rank * self.num_workers + self.worker_id]
        if self.seq_len is None:
            yield from self._document_units(order, spec, split, max_batches, allocate)
        else:
            yield from self._packed_units(order, spec, max_batches, allocate)
        yield Unit(self.worker_id, last=True)
        self.set_epoch(self.epoch + 1)

    def _prefetcher(self, order: EpochOrder, spec: StreamSpec, start: int, prepare: Any,
                    expansion: float) -> Iterable[Window]:
        if self.io_threads == 0:
            return read_inline(self.source, order, spec, start, prepare)
        return Prefetcher(self.source, order, spec, start, prepare, budget_bytes=self.prefetch_bytes,
                          threads=self.io_threads, counters=self.counters, expansion=expansion)

    def _count(self, blocks: np.ndarray) -> None:
        self.counters.add(batches=1, distinct_blocks_in_batches=len(set(blocks.tolist())))

    def _document_windows(self, order: EpochOrder, spec: StreamSpec, split: Split) -> Iterator[tuple[Window, int]]:
        """Windows of this worker's stream and the row each starts at (whole batches), resuming after
        ``self._batches`` batches of the rank."""
        start = consumed_by_batches(split, self.num_workers, self.batch_size, self._batches)[self.worker_id]
        if start >= len(spec.positions):
            return
        arrow = self.output == "arrow"

        def prepare(table: pa.Table) -> tuple[Any, int]:
            return (table if arrow else _Block(table)), table.nbytes

        for window in self._prefetcher(order, spec, start, prepare, 1.0):
            for begin in range(0, len(window.rows), self.batch_size):
                yield window, begin

    def _documents(self, order: EpochOrder, spec: StreamSpec, split: Split) -> Iterator[Any]:
        """Document batches of this worker's stream."""
        build = {"python": _python_batch, "utf8": _utf8_batch}.get(self.output)
        for window, begin in self._document_windows(order, spec, split):
            blocks = window.blocks[begin:begin + self.batch_size]
            rows = window.rows[begin:begin + self.batch_size]
            batch = build(window, blocks, rows, self.columns) if build else _arrow_batch(window, blocks, rows)
            self._count(blocks)
            self._batches += 1
            yield batch

    def _document_units(self, order: EpochOrder, spec: StreamSpec, split: Split, max_batches: int,
                        allocate: Callable[[int, Any], Any]) -> Iterator[Unit]:
        """Runs of consecutive batches within one window gathered into flat buffers (see ``units``)."""
        unit: Unit | None = None
        for window, begin in self._document_windows(order, spec, split):
            if unit is None:
                unit = Unit(self.worker_id, window=window, begin=begin)
            blocks = window.blocks[begin:begin + self.batch_size]
            unit.sizes.append(len(blocks))
            self._count(blocks)
            self._batches += 1
            if len(unit.sizes) == max_batches or begin + self.batch_size >= len(window.rows):
                yield self._gather(unit, allocate)
                unit = None

    def _gather(self, unit: Unit, allocate: Callable[[int, Any], Any]) -> Unit:
        """Fill a document unit: each text column's rows as one UTF-8 buffer plus int64 offsets."""
        window, end = unit.window, unit.begin + sum(unit.sizes)
        assert window is not None
        blocks, rows = window.blocks[unit.begin:end], window.rows[unit.begin:end]
        for name in self.columns:
            buffer = _gather_utf8(window, blocks, rows, name, allocate)  # one buffer: each one crosses separately
            unit.columns[name] = buffer if buffer is not None else _python_batch(window, blocks, rows, [name])[name]
        unit.window = None
        return unit

    # -- packed tokens ----------------------------------------------------------------------------
    def _steps(self) -> int | None:
        """Batches per rank per epoch in token mode: given, or estimated so that every rank agrees."""
        if self.seq_len is None:
            return None
        if self.steps_per_epoch is not None or self.world_size == 1:
            return self.steps_per_epoch
        if self._tokens_per_row is None:
            first = self.source.read(0)
            flat, offsets = self.tokenizer.encode_block(first.column("text"))  # type: ignore[union-attr]
            extra = 1 if self.tokenizer.eos_id is not None else 0  # type: ignore[union-attr]
            self._tokens_per_row = (len(flat) + extra * first.num_rows) / max(1, first.num_rows)
        _, _, split = self._plan()
        return int(split.per_rank * self._tokens_per_row // (self.batch_size * self.seq_len))

    def _packed(self, order: EpochOrder, spec: StreamSpec,
                alloc: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None) -> Iterator[dict[str, Any]]:
        """Packed batches of this worker's stream; every rank yields ``_steps()`` of them when set.

        ``alloc(rows)`` gives the (tokens, segment_ids) arrays each batch is written into.
        """
        assert self.tokenizer is not None and self.seq_len is not None
        tokenizer, seq_len, size = self.tokenizer, self.seq_len, self.batch_size
        steps = self._steps()
        quota = None if steps is None else len(range(self.worker_id, steps, self.num_workers))
        streams = self._streams or [(0, 0)] * self.num_workers
        docs, skip = streams[self.worker_id]
        # Batches of the rank already yielded (resume) count against this worker's share of the steps.
        done = 0 if steps is None else len(range(self.worker_id, min(self._batches, steps), self.num_workers))

        def prepare(table: pa.Table) -> tuple[Any, int]:
            flat, offsets = tokenizer.encode_block(table.column("text"))
            return (flat, offsets), flat.nbytes + offsets.nbytes

        packer = _Packer(seq_len, size, tokenizer.eos_id, self.pad_id, docs, skip, alloc)
        windows = self._prefetcher(order, spec, docs, prepare, 1.0) if docs < len(spec.positions) else iter(())
        yielded = done

        def batches() -> Iterator[_Packed]:
            for window in windows:
                for block, row in zip(window.blocks.tolist(), window.rows.tolist()):
                    flat, offsets = window.data[block]
                    packer.add(flat[offsets[row]: offsets[row + 1]], block)
                    while packer.full():
                        yield packer.take()
            yield from packer.flush(pad_rows=quota is not None)

        for batch in batches():
            if quota is not None and yielded >= quota:
                break  # this rank has more tokens than the agreed step count: the rest are not used
            yielded += 1
            yield self._emit(batch)
        while quota is not None and yielded < quota:  # this rank ran short: pad so all ranks agree
            yielded += 1
            yield self._emit(packer.padding())

    def _packed_units(self, order: EpochOrder, spec: StreamSpec, max_batches: int,
                      allocate: Callable[[int, Any], Any]) -> Iterator[Unit]:
        """Packed batches written straight into each unit's buffers (see ``units``)."""
        assert self.seq_len is not None
        length, size = self.seq_len, self.batch_size
        units = 0
        unit: Unit | None = None
        arrays: tuple[np.ndarray, np.ndarray] = (np.empty((0, length), np.int32),) * 2
        used = 0

        def alloc(rows: int) -> tuple[np.ndarray, np.ndarray]:
            nonlocal unit, arrays, used, units
            if unit is None:
                capacity = min(max_batches, 2 ** min(units, 30)) * size
                units += 1
                buffer = allocate(2 * capacity * length, np.int32)
                unit = Unit(self.worker_id, columns={"packed": buffer.reshape(2, capacity, length)})
                arrays = tuple(np.asarray(buffer).reshape(2, capacity, length))  # type: ignore[assignment]
                used = 0
            used += rows
            return arrays[0][used - rows:used], arrays[1][used - rows:used]

        def finish() -> Unit:
            nonlocal unit
            done, unit = unit, None
            assert done is not None
            done.columns["packed"] = done.columns["packed"][:, :sum(done.sizes)]
            return done

        for batch in self._packed(order, spec, alloc):
            assert unit is not None
            unit.sizes.append(len(batch["tokens"]))
            unit.positions.append(batch["position"])
            if used == len(arrays[0]):
                yield finish()
        if unit is not None and unit.sizes:  # (a batch taken past the step quota is not part of it)
            yield finish()

    def _emit(self, batch: _Packed) -> dict[str, Any]:
        tokens, segments, position, blocks = batch
        self._count(blocks)
        self._batches += 1
        streams = list(self._streams or [(0, 0)] * self.num_workers)
        streams[self.worker_id] = position
        self._streams = streams
        return {"tokens": tokens, "segment_ids": segments, "position": position, "worker": self.worker_id}


@dataclass
class Unit:
    """Consecutive batches of one worker's stream in a few flat buffers, to cross processes in one piece.

    ``sizes`` are the rows of each batch. Documents: ``columns`` maps a string column to one uint8
    buffer, ``rows + 1`` int64 offsets then the UTF-8 bytes, and any other column to a list. Packed
    tokens: ``columns["packed"]`` is int32 ``[2, rows, seq_len]``, tokens then segment ids, and
    ``positions`` each batch's stream position. ``last`` marks the empty unit that ends a worker's
    stream. One buffer per column, since moving each buffer between processes has a fixed cost.
    """

    worker: int
    sizes: list[int] = field(default_factory=list)
    columns: dict[str, Any] = field(default_factory=dict)
    positions: list[tuple[int, int]] = field(default_factory=list)
    last: bool = False
    window: Window | None = None  # documents, while gathering: the window the rows come from
    begin: int = 0


_PYLIST_ROWS = 64


class _Utf8:
    """A plain string column of a block (no nulls), in as many chunks as it was decoded in: for each
    row, the chunk's bytes (a view of Arrow's buffer) and the row's byte range in them."""

    __slots__ = ("data", "begin", "end")

    def __init__(self, chunks: list[pa.Array]) -> None:
        offsets, self.data = [], []
        for chunk in chunks:
            _, raw_offsets, raw_data = chunk.buffers()
            width = np.int64 if pa.types.is_large_string(chunk.type) else np.int32
            offsets.append(np.frombuffer(raw_offsets, dtype=width)[chunk.offset: chunk.offset + len(chunk) + 1])
            view = memoryview(raw_data).cast("B") if raw_data is not None else memoryview(b"")
            self.data.extend([view] * len(chunk))
        empty = [np.zeros(0, np.int64)]  # (a table of no chunks)
        self.begin = np.concatenate([o[:-1] for o in offsets] or empty, dtype=np.int64)
        self.end = np.concatenate([o[1:] for o in offsets] or empty, dtype=np.int64)


class _Block:
    """A decoded block, read by the consuming thread one batch at a time.

    String columns become Python strings straight from Arrow's buffers as each batch needs them, so a
    block costs its Arrow size only; other columns become Python lists once, on first use.
    """

    __slots__ = ("table", "lists", "buffers", "ranges")

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self.lists: dict[str, list] = {}
        self.buffers: dict[str, _Utf8 | None] = {}
        self.ranges: dict[str, tuple[list[int], list[int]]] = {}

    def utf8(self, name: str) -> _Utf8 | None:
        """The rows' bytes of a string column without nulls, as views of Arrow's buffers; else None."""
        if name not in self.buffers:
            chunks = self.table.column(name).chunks  # not combined: that would copy the block
            plain = all((pa.types.is_string(c.type) or pa.types.is_large_string(c.type)) and not c.null_count
                        for c in chunks)
            self.buffers[name] = _Utf8(chunks) if plain else None
        return self.buffers[name]

    def getter(self, name: str) -> Callable[[int], Any]:
        """A function from row number to the column's Python value."""
        views = self.utf8(name)
        if views is None:
            return self.column(name).__getitem__
        if name not in self.ranges:
            self.ranges[name] = (views.begin.tolist(), views.end.tolist())
        (begin, end), data = self.ranges[name], views.data
        return lambda row: str(data[row][begin[row]:end[row]], "utf-8")

    def column(self, name: str) -> list:
        values = self.lists.get(name)
        if values is None:
            # In slices: one to_pylist of a whole block holds the GIL for tens of milliseconds, and every
            # fetch thread that needs it meanwhile (to start a read or a decode) stalls that long.
            column, values = self.table.column(name), []
            for start in range(0, len(column), _PYLIST_ROWS):
                values.extend(column.slice(start, _PYLIST_ROWS).to_pylist())
            self.lists[name] = values
        return values


def _python_batch(window: Window, blocks: np.ndarray, rows: np.ndarray, columns: list[str]) -> dict[str, list]:
    pairs = list(zip(blocks.tolist(), rows.tolist()))
    out = {}
    for name in columns:
        getters = {b: window.data[b].getter(name) for b in set(blocks.tolist())}
        out[name] = [getters[b](r) for b, r in pairs]
    return out


def _utf8_batch(window: Window, blocks: np.ndarray, rows: np.ndarray, columns: list[str]) -> dict[str, Any]:
    """Text columns as one UTF-8 byte string plus int64 offsets each: cheap to pickle."""
    out: dict[str, Any] = {}
    for column in columns:
        buffer = _gather_utf8(window, blocks, rows, column, np.empty)
        if buffer is None:
            out[column] = _python_batch(window, blocks, rows, [column])[column]
            continue
        head = 8 * (len(rows) + 1)
        out[column] = {"offsets": buffer[:head].tobytes(), "utf8": buffer[head:].tobytes()}
    return out


def _gather_utf8(window: Window, blocks: np.ndarray, rows: np.ndarray, name: str,
                 allocate: Callable[[int, Any], Any]) -> Any:
    """The rows' values of a string column in one flat uint8 buffer made by ``allocate(size, dtype)``:
    ``rows + 1`` int64 offsets, then the UTF-8 bytes. None when some block's column is not plain strings."""
    views = {b: window.data[b].utf8(name) for b in np.unique(blocks).tolist()}
    if any(v is None for v in views.values()):
        return None
    starts, ends = np.empty(len(rows), np.int64), np.empty(len(rows), np.int64)
    for block, view in views.items():
        where = blocks == block
        starts[where], ends[where] = view.begin[rows[where]], view.end[rows[where]]  # type: ignore[union-attr]
    bounds = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=bounds[1:])
    head = bounds.nbytes
    buffer = allocate(head + int(bounds[-1]), np.uint8)
    flat = np.asarray(buffer)
    flat[:head] = bounds.view(np.uint8)
    target = memoryview(flat[head:])
    for block, row, at, begin, stop in zip(blocks.tolist(), rows.tolist(), bounds.tolist(), starts.tolist(),
                                           ends.tolist()):
        target[at:at + stop - begin] = views[block].data[row][begin:stop]  # type: ignore[union-attr]
    return buffer


def _arrow_batch(window: Window, blocks: np.ndarray, rows: np.ndarray) -> pa.Table:
    """Gather rows from several blocks: one take per block, then one reorder of the small result."""
    pieces, order = [], np.empty(len(blocks), dtype=np.int64)
    done = 0
    for block in np.unique(blocks):
        where = np.flatnonzero(blocks == block)
        pieces.append(window.data[int(block)].take(_indices(rows[where])))
        order[where] = np.arange(done, done + len(where))
        done += len(where)
    return pa.concat_tables(pieces).combine_chunks().take(_indices(order))


def _indices(values: np.ndarray) -> pa.Array:
    """An int64 Arrow array over a NumPy array without ``pa.array``, whose first call imports pandas."""
    values = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(values)])


_Packed = tuple[np.ndarray, np.ndarray, tuple[int, int], np.ndarray]


class _Packer:
    """Packs documents (in stream order) into ``[batch, seq_len]`` rows, holding about one batch of tokens.

    Documents are kept as views of their block's token array (the eos is written separately), so a
    token is copied once, into the batch. The position after a batch is (documents of the stream
    fully emitted, tokens of the next one already emitted, eos included), counted from the stream's
    start, so a resume starts reading at that document and drops that many of its tokens.
    """

    def __init__(self, seq_len: int, batch_size: int, eos_id: int | None, pad_id: int, docs: int,
                 skip: int, alloc: Callable[[int], tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.eos_id = eos_id
        self.extra = 0 if eos_id is None else 1
        self.pad_id = pad_id
        self.skip = skip
        self.next_doc = docs  # stream index of the next document added
        self.pending: deque[list[Any]] = deque()  # [document index, tokens, tokens already emitted, block]
        self.buffered = 0
        self.alloc = alloc or self._new

    def _new(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        shape = (rows, self.seq_len)
        return np.empty(shape, dtype=np.int32), np.empty(shape, dtype=np.int32)

    def add(self, tokens: np.ndarray, block: int) -> None:
        total = len(tokens) + self.extra
        start, self.skip = min(self.skip, total), 0
        self.pending.append([self.next_doc, tokens, start, block])
        self.buffered += total - start
        self.next_doc += 1

    def full(self) -> bool:
        return self.buffered >= self.seq_len * self.batch_size

    def take(self, rows: int | None = None, pad_to: int | None = None) -> _Packed:
        rows = rows or self.batch_size
        out_rows = pad_to or rows
        length = self.seq_len
        grid_2d, segments_2d = self.alloc(out_rows)
        grid, segments = grid_2d.reshape(-1), segments_2d.reshape(-1)
        need, at, blocks = rows * length, 0, []
        row_first_doc = -1  # index, within this batch, of the document a row starts with
        piece = 0
        while need and self.pending:
            entry = self.pending[0]
            _, tokens, start, block = entry
            total = len(tokens) + self.extra
            use = min(total - start, need)
            body = min(start + use, len(tokens)) - start
            if body > 0:
                grid[at:at + body] = tokens[start:start + body]
            if use > body:  # the eos falls in this piece
                grid[at + use - 1] = self.eos_id
            # segment ids: 1, 2, ... per row; a piece crossing a row boundary is segment 1 of the next row
            row = at // length
            while row * length < at + use:
                begin, end = max(at, row * length), min(at + use, (row + 1) * length)
                if begin == row * length:
                    row_first_doc = piece
                segments[begin:end] = piece - row_first_doc + 1
                row += 1
            blocks.append(block)
            piece += 1
            at += use
            need -= use
            if start + use == total:
                self.pending.popleft()
            else:
                entry[2] += use
        self.buffered -= at
        grid[at:] = self.pad_id  # only the tail: every position before it was just written
        segments[at:] = 0
        position = (self.pending[0][0], self.pending[0][2]) if self.pending else (self.next_doc, 0)
        return grid_2d, segments_2d, position, np.asarray(blocks, dtype=np.int64)

    def flush(self, pad_rows: bool) -> Iterator[_Packed]:
        """What is left: full batches, then one partly filled (its last row padded with ``pad_id``)."""
        while self.full():
            yield self.take()
        if self.buffered:
            rows = math.ceil(self.buffered / self.seq_len)
            yield self.take(rows, pad_to=self.batch_size if pad_rows else rows)

    def padding(self) -> _Packed:
        tokens, segments = self.alloc(self.batch_size)
        tokens.fill(self.pad_id)
        segments.fill(0)
        return tokens, segments, (self.next_doc, 0), np.zeros(0, np.int64)

