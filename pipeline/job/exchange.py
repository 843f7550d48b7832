"""The receiving side of every shuffle: senders' files loaded once, exchanged through Ray's object store.

Why: a receiver that reads its part of every sender's file makes about 2.3 GETs per (sender,
receiver) pair, one after another: S x P requests per shuffle (105,323 requests for 94 MB at 24
splits and 139 partitions, 71 % in ``verify``). Here each sender's file (one PUT, the output a
resume needs) is read whole once (one GET) by a *load* task that cuts it into :data:`GROUPS`
destination groups; a *merge* task per round of :data:`ROUND_SENDERS` senders and group gathers the
round's pieces per destination, one object each; a receiver then fetches its destination's objects
of every round at once from Ray's object store (which spills to each node's local disk past its
size). The senders are those the driver names from their completion records (never a listing, which
may miss a file and give a smaller dedup without a word), each checked against its recorded size.
Requests to the store per shuffle: S GETs, whatever P;
objects: S x GROUPS while a round merges, then rounds x P. This is the push-based shuffle of Ray
Data and Exoshuffle (map, merge per round, reduce), with the map reading a file the sender wrote.

One :class:`ShuffleBroker` actor per job runs each dataset's exchange before its receivers start
(they are named where they run: ``run_tasks(..., receives=[...])``) and hands every receiver its
references; the driver drops them after each stage. A receiver
gets its rows in sender-name order, run by run: the order reading the files one by one gave.
"""

from __future__ import annotations

import functools
import posixpath
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from gristmill.pipeline.job.datasets import Shuffled
from gristmill.pipeline.job.partfile import decode_segment, missing_sender, segments_by_destination

GROUPS = 16  # destination groups a load task cuts a file into (objects per sender while merging)
ROUND_SENDERS = 64  # senders merged together: a receiver fetches one object per round
FETCH_AT_ONCE = 8  # rounds' objects a receiver holds at a time (they are its rows, compressed)


def _load(work: Any, path: str, size: int) -> tuple[Any, ...]:
    """Map: one sender's file in one GET, cut into GROUPS dicts {destination: segments} (by destination
    modulo GROUPS), after its destination count. The size must be the one the sender recorded."""
    from gristmill.pipeline.job.workdir import with_retries

    try:
        data = with_retries(lambda: work.fs.cat_file(path, start=0), path)
    except FileNotFoundError as error:
        raise missing_sender(path, size) from error
    if len(data) != size:
        raise ValueError(f"{path}: read {len(data)} bytes where its sender's completion record says {size}")
    count, found = segments_by_destination(data, path)
    groups: list[dict[int, list[bytes]]] = [{} for _ in range(GROUPS)]
    for destination, segments in found.items():
        groups[destination % GROUPS][destination] = segments
    return (count, *groups)


def _merge(first: int, destinations: int, *pieces: dict[int, list[bytes]]) -> Any:
    """Merge: one round's pieces of one group, as one list of segments per destination (``first``,
    ``first + GROUPS``, ...), in sender order."""
    merged = [[segment for piece in pieces for segment in piece.get(d, ())]
              for d in range(first, first + GROUPS * destinations, GROUPS)]
    return merged[0] if destinations == 1 else tuple(merged)


@functools.cache
def _remote_functions() -> tuple[Any, Any]:
    """The load and merge tasks, defined once per process (each definition is exported to the workers)."""
    import ray

    return (ray.remote(num_cpus=1, num_returns=GROUPS + 1, max_retries=5)(_load),
            ray.remote(num_cpus=1, max_retries=5)(_merge))


