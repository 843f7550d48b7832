"""Hostile checkpoints and arguments: each is refused by name, and a refused state changes nothing."""

from __future__ import annotations

import copy
import json
import math
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gristmill.loaders import ByteTokenizer, StreamingLoader
from gristmill.loaders.checks import INT32_MAX, INT32_MIN
from gristmill.loaders.mixing import MixedLoader
from gristmill.loaders.state import MAX_STREAMS, parse_state
from gristmill.pipeline.format.sizes import parse_size
from tests.test_loader import make_corpus

ROWS = 400
SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Two corpora of the same size and layout settings but other documents."""
    first, second = str(tmp_path_factory.mktemp("hostile-a")), str(tmp_path_factory.mktemp("hostile-b"))
    make_corpus(first, ROWS, seed=21)
    make_corpus(second, ROWS, seed=22)
    return first, second


def documents(path: str, **kwargs: Any) -> StreamingLoader:
    args: dict[str, Any] = {"batch_size": 8, "columns": ["id"], "seed": 3, "rank": 0, "world_size": 1,
                            "shuffle_window": 32}
    args.update(kwargs)
    return StreamingLoader(path, **args)


def tokens(path: str, **kwargs: Any) -> StreamingLoader:
    return documents(path, **{"seq_len": 32, "batch_size": 2, **kwargs})


def read(loader: StreamingLoader, limit: int | None = None) -> list[Any]:
    """Batches as comparable values: ids of documents, token rows of packed batches."""
    out = []
    for batch in loader:
        out.append(batch["tokens"].tolist() if "tokens" in batch else batch["id"])
        if len(out) == limit:
            break
    return out


# -- a state of another corpus or another order ---------------------------------------------------------------
def test_a_state_of_another_corpus_is_refused_and_a_copy_of_the_same_corpus_resumes(
        corpora: tuple[str, str], tmp_path: Any) -> None:
    first, second = corpora
    saved = documents(second)
    read(saved, 3)
    loader = documents(first)
    with pytest.raises(ValueError, match="'corpus'.*another corpus"):
        loader.load_state_dict(saved.state_dict())
    # The fingerprint is of what the manifest lists, not where: a copied corpus resumes, through JSON too.
    copy_path = str(tmp_path / "copy")
    shutil.copytree(first, copy_path)
    original = documents(first)
    head = read(original, 3)
    moved = documents(copy_path)
    moved.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert head + read(moved) == read(documents(first))


@pytest.mark.parametrize(("make", "changed", "name"), [
    (documents, {"seed": 4}, "seed"),
    (documents, {"shuffle": False}, "shuffle"),
    (documents, {"drop_last": True}, "drop_last"),
    (documents, {"seq_len": 32}, "seq_len"),
    (tokens, {"seq_len": 64}, "seq_len"),
    (tokens, {"tokenizer": ByteTokenizer(eos_id=None)}, "eos_id"),
])
def test_a_state_of_another_order_is_refused_by_name(corpora: tuple[str, str], make: Callable[..., StreamingLoader],
                                                    changed: dict[str, Any], name: str) -> None:
    saved = make(corpora[0])
    read(saved, 2)
    other = make(corpora[0], **changed)
    with pytest.raises(ValueError, match=f"'{name}'"):
        other.load_state_dict(saved.state_dict())


def test_a_state_without_a_fingerprint_is_refused_as_an_older_version(corpora: tuple[str, str]) -> None:
    state = documents(corpora[0]).state_dict()
    old = {key: value for key, value in state.items() if key not in ("corpus", "drop_last", "seq_len", "eos_id")}
    old["version"] = 1
    with pytest.raises(ValueError, match="'version' is 1.*older gristmill.*no corpus fingerprint"):
        documents(corpora[0]).load_state_dict(old)


# -- every tampered field ---------------------------------------------------------------------------------------
NOT_INTEGERS = st.one_of(st.booleans(), st.floats(allow_nan=True), st.text(max_size=3), st.binary(max_size=2),
                         st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(),
                                                                               max_size=1))
ANYTHING = st.one_of(NOT_INTEGERS, st.none(), st.integers())


def below(minimum: int) -> st.SearchStrategy[Any]:
    """Values a count field with this minimum must refuse: smaller integers, or no integer at all."""
    return st.one_of(st.integers(max_value=minimum - 1), NOT_INTEGERS, st.none())


def size_below(minimum: int) -> st.SearchStrategy[Any]:
    """Values a byte size with this minimum must refuse: ``below``, less the text that names a size
    (``"1"``, ``"9k"``: as the command line takes them) of at least ``minimum`` bytes."""
    def names_a_size(value: Any) -> bool:
        try:
            return isinstance(value, str) and parse_size(value) >= minimum
        except ValueError:
            return False
    return below(minimum).filter(lambda value: not names_a_size(value))


def unlike(value: Any) -> st.SearchStrategy[Any]:
    return ANYTHING.filter(lambda other: not (type(other) is type(value) and other == value))


def tampered(base: dict[str, Any], batches: int | None) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """(the field named in the refusal, a copy of ``base`` with that one field made invalid)."""

    def with_value(path: tuple[Any, ...], value: Any) -> tuple[str, dict[str, Any]]:
        state = copy.deepcopy(base)
        target = state
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value
        return str(path[0]), state

    def without(key: str) -> tuple[str, dict[str, Any]]:
        return key, {k: v for k, v in base.items() if k != key}

    def extra(key: str) -> tuple[str, dict[str, Any]]:
        return key, {**copy.deepcopy(base), key: 0}

    too_many = st.nothing() if batches is None else st.integers(min_value=batches + 1)
    counts = {"epoch": below(0), "batches": st.one_of(below(0), too_many),
              "world_size": st.one_of(below(1), st.integers(min_value=MAX_STREAMS + 1)), "workers": below(1),
              "batch_size": below(1), "window": st.one_of(below(1), st.sampled_from([base["window"] + 1, 3]))}
    cases = [st.tuples(st.just((name,)), values) for name, values in counts.items()]
    cases += [st.tuples(st.just((name,)), unlike(base[name]))
              for name in ("version", "corpus", "seed", "shuffle", "drop_last", "seq_len", "eos_id")]
    cases.append(st.tuples(st.just(("history",)), st.one_of(NOT_INTEGERS.filter(lambda v: not isinstance(v, list)),
                                                           st.lists(st.integers(), min_size=1, max_size=3))))
    for index in range(len(base["history"])):
        for column in range(4):
            cases.append(st.tuples(st.just(("history", index, column)), below(1)))
        streams = len(base["history"][index][4])
        cases.append(st.tuples(st.just(("history", index, 4)),
                               st.lists(st.integers(min_value=0), max_size=4).filter(lambda v, n=streams: len(v) != n)))
        for stream in range(streams):
            cases.append(st.tuples(st.just(("history", index, 4, stream)),
                                   st.one_of(below(0), st.integers(min_value=ROWS + 1))))
    if "streams" in base:
        rank, workers = next(iter(base["streams"])), len(next(iter(base["streams"].values())))
        cases.append(st.tuples(st.just(("streams",)), NOT_INTEGERS.filter(lambda v: not isinstance(v, dict))))
        cases.append(st.tuples(st.just(("streams", rank)),
                               st.lists(st.lists(st.integers(min_value=0), min_size=2, max_size=2), min_size=1,
                                        max_size=4).filter(lambda v: len(v) != workers)))
        # (not a list of two integers: [0, 0], the stream's start, is a position a state may hold)
        cases.append(st.tuples(st.just(("streams", rank, 0)),
                               st.one_of(NOT_INTEGERS.filter(lambda v: not (isinstance(v, list) and len(v) == 2)),
                                         st.lists(st.integers(min_value=0), max_size=3).filter(lambda v: len(v) != 2))))
        cases.append(st.tuples(st.just(("streams", rank, 0, 0)),
                               st.one_of(below(0), st.integers(min_value=ROWS + 1))))
        cases.append(st.tuples(st.just(("streams", rank, 0, 1)), below(0)))
        cases.append(st.text(max_size=3).filter(lambda key: key not in base["streams"])
                     .map(lambda key: (("streams", key), [])))
    keys = st.sampled_from(sorted(base))
    return st.one_of(
        st.one_of(cases).map(lambda case: with_value(*case)),
        keys.map(without),
        st.text(min_size=1, max_size=8).filter(lambda key: key not in base).map(extra),
    )


def check_refusals(loader: StreamingLoader, base: dict[str, Any], batches: int | None) -> None:
    """Every tampered copy of ``base`` is refused naming its field, and leaves ``loader`` where ``base`` put it."""

    @SETTINGS
    @given(tampered(base, batches))
    def refused(case: tuple[str, dict[str, Any]]) -> None:
        name, state = case
        with pytest.raises(ValueError) as caught:
            loader.load_state_dict(state)
        assert name in str(caught.value) or repr(name) in str(caught.value)
        assert loader.state_dict() == base

    refused()


def test_every_tampered_field_of_a_document_state_is_refused(corpora: tuple[str, str]) -> None:
    path = corpora[0]
    # A state with an elastic generation in its history: two ranks' batches, then a single rank's.
    ranks = [documents(path, rank=rank, world_size=2) for rank in range(2)]
    for loader in ranks:
        read(loader, 4)
    single = documents(path)
    single.load_state_dict(ranks[0].state_dict())
    read(single, 3)
    base = single.state_dict()
    assert len(base["history"]) == 1
    expected = documents(path)
    expected.load_state_dict(base)
    rest = read(expected)

    loader = documents(path)
    loader.load_state_dict(base)
    check_refusals(loader, base, len(loader))
    assert read(loader) == rest  # and it still continues exactly where the good state put it


def test_every_tampered_field_of_a_token_state_is_refused(corpora: tuple[str, str]) -> None:
    path = corpora[0]
    first = tokens(path)
    read(first, 5)
    base = first.state_dict()
    expected = tokens(path)
    expected.load_state_dict(base)
    rest = read(expected)

    loader = tokens(path)
    loader.load_state_dict(base)
    check_refusals(loader, base, None)  # with no step count, any number of batches may have been packed
    assert read(loader) == rest


def test_token_state_bounds_that_need_the_plan(corpora: tuple[str, str]) -> None:
    path = corpora[0]
    counted = tokens(path, steps_per_epoch=20)
    read(counted, 5)
    state = counted.state_dict()
    with pytest.raises(ValueError, match="'batches' is 21"):
        tokens(path, steps_per_epoch=20).load_state_dict({**state, "batches": 21})
    with pytest.raises(ValueError, match="'streams' has no position for rank 0"):
        tokens(path, steps_per_epoch=20).load_state_dict({**state, "streams": {}})
    stream = len(tokens(path)._plan()[1][0].positions)
    with pytest.raises(ValueError, match=r"streams\['0'\]\[0\].*past the end"):
        tokens(path).load_state_dict({**state, "streams": {"0": [[stream, 1]]}})
    at_end = {**state, "streams": {"0": [[stream, 0]]}}
    with pytest.raises(ValueError, match=r"streams\['0'\]\[0\].*more than the 5 batches of 2 x 32 tokens"):
        tokens(path, steps_per_epoch=20).load_state_dict(at_end)  # it would skip the rest and pad for 15 batches
    enough = math.ceil(stream / (2 * 32))  # batches that could have held every document's eos
    resumed = tokens(path, steps_per_epoch=20)
    resumed.load_state_dict({**at_end, "batches": enough})  # the end of the stream is a position: the rest pads
    assert len(read(resumed)) == 20 - enough


def test_merging_refuses_states_that_do_not_belong_together(corpora: tuple[str, str]) -> None:
    path = corpora[0]
    ranks = [tokens(path, rank=rank, world_size=2, steps_per_epoch=30) for rank in range(2)]
    for loader in ranks:
        read(loader, 2)
    states = [loader.state_dict() for loader in ranks]
    with pytest.raises(ValueError, match="got none"):
        StreamingLoader.merge_state_dicts([])
    with pytest.raises(ValueError, match="repeats rank 0"):
        StreamingLoader.merge_state_dicts([states[0], states[0]])
    with pytest.raises(ValueError, match="states\\[1\\] has epoch=3"):
        StreamingLoader.merge_state_dicts([states[0], {**states[1], "epoch": 3}])
    with pytest.raises(ValueError, match="document states need no merging"):
        StreamingLoader.merge_state_dicts([documents(path).state_dict()])
    single = tokens(path, steps_per_epoch=30)
    single.load_state_dict(StreamingLoader.merge_state_dicts(states))
    assert single.state_dict()["history"][0][:4] == [2, 1, 2, single.window]


# -- mixing ------------------------------------------------------------------------------------------------------
def test_a_mixing_state_is_checked_whole_before_any_source_moves(corpora: tuple[str, str]) -> None:
    def make(weights: tuple[float, float] = (0.6, 0.4), seed: int = 1) -> MixedLoader:
        return MixedLoader([documents(corpora[0]), documents(corpora[1])], list(weights), seed=seed,
                           steps_per_epoch=60)

    mixed = make()
    for _ in zip(range(9), mixed):
        pass
    good = mixed.state_dict()
    target = make()
    target.load_state_dict(good)
    before = [source.state_dict() for source in target.sources]
    swapped = {**good, "sources": good["sources"][::-1]}
    bad_second = {**good, "sources": [good["sources"][0], {**good["sources"][1], "batches": -1}]}
    for state, name in [(swapped, r"'sources\[0\]'.*another corpus"), (bad_second, r"'sources\[1\]'.*'batches'"),
                        ({**good, "step": 61}, "'step'"), ({**good, "epoch": -1}, "'epoch'"),
                        ({**good, "seed": True}, "'seed'"), ({**good, "weights": [0.5, 0.5]}, "'weights'"),
                        ({**good, "weights": [0.6, float("nan")]}, "'weights'"), ({**good, "extra": 1}, "'extra'"),
                        ({k: v for k, v in good.items() if k != "weights"}, "'weights'"), ([], "dict")]:
        with pytest.raises(ValueError, match=name):
            target.load_state_dict(state)
        assert [source.state_dict() for source in target.sources] == before and target.step == good["step"]
    again = make(weights=(6, 4))  # the same shares, written otherwise
    again.load_state_dict(good)
    assert [(i, b["id"]) for i, b in again] == [(i, b["id"]) for i, b in target]


def test_bad_mixing_arguments_are_named(corpora: tuple[str, str]) -> None:
    a, b = documents(corpora[0]), documents(corpora[1])
    for sources, weights, error, name in [
        ([a, b], [1.0], ValueError, "one weight per source"), ([], [], ValueError, "at least one source"),
        ([a, "b"], [1, 1], TypeError, r"sources\[1\] must be a StreamingLoader"),
        ([a, a], [1, 1], ValueError, r"sources\[1\] is the same loader"),
        ([a, documents(corpora[1], rank=1, world_size=2)], [1, 1], ValueError, r"sources\[1\] is rank 1 of 2"),
        ([a, b], [1, 0], ValueError, r"weights\[1\] must be finite and > 0"),
        ([a, b], [1, -2], ValueError, r"weights\[1\]"), ([a, b], [float("inf"), 1], ValueError, r"weights\[0\]"),
        ([a, b], [float("nan"), 1], ValueError, r"weights\[0\]"), ([a, b], [1, True], TypeError, r"weights\[1\]"),
        ([a, b], ["1", 1], TypeError, r"weights\[0\] must be a number"),
    ]:
        with pytest.raises(error, match=name):
            MixedLoader(sources, weights)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        MixedLoader([a, b], [1, 1], seed=-1)
    with pytest.raises(ValueError, match="steps_per_epoch must be >= 1"):
        MixedLoader([a, b], [1, 1], steps_per_epoch=0)


# -- constructor arguments ---------------------------------------------------------------------------------------
def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The bad values of an argument for which None means 'the default'."""
    return strategy.filter(lambda value: value is not None)


