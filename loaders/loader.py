"""``StreamingLoader``: batches of documents or packed token sequences from a gristmill corpus URL.

See docs/LOADER.md for the training-script API. The loader reads blocks (row groups) with one ranged
read each, plans every epoch from the manifest alone (loaders/plan.py), prefetches on background
threads within a byte budget (loaders/prefetch.py) and checkpoints as a handful of numbers.
"""

from __future__ import annotations

import copy as _copy
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow.compute  # noqa: F401  (imported up front: its first import inside a batch costs seconds under load)

from gristmill.loaders.blocks import BlockSource, Counters, check_columns
from gristmill.loaders.cache import DiskCache
from gristmill.loaders.checks import INT32_MAX, INT32_MIN, byte_size, flag, integer, optional_integer, shown
from gristmill.loaders.concurrency import room_for_reads
from gristmill.loaders.documents import DocumentPath
from gristmill.loaders.packed import PackedPath
from gristmill.loaders.plan import (
    EpochOrder,
    Generation,
    Split,
    StreamSpec,
    consumed_by_batches,
    plan_generation,
)
from gristmill.loaders.prefetch import Prefetcher, Window, read_inline
from gristmill.loaders.state import (
    STATE_VERSION,
    Resume,
    SavedState,
    as_mapping,
    corpus_fingerprint,
    parse_state,
)
from gristmill.loaders.tokenizers import FROM_TOKENIZER, EosChoice, as_tokenizer
from gristmill.loaders.units import Unit
from gristmill.pipeline.format import Corpus

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


class StreamingLoader(DocumentPath, PackedPath):
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
        prefetch_bytes: int | str = DEFAULT_PREFETCH_BYTES,
        io_threads: int | None = None,
        max_reads: int = 64,
        coalesce_bytes: int | str = 4 * 1024 * 1024,
        cache_dir: str | None = None,
        cache_bytes: int | str = 16 * 1024**3,
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
        self.prefetch_bytes = byte_size(prefetch_bytes, "prefetch_bytes", minimum=1)
        io_threads = optional_integer(io_threads, "io_threads", minimum=0)
        self.io_threads = min(4, os.cpu_count() or 1) if io_threads is None else io_threads
        self.max_reads = integer(max_reads, "max_reads", minimum=1)
        self.coalesce_bytes = byte_size(coalesce_bytes, "coalesce_bytes", minimum=0)
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
        self.cache_bytes = byte_size(cache_bytes, "cache_bytes", minimum=1)
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

    def for_stream(self, worker_id: int, *, num_workers: int | None = None, io_threads: int | None = None,
                   counters: Counters | None = None) -> StreamingLoader:
        """A copy that reads worker ``worker_id``'s stream (of ``num_workers``) with connections of its own:
        what a DataLoader worker, or the process reading the first batch, iterates."""
        copy = _copy.copy(self)
        copy._source = None
        copy.num_workers = integer(self.num_workers if num_workers is None else num_workers, "num_workers", minimum=1)
        copy.worker_id = integer(worker_id, "worker_id", minimum=0, maximum=copy.num_workers - 1)
        if io_threads is not None:
            copy.io_threads = integer(io_threads, "io_threads", minimum=0)
        copy.counters = self.counters if counters is None else counters
        return copy

    @property
    def batches_done(self) -> int:
        """Batches this rank has yielded in the current generation of the epoch."""
        return self._batches

    def count_batch(self, position: Sequence[int] | None = None, worker: int | None = None) -> None:
        """Count one batch as handed to the training loop, elsewhere than in this object's own iteration
        (the PyTorch adapter's main process); a packed batch's stream ``position`` for its ``worker``."""
        self._batches += 1
        if position is not None and worker is not None:
            streams = list(self._streams or [(0, 0)] * self.num_workers)
            streams[int(worker)] = (int(position[0]), int(position[1]))
            self._streams = streams

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
        return {"corpus": self._fingerprint, "seed": self.seed, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "seq_len": self.seq_len, "eos_id": self._eos_id}

    @property
    def _eos_id(self) -> int | None:
        """The token that ends each packed document (None: none, and always None for document batches)."""
        return None if self.tokenizer is None or self.tokenizer.eos_id is None else int(self.tokenizer.eos_id)

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
        self.resume(self.checked_resume(state))

    def checked_resume(self, state: object) -> Resume:
        """Where ``state`` resumes this loader, once every field is checked against this corpus and plan
        (nothing changes yet: a ``MixedLoader`` checks every source's state before it resumes any)."""
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
            eos = 0 if self._eos_id is None else 1
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

    def resume(self, resume: Resume) -> None:
        """Continue from a resume point ``checked_resume`` gave."""
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