class Exchange:
    """One dataset's exchange: the load and merge tasks, and each destination's merged objects."""

    def __init__(self, work: Any, senders: Sequence[tuple[str, int]]) -> None:
        """``senders``: (file relative to the work folder, size) of each sender, in sender-name order."""
        import ray

        load, merge = _remote_functions()
        loaded = [load.remote(work, work.path(relative), size) for relative, size in senders]
        self.destinations = max(ray.get([refs[0] for refs in loaded]), default=0)
        self.senders = len(senders)
        # per round, per group: the merged objects of the group's destinations, in destination order
        self.rounds: list[list[list[Any]]] = []
        for begin in range(0, len(loaded), ROUND_SENDERS):
            batch = loaded[begin: begin + ROUND_SENDERS]
            by_group = []
            for group in range(GROUPS):
                count = len(range(group, self.destinations, GROUPS))
                if not count:
                    by_group.append([])
                    continue
                refs = merge.options(num_returns=count).remote(group, count, *(refs[1 + group] for refs in batch))
                by_group.append([refs] if count == 1 else list(refs))
            self.rounds.append(by_group)

    def refs(self, destination: int) -> list[Any]:
        """``destination``'s merged objects, one per round (none past the last destination)."""
        if destination >= self.destinations:
            return []
        return [by_group[destination % GROUPS][destination // GROUPS] for by_group in self.rounds]


class ShuffleBroker:
    """A job's exchanges by dataset folder (a Ray actor): prepared before their receivers start, so
    that no receiver sits waiting on a worker while the loads and merges need one."""

    def __init__(self) -> None:
        self.exchanges: dict[str, Exchange] = {}

    def prepare(self, work: Any, senders: dict[str, list[tuple[str, int]]]) -> None:
        """Load and merge every dataset (``senders``: its folder's senders' files and sizes) not prepared
        yet; returns when all are merged."""
        import ray

        folders = list(senders)
        for folder in folders:
            if folder not in self.exchanges:
                self.exchanges[folder] = Exchange(work, senders[folder])
        merged = [ref for folder in folders for by_group in self.exchanges[folder].rounds
                  for refs in by_group for ref in refs]
        ray.wait(merged, num_returns=len(merged), fetch_local=False)

    def refs(self, folder: str, destination: int) -> list[Any]:
        if folder not in self.exchanges:
            raise RuntimeError(f"shuffle {folder} was not prepared before its receivers ran "
                               "(name it in the receivers' run_tasks(..., receives=...))")
        return self.exchanges[folder].refs(destination)

    def forget(self) -> int:
        """Drop every exchange (their objects go once no receiver holds them); how many there were."""
        count = len(self.exchanges)
        self.exchanges.clear()
        return count


def start_exchange(work: Any) -> Any | None:
    """For a work folder on an object store, the job's broker actor (None on a local disk, where a
    receiver's read of its part of a sender's file costs a seek, not a request, and the exchange's
    tasks would only add CPU). Named so that every task of the job finds it (``work.exchange``); no
    CPU of its own; on the driver's node: it owns the exchanged objects, and a node that dies must not
    take their owner along (a lost object is then rebuilt from its tasks)."""
    if not work.atomic_put:
        return None
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    work.exchange = f"gristmill-shuffle-{uuid.uuid4().hex[:12]}"
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0)(ShuffleBroker).options(name=work.exchange, scheduling_strategy=here).remote()


def end_stage(broker: Any | None) -> None:
    """After a stage: its exchanges' objects may go."""
    if broker is not None:
        import ray

        ray.get(broker.forget.remote())


def stop_exchange(broker: Any | None) -> None:
    """After the last stage, or a failed one: the broker goes, and its objects with it."""
    if broker is not None:
        import ray

        ray.kill(broker)


def prepare(work: Any, datasets: Sequence[Shuffled], sent: Mapping[str, Mapping[str, int]]) -> None:
    """Before a step's receivers start: the senders of each of the ``datasets`` they read, from ``sent``
    (folder: {file: size}, as the senders' completion records name them): exchanged through the job's
    broker on an object store; on a local disk named in the dataset's ``senders_file()``, which the
    receivers read."""
    senders = {d.folder: sorted(sent.get(d.folder, {}).items(), key=lambda item: posixpath.basename(item[0]))
               for d in datasets}
    if work.exchange is None:
        for dataset in datasets:
            work.write_json(dataset.senders_file(), senders[dataset.folder])
        return
    import ray

    if datasets:
        ray.get(ray.get_actor(work.exchange).prepare.remote(work, senders))


def received_tables(broker: str, folder: str, destination: int) -> Iterator[pa.Table]:
    """A receiver's rows of a dataset through the job's broker, a segment at a time, fetching
    FETCH_AT_ONCE rounds' objects together."""
    import ray

    refs = ray.get(ray.get_actor(broker).refs.remote(folder, destination))
    for begin in range(0, len(refs), FETCH_AT_ONCE):
        for segments in ray.get(refs[begin: begin + FETCH_AT_ONCE]):
            for segment in segments:
                yield decode_segment(segment)