NOT_FLAGS = st.one_of(st.integers(), st.none(), st.text(max_size=3), st.floats())
# argument -> (other arguments it needs, values it must refuse)
BAD_ARGUMENTS: dict[str, tuple[dict[str, Any], st.SearchStrategy[Any]]] = {
    "batch_size": ({}, below(1)),
    "seed": ({}, below(0)),
    "world_size": ({"rank": 0}, optional(below(1))),
    "rank": ({"world_size": 2}, optional(st.one_of(below(0), st.integers(min_value=2)))),
    "seq_len": ({}, optional(below(1))),
    "steps_per_epoch": ({"seq_len": 16}, optional(below(1))),
    "shuffle_window": ({}, optional(below(1))),
    "prefetch_bytes": ({}, size_below(1)),
    "io_threads": ({}, optional(below(0))),
    "cache_bytes": ({}, size_below(1)),
    "retries": ({}, below(0)),
    "pad_id": ({"seq_len": 16}, st.one_of(NOT_INTEGERS, st.none(), st.integers(max_value=INT32_MIN - 1),
                                          st.integers(min_value=INT32_MAX + 1))),
    "num_workers": ({}, below(1)),
    "worker_id": ({"num_workers": 2}, st.one_of(below(0), st.integers(min_value=2))),
    "shuffle": ({}, NOT_FLAGS),
    "drop_last": ({}, NOT_FLAGS),
    "verify_checksums": ({}, NOT_FLAGS),
    "output": ({}, ANYTHING.filter(lambda v: v not in ("python", "arrow", "utf8"))),
    "columns": ({}, st.one_of(st.text(max_size=4), st.just([]), st.lists(st.integers(), min_size=1, max_size=2),
                              st.just(["id", "id"]), st.integers(), st.none())),
    "storage_options": ({}, st.one_of(st.integers(), st.text(max_size=3), st.lists(st.integers(), max_size=2))),
    "cache_dir": ({}, st.one_of(st.integers(), st.lists(st.integers(), max_size=2), st.booleans())),
    "tokenizer": ({}, st.just("bytes")),  # without seq_len
}


