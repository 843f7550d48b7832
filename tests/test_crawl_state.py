"""The pieces that let a partition move between nodes: its frontier's checkpoint on a store
(crawlers/state.py) and the hub's at-least-once hand-over of links (crawlers/hub.py)."""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gristmill.crawlers.frontier import Frontier
from gristmill.crawlers.hub import MemoryHub
from gristmill.crawlers.partitions import Link
from gristmill.crawlers.state import Checkpoint, check_state_url, state_url


def _urls(path: Path) -> set[str]:
    with sqlite3.connect(path) as db:
        return {row[0] for row in db.execute("SELECT url FROM urls")}


def test_a_checkpoint_is_what_a_restart_starts_from_never_a_scratch_copy(tmp_path: Path) -> None:
    store = tmp_path / "store"
    local = tmp_path / "node" / "frontier.sqlite"
    local.parent.mkdir()
    checkpoint = Checkpoint(str(store))
    frontier = Frontier(str(local), restore=checkpoint.restore)
    with frontier.transaction():
        frontier.add("http://a.test/1", "http://a.test", 0)
    assert checkpoint.save(str(local))
    assert not checkpoint.save(str(local))  # nothing committed since: no upload
    with frontier.transaction():
        frontier.add("http://a.test/2", "http://a.test", 0)  # after the checkpoint: lost with the node
    frontier.close()
    checkpoint.close()
    again = Frontier(str(local), restore=Checkpoint(str(store)).restore)
    again.close()
    assert _urls(local) == {"http://a.test/1"}


def test_a_scratch_frontier_without_a_checkpoint_is_not_resumed(tmp_path: Path) -> None:
    local = tmp_path / "frontier.sqlite"
    stale = Frontier(str(local))
    with stale.transaction():
        stale.add("http://old.test/", "http://old.test", 0)  # an earlier crawl's, left on this node
    stale.close()
    Frontier(str(local), restore=Checkpoint(str(tmp_path / "empty-store")).restore).close()
    assert _urls(local) == set()


def test_the_state_defaults_under_a_remote_output_and_bad_schemes_are_refused() -> None:
    assert state_url("s3://bucket/raw/", None) == "s3://bucket/raw/_crawl"
    assert state_url("raw", None) == "raw/.crawl"
    check_state_url("memory://state", None, processes=1)
    for url in ("http://127.0.0.1:9/state", "memory://state", "nosuchscheme://x"):
        with pytest.raises(ValueError, match=f"--state-dir {url}: "):
            check_state_url(url, None, processes=2)


operations = st.lists(st.one_of(
    st.tuples(st.just("post"), st.integers(0, 1), st.integers(1, 3)),
    st.tuples(st.just("take"), st.integers(0, 1), st.booleans()),  # and acknowledge at once, or not
    st.tuples(st.just("join"), st.integers(0, 1), st.just(0)),  # a restart: what was not acknowledged is lost
), max_size=40)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_the_hub_hands_every_link_over_until_it_is_acknowledged(steps: list[tuple[str, int, object]]) -> None:
    hub = MemoryHub()
    generation = {index: hub.join(index)[0] for index in (0, 1)}
    posted: dict[int, list[str]] = {0: [], 1: []}
    held: dict[int, set[str]] = {0: set(), 1: set()}  # links a partition admitted and acknowledged
    pending: dict[int, set[str]] = {0: set(), 1: set()}  # taken, not yet acknowledged (lost on a restart)
    for number, (kind, index, value) in enumerate(steps):
        if kind == "post":
            links = [Link(f"http://h{index}.test/{number}-{i}", 1, 0, None, 0, True) for i in range(value)]
            hub.post(1 - index, generation[1 - index], index, links, number)
            posted[index] += [link.url for link in links]
        elif kind == "take":
            token, links = hub.take(index, generation[index])
            pending[index] |= {link.url for link in links}
            if value and token is not None:
                hub.acknowledge(index, generation[index], token)
                held[index] |= pending[index]
                pending[index] = set()
        else:
            generation[index] = hub.join(index)[0]
            pending[index] = set()
    for index in (0, 1):
        generation[index] = hub.join(index)[0]
        _token, links = hub.take(index, generation[index])
        again = {link.url for link in links}
        assert held[index] | again == set(posted[index]), "a link was lost"
        assert not held[index] & again, "an acknowledged link came again"
        assert hub.waiting([index]) == 0


