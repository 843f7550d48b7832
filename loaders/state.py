"""Loader checkpoints: what ``state_dict`` holds, and the field checks ``load_state_dict`` makes first.

A state is a few numbers plus the *identity* of what the sample order depends on: a fingerprint of
the corpus (every shard's path, rows, checksum and row-group rows) and the settings that change the
order (seed, shuffle, drop_last, seq_len, the tokenizer's eos_id). A state with another identity
would resume at the right count in the wrong sequence, so it is refused. World size, workers, batch
size and window are not identity: a state resumes under others (elastic resume), so they are saved
as the *generation* it was taken under. Every field is checked here, and the plan-dependent ranges in
the loader, before the loader changes anything; a bad field is a ValueError naming it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gristmill.loaders.checks import integer, shown
from gristmill.loaders.plan import Generation
from gristmill.pipeline.format import ShardInfo

STATE_VERSION = 2
# Streams (ranks x workers) of all the generations a state describes together: resuming plans every one of
# them, at about 0.2 ms of Python each, so a state of 4 generations of 131,072 streams took 88 s to load.
MAX_STREAMS = 1 << 17
GENERATION_FIELDS = ("world_size", "workers", "batch_size", "window")


def corpus_fingerprint(shards: Sequence[ShardInfo]) -> str:
    """A digest of what the manifest says about every shard, so a copy of the corpus elsewhere matches."""
    digest = hashlib.blake2b(digest_size=16)
    for shard in shards:
        digest.update(json.dumps([shard.path, shard.rows, shard.checksum,
                                  shard.row_groups.rows.tolist()]).encode("utf-8"))
    return digest.hexdigest()


@dataclass(frozen=True)
class SavedState:
    """A state whose fields passed every check that does not need the epoch's plan."""

    epoch: int
    generation: Generation  # the settings it was saved under (``consumed`` empty)
    history: list[Generation]
    batches: int
    streams: dict[int, list[tuple[int, int]]]  # packed tokens: (documents, tokens) per worker, by rank


@dataclass(frozen=True)
class Resume:
    """Where a checked state puts a loader: the epoch, its generations so far, and the position in them."""

    epoch: int
    history: list[Generation]
    batches: int
    streams: list[tuple[int, int]] | None  # packed tokens: this rank's workers' positions


def _is_list(value: object) -> bool:
    """A list or tuple, not a string or bytes (which are sequences too: of characters, of small numbers)."""
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray))


def field(name: str) -> str:
    return f"state field {name!r}"


def as_mapping(state: object, what: str) -> Mapping[str, Any]:
    if not isinstance(state, Mapping):
        raise ValueError(f"a {what} state is the dict its state_dict() returned, got {type(state).__name__}")
    return state


def check_keys(state: object, expected: set[str], what: str) -> Mapping[str, Any]:
    """``state`` as a mapping with exactly the ``expected`` keys."""
    state = as_mapping(state, what)
    missing = sorted(expected - set(state))
    if missing:
        raise ValueError(f"{what} state has no field {shown(missing[0])} (it needs {sorted(expected)})")
    unknown = sorted(str(key) for key in state if key not in expected)
    if unknown:
        raise ValueError(f"{what} state has an unknown field {shown(unknown[0])} (it holds only {sorted(expected)})")
    return state