@pytest.mark.parametrize("argument", sorted(BAD_ARGUMENTS))
def test_every_bad_constructor_argument_is_named(corpora: tuple[str, str], argument: str) -> None:
    needs, values = BAD_ARGUMENTS[argument]

    @settings(max_examples=25, deadline=None)
    @given(values)
    def refused(value: Any) -> None:
        with pytest.raises((TypeError, ValueError)) as caught:
            StreamingLoader(corpora[0], **{**needs, argument: value})
        assert argument in str(caught.value)

    refused()


@pytest.mark.parametrize(("arguments", "error", "message"), [
    ({"url": 42}, TypeError, "url must be a corpus folder"),
    ({"columns": "text"}, TypeError, r"columns must be a list of column names such as \['text'\]"),
    ({"columns": ["nope"]}, Exception, r"no column\(s\) \['nope'\]"),
    ({"seq_len": 16, "tokenizer": 42}, TypeError, "not a tokenizer"),
    ({"seq_len": 16, "tokenizer": ByteTokenizer(eos_id="x")}, TypeError, "eos_id must be an integer"),
    ({"seq_len": 16, "output": "arrow"}, ValueError, "output='arrow' applies to document batches"),
    ({"steps_per_epoch": 10}, ValueError, "steps_per_epoch applies to packed tokens only: set seq_len"),
    ({"rank": 3, "world_size": 3}, ValueError, r"rank 3 is not in \[0, 3\)"),
])
def test_constructor_messages_say_what_to_do(corpora: tuple[str, str], arguments: dict[str, Any],
                                             error: type[Exception], message: str) -> None:
    url = arguments.pop("url", corpora[0])
    with pytest.raises(error, match=message):
        StreamingLoader(url, **arguments)