def test_a_save_costs_one_put_and_one_delete_and_no_commit_lists_the_store(store: Any, s3_bucket: str,
                                                                            tmp_path: Path) -> None:
    """Counted at the store (benchmarks/shaped_store.py): a LIST when a crawl starts, then each save one
    PUT of a copy under a new name and one DELETE of the copy it supersedes."""
    options = {"client_kwargs": {"endpoint_url": store.endpoint}, "skip_instance_cache": True}
    local = tmp_path / "frontier.sqlite"
    store.reset_stats()
    checkpoint = Checkpoint(f"{s3_bucket}/state/p0", options)
    assert {kind for kind, _path in store.log} == {"LIST"}  # (s3fs: and its parent)
    frontier = Frontier(str(local), restore=checkpoint.restore)
    per_save = []
    for number in range(4):
        with frontier.transaction():
            frontier.add(f"http://a.test/{number}", "http://a.test", 0)
        store.reset_stats()
        assert checkpoint.save(str(local))
        per_save.append(sorted(kind for kind, _path in store.log))
    frontier.close()
    checkpoint.close()
    assert per_save[1:] == [["POST", "PUT"]] * 3, per_save  # s3fs deletes with one POST ?delete
    assert sorted(Checkpoint(f"{s3_bucket}/state/p0", options).stored) == [(1, 4)]


copies = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 40)), unique=True, max_size=8)
strays = st.lists(st.sampled_from(["{}.tmp", ".{}", "{}~", "x{}", "{}.restoring", "{}-wal", "{}/"]), max_size=6)


@settings(max_examples=60, deadline=None)
@given(copies, strays, st.booleans())
def test_only_checkpoint_names_count_and_the_newest_is_restored(saves: list[tuple[int, int]], wrappers: list[str],
                                                               legacy: bool) -> None:
    """A folder holding copies, an unnumbered ``frontier.sqlite`` from before generations, and strays
    (a half-done upload, a backup, a name that only looks alike): the strays never count."""
    with tempfile.TemporaryDirectory() as folder:
        names = [f"frontier-{generation}-{save}.sqlite" for generation, save in saves]
        names += ["frontier.sqlite"] * legacy
        for number, wrapper in enumerate(wrappers):
            stray = wrapper.format(f"frontier-{99 + number}-1.sqlite")
            os.makedirs(os.path.join(folder, os.path.dirname(stray)), exist_ok=True)
            if not stray.endswith("/"):
                Path(folder, stray).write_text(stray)
        for name in names:
            Path(folder, name).write_text(name)
        checkpoint = Checkpoint(folder)
        assert sorted(checkpoint.stored) == sorted(saves + [(0, 0)] * legacy)
        assert checkpoint.generation == max([generation for generation, _save in saves] + [0]) + 1
        local = os.path.join(folder, "node", "frontier.sqlite")
        os.makedirs(os.path.dirname(local))
        assert checkpoint.restore(local) == bool(names)
        if names:
            newest = max(saves) if saves else (0, 0)
            expected = f"frontier-{newest[0]}-{newest[1]}.sqlite" if saves else "frontier.sqlite"
            assert Path(local).read_text() == expected


def test_a_copy_the_hub_may_have_taken_stays_until_a_later_one_is_accepted(tmp_path: Path) -> None:
    """The hub unreachable at a save (not a refusal): it may have accepted the copy before the answer
    was lost, so the copy stays; the next save has a name of its own, and once accepted both go."""
    answers = iter([ConnectionError("hub unreachable"), None])

    def accept(name: str) -> None:
        answer = next(answers)
        if answer is not None:
            raise answer

    store, local = tmp_path / "store", tmp_path / "node" / "frontier.sqlite"
    local.parent.mkdir()
    checkpoint = Checkpoint(str(store))
    checkpoint.begin(1, None, accept)
    frontier = Frontier(str(local), restore=checkpoint.restore)
    names = []
    for number in range(2):
        with frontier.transaction():
            frontier.add(f"http://a.test/{number}", "http://a.test", 0)
        try:
            checkpoint.save(str(local))
        except ConnectionError:
            pass
        names.append(sorted(path.name for path in store.iterdir()))
    frontier.close()
    checkpoint.close()
    assert names == [["frontier-1-1.sqlite"], ["frontier-1-2.sqlite"]]