def parse_state(state: object, identity: Mapping[str, Any]) -> SavedState:
    """Check a state's version, identity, key set and field types and ranges; see the module docstring."""
    state = as_mapping(state, "loader")
    version = state.get("version")
    if type(version) is not int or version != STATE_VERSION:
        old = (" (an older gristmill's state: it has no corpus fingerprint, so whether it belongs to this corpus "
               "cannot be checked; start the epoch afresh instead)") if version == 1 and type(version) is int else ""
        raise ValueError(f"{field('version')} is {shown(version)}; this gristmill reads version {STATE_VERSION}{old}")
    for name, mine in identity.items():
        if name not in state:
            raise ValueError(f"loader state has no field {name!r}")
        saved = state[name]
        if type(saved) is type(mine) and saved == mine:
            continue
        if name == "corpus":
            raise ValueError(f"{field(name)} is {shown(saved)} but this corpus's fingerprint is {mine!r}: the state was "
                             "saved on another corpus, or this one was rewritten since; a state resumes only the "
                             "corpus it was saved on")
        raise ValueError(f"{field(name)} is {shown(saved)}, but this loader has {name}={mine!r}; a state resumes only "
                         f"a loader with the {name} it was saved with")
    token_mode = identity["seq_len"] is not None
    expected = {"version", *identity, "epoch", *GENERATION_FIELDS, "batches", "history"}
    check_keys(state, expected | ({"streams"} if token_mode else set()), "loader")
    generation = _generation([state[name] for name in GENERATION_FIELDS], "")
    history = state["history"]
    if not _is_list(history):
        raise ValueError(f"{field('history')} must be a list of generations, got {shown(history)}")
    past = []
    streams = generation.world_size * generation.workers
    for index, entry in enumerate(history):
        past.append(_past_generation(entry, index))
        streams += past[-1].world_size * past[-1].workers
        if streams > MAX_STREAMS:
            raise ValueError(f"{field('history')} and the state's own generation describe more than {MAX_STREAMS} "
                             f"streams (ranks x workers) together, at history[{index}]; a state describes at most "
                             "that many")
    return SavedState(
        epoch=integer(state["epoch"], field("epoch"), minimum=0, error=ValueError),
        generation=generation,
        history=past,
        batches=integer(state["batches"], field("batches"), minimum=0, error=ValueError),
        streams=_streams(state["streams"], generation) if token_mode else {},
    )


def _generation(values: Sequence[Any], prefix: str) -> Generation:
    world, workers, batch_size, window = (
        integer(value, field(prefix + name), minimum=1, error=ValueError) for name, value in zip(GENERATION_FIELDS, values))
    if world * workers > MAX_STREAMS:
        raise ValueError(f"{field(prefix + 'world_size')} {world} x {field(prefix + 'workers')} {workers} is "
                         f"{world * workers} streams, more than the {MAX_STREAMS} a state may describe")
    if window % batch_size:
        raise ValueError(f"{field(prefix + 'window')} must be a whole number of batches (a multiple of batch_size "
                         f"{batch_size}), got {window}")
    return Generation(world, workers, batch_size, window)


def _past_generation(entry: object, index: int) -> Generation:
    """One ``history`` entry: ``[world_size, workers, batch_size, window, [rows consumed per stream]]``."""
    prefix = f"history[{index}]."
    if not _is_list(entry) or len(entry) != 5:
        raise ValueError(f"{field(f'history[{index}]')} must be [world_size, workers, batch_size, window, "
                         f"consumed], got {shown(entry)}")
    generation = _generation(entry[:4], prefix)
    consumed = entry[4]
    streams = generation.world_size * generation.workers
    if not _is_list(consumed) or len(consumed) != streams:
        raise ValueError(f"{field(prefix + 'consumed')} must list the rows each of the generation's {streams} "
                         f"streams read, got {shown(consumed)}")
    done = tuple(integer(rows, field(f"{prefix}consumed[{at}]"), minimum=0, error=ValueError)
                 for at, rows in enumerate(consumed))
    return Generation(generation.world_size, generation.workers, generation.batch_size, generation.window, done)


def _streams(streams: object, generation: Generation) -> dict[int, list[tuple[int, int]]]:
    """``streams``: per rank (a decimal string key), each worker's ``[documents, tokens]`` position."""
    if not isinstance(streams, Mapping):
        raise ValueError(f"{field('streams')} must map ranks to worker positions, got {shown(streams)}")
    out: dict[int, list[tuple[int, int]]] = {}
    for key, positions in streams.items():
        name = f"streams[{shown(key)}]"
        if not isinstance(key, str) or not key.isdecimal() or key != str(int(key)) or \
                int(key) >= generation.world_size:
            raise ValueError(f"{field('streams')} has key {shown(key)}, not a rank of the saved world_size "
                             f"{generation.world_size}")
        if not _is_list(positions) or len(positions) not in (0, generation.workers):
            raise ValueError(f"{field(name)} must be one [documents, tokens] position per worker "
                             f"({generation.workers}), got {shown(positions)}")
        out[int(key)] = [_position(pair, f"{name}[{worker}]") for worker, pair in enumerate(positions)]
    return out


def _position(pair: object, name: str) -> tuple[int, int]:
    if not _is_list(pair) or len(pair) != 2:
        raise ValueError(f"{field(name)} must be [documents, tokens], got {shown(pair)}")
    documents, tokens = (integer(value, field(name), minimum=0, error=ValueError) for value in pair)
    return documents, tokens