def test_a_broken_torchrun_environment_is_named_unless_rank_is_given(corpora: tuple[str, str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "zero")
    with pytest.raises(ValueError, match="environment variable RANK='zero'"):
        StreamingLoader(corpora[0])
    assert StreamingLoader(corpora[0], rank=0, world_size=1).rank == 0


def test_set_epoch_refuses_a_negative_epoch(corpora: tuple[str, str]) -> None:
    loader = documents(corpora[0])
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        loader.set_epoch(-1)
    with pytest.raises(TypeError, match="epoch must be an integer"):
        loader.set_epoch(np.float64(1.0))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def counted_state(corpora: tuple[str, str]) -> tuple[dict[str, Any], int]:
    """A packed-token state after 3 of 20 steps, and the rows of its stream."""
    loader = tokens(corpora[0], steps_per_epoch=20)
    read(loader, 3)
    return loader.state_dict(), len(loader._plan()[1][0].positions)


@SETTINGS
@given(batches=st.integers(0, 20), documents=st.integers(0, ROWS + 5), tokens_in=st.integers(0, 3000))
def test_an_in_range_state_is_refused_or_resumes_to_the_step_count(
        corpora: tuple[str, str], counted_state: tuple[dict[str, Any], int], batches: int, documents: int,
        tokens_in: int) -> None:
    state, stream = counted_state
    hostile = {**state, "batches": batches, "streams": {"0": [[documents, tokens_in]]}}
    loader = tokens(corpora[0], steps_per_epoch=20)
    reachable = documents + tokens_in <= batches * 2 * 32  # each document passed took its eos at least
    in_stream = documents < stream or (documents == stream and not tokens_in)
    try:
        loader.load_state_dict(hostile)
    except ValueError as exc:
        assert not (reachable and in_stream), exc
        assert "state field 'streams['0'][0]'" in str(exc)
        return
    assert reachable and in_stream
    assert len(read(loader)) == 20 - batches  # the work left is what the step count leaves, no more


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 512), st.integers(1, 512)), min_size=1, max_size=6))
def test_a_state_describes_a_bounded_number_of_streams(corpora: tuple[str, str], widths: list[tuple[int, int]]) -> None:
    """Resuming plans every stream of every generation a state lists: their sum is bounded, so a state of
    wide generations cannot keep the loader planning for minutes."""
    state = documents(corpora[0]).state_dict()
    history = [[world, workers, 8, 32, [0] * (world * workers)] for world, workers in widths]
    total = 1 + sum(world * workers for world, workers in widths)
    loader = documents(corpora[0])
    if total > MAX_STREAMS:
        with pytest.raises(ValueError, match=f"'history.*more than (the )?{MAX_STREAMS}"):
            parse_state({**state, "history": history}, loader._identity())
    else:
        parse_state({**state, "history": history}, loader._identity())  # the plan itself is not made here
