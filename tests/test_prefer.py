"""The survivor policy (``--prefer``): each policy keeps the copy it promises, for exact groups and
near-duplicate clusters spread over splits, on a real local Ray; the choice does not depend on the
splits; a bad policy is refused before any work; the statistics say which domains lost to which."""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pipeline_data import near_copy

from gristmill.dedup.cluster import survivors
from gristmill.pipeline.cli import main
from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job import DedupConfig, DedupError, run_dedup
from gristmill.pipeline.job.prefer import LAST, canonical_key, number_keys, parse_preference

pytestmark = pytest.mark.timeout(300)

# One story published three times: the original publisher, a wire service that adds a credit line (the
# longest copy) and a mirror. Exact group: the same text, the wire copy padded with spaces (longest
# again). Each copy sits in its own Parquet file, hence its own split.
COPIES = {  # name: (url, canonical_url, fetch day, quality)
    "orig": ("https://orig.example/story", "https://orig.example/story", 1, 0.9),
    "wire": ("http://wire.example/news/item?id=77&ref=feed", "https://orig.example/story", 3, 0.5),
    "mirror": ("https://www.mirror.example/archive/2026/01/story", None, 2, 0.1),
}


def _story(seed: int, words: int = 300) -> str:
    """A text sharing no 5-word shingle with another seed's (real licence texts share whole paragraphs)."""
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(5000)}" for _ in range(words))


def _write_copies(root: Path) -> None:
    """Per copy one Parquet file: its copy of the near group, of the exact group, and a text of its own."""
    near, exact, own = _story(1), _story(2), [_story(3 + i) for i in range(3)]
    rng = random.Random(3)
    bodies = {"orig": near, "wire": near + "\n\nCredit: Wire Service, all rights reserved.",
              "mirror": near_copy(near, rng)}
    for (name, (url, canonical, day, quality)), text in zip(COPIES.items(), own, strict=True):
        rows = [(f"{name}-near", bodies[name]), (f"{name}-exact", exact + ("   " if name == "wire" else "")),
                (f"{name}-own", text)]
        pq.write_table(pa.table({
            "id": [i for i, _ in rows], "text": [t for _, t in rows], "url": [url] * 3,
            "canonical_url": pa.array([canonical] * 3, pa.string()),
            "fetch_time": [dt.datetime(2026, 1, day, tzinfo=dt.timezone.utc)] * 3, "quality": [quality] * 3,
        }), root / f"{name}.parquet")


def _file_split_bytes(root: Path) -> int:
    """A split budget that makes every Parquet file of ``root`` a split of its own (a larger file is cut)."""
    return max(p.stat().st_size for p in root.glob("*.parquet"))


@pytest.fixture(scope="module")
def copies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("copies")
    _write_copies(root)
    return root


def _kept(out: str) -> dict[str, str]:
    """Kept id per group ("near", "exact")."""
    ids = Corpus.open(out).to_table(["id"])["id"].to_pylist()
    return {group: next(i.split("-")[0] for i in ids if i.endswith(f"-{group}")) for group in ("near", "exact")}


@pytest.mark.parametrize(("prefer", "winner"), [  # longest: test_longest_is_the_default_and_changes_nothing
    ("domains=orig.example,mirror.example", "orig"),
    ("domains=mirror.example", "mirror"),  # www.mirror.example is under mirror.example
    ("canonical", "orig"),
    ("column:quality", "orig"),
    ("column:-quality", "mirror"),
    ("earliest", "orig"),
])
def test_each_policy_keeps_its_copy_of_exact_groups_and_near_clusters_across_splits(
        ray_local: None, copies: Path, tmp_path: Path, prefer: str, winner: str) -> None:
    out = str(tmp_path / "out")
    stats = run_dedup(DedupConfig(inputs=[str(copies)], output=out, split_bytes=_file_split_bytes(copies),
                                  num_partitions=2, prefer=prefer))
    _check_survivors(out, stats, prefer, winner)


def _check_survivors(out: str, stats: dict, prefer: str, winner: str) -> None:
    assert stats["splits"] == 3
    assert stats["documents"]["exact_duplicate"] == 2 and stats["documents"]["near_duplicate"] == 2
    assert _kept(out) == {"near": winner, "exact": winner}
    assert Corpus.open(out).manifest.extra["job"]["prefer"] == prefer  # the manifest records the policy
    assert stats["survivor_policy"].startswith(prefer)
    losers = sorted(f"{n}.example" if n != "mirror" else "www.mirror.example" for n in COPIES if n != winner)
    survivor = "www.mirror.example" if winner == "mirror" else f"{winner}.example"
    assert {pair: row["input"] for pair, row in stats["lost_to"].items()} == {
        f"{loser} -> {survivor}": 2 for loser in losers}


def test_domain_file_and_the_stats_commands_show_who_lost_to_whom(
        ray_local: None, copies: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ranked = tmp_path / "publishers.txt"
    ranked.write_text("# originals first\norig.example\n\nwire.example  # the wire last\n")
    out = str(tmp_path / "out")
    assert main(["dedup", str(copies), "-o", out, "--prefer", f"domains:{ranked}", "--split-bytes", f"{_file_split_bytes(copies)}B",
                 "--num-partitions", "2", "--quiet", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["lost_to"]["wire.example -> orig.example"]["input"] == 2
    assert captured.err == ""  # --quiet: no progress
    assert _kept(out)["near"] == "orig"
    assert main(["stats", out]) == 0
    text = capsys.readouterr().out
    assert f"prefer     domains:{ranked} (2 domains: orig.example, wire.example)" in text
    assert re.search(r"^  wire\.example -> orig\.example +2 +1 +1$", text, re.M)
    assert main(["stats", out, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lost_to"]["www.mirror.example -> orig.example"]["near_duplicate"] == 1


def test_longest_is_the_default_and_changes_nothing(ray_local: None, copies: Path, tmp_path: Path) -> None:
    """``--prefer longest`` writes the very bytes (and file names) a run without the option writes."""
    default, explicit = tmp_path / "default", tmp_path / "explicit"
    split_bytes = _file_split_bytes(copies)
    run_dedup(DedupConfig(inputs=[str(copies)], output=str(default), split_bytes=split_bytes, num_partitions=2))
    stats = run_dedup(DedupConfig(inputs=[str(copies)], output=str(explicit), split_bytes=split_bytes,
                                  num_partitions=2, prefer="longest"))
    _check_survivors(str(explicit), stats, "longest", "wire")  # the wire copy with its credit line is longest
    shards = sorted(p.name for p in default.glob("*.parquet"))
    assert shards and shards == sorted(p.name for p in explicit.glob("*.parquet"))
    assert all((default / name).read_bytes() == (explicit / name).read_bytes() for name in shards)


@pytest.mark.parametrize(("prefer", "message"), [
    ("tallest", "unknown survivor policy"),
    ("column:", "unknown survivor policy"),
    ("column:stars", "has no 'stars' column"),
    ("domains:{missing}", "cannot read the domain file"),
    ("domains=", "lists no domain"),
    ("domains=a.com,http://b.com", "not a domain"),
])
def test_a_bad_policy_is_refused_before_any_work(copies: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  prefer: str, message: str) -> None:
    missing = tmp_path / "no-such-file.txt"
    out = tmp_path / "out"
    prefer = prefer.format(missing=missing)
    assert main(["dedup", str(copies), "-o", str(out), "--prefer", prefer]) == 2
    err = capsys.readouterr().err
    assert message in err and "--prefer" in err
    if "{missing}" in prefer or "domains:" in prefer:
        assert str(missing) in err
    assert not out.exists()  # refused before Ray started or a folder was claimed


def test_a_job_file_may_give_the_domains_as_a_list(tmp_path: Path) -> None:
    import argparse

    from gristmill.pipeline.commands import dedup as dedup_cmd

    parser = argparse.ArgumentParser()
    dedup_cmd.add_arguments(parser)
    job = tmp_path / "job.toml"
    job.write_text('[dedup]\ninputs = ["in"]\noutput = "out"\nprefer = ["orig.example", "Mirror.Example."]\n')
    args = parser.parse_args(["--job", str(job)])
    args._parser, args._argv = parser, ["--job", str(job)]  # as pipeline.cli records them
    config = dedup_cmd.config_from_args(args)
    assert parse_preference(config.prefer).domains == ("orig.example", "mirror.example")
    with pytest.raises(DedupError, match="lists no domain"):
        parse_preference([])


# -- the keys: order kept, whatever the values -----------------------------------------------------
@given(st.lists(st.one_of(st.floats(allow_nan=True), st.integers(-2**53, 2**53), st.none(), st.text(max_size=3)),
                min_size=1, max_size=40))
def test_number_keys_keep_the_order_of_the_numbers_and_put_the_rest_last(values: list) -> None:
    def number(v: object) -> float | None:
        try:
            x = float(v)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        return None if x != x else x

    numbers = [number(v) for v in values]
    for lower_wins in (False, True):
        keys = number_keys(values, lower_wins)
        for a, ka in zip(numbers, keys, strict=True):
            if a is None:
                assert ka == LAST
                continue
            assert ka != LAST
            for b, kb in zip(numbers, keys, strict=True):
                if b is not None:
                    assert (ka > kb) == ((a < b) if lower_wins else (a > b))


def test_canonical_key_prefers_the_canonical_then_https_then_no_query_then_the_shorter_path() -> None:
    ranked = [canonical_key("http://a.example/x/y?q=1", "http://a.example/x/y?q=1"),
              canonical_key("https://a.example/a/much/longer/path", None),
              canonical_key("https://a.example/x", None),
              canonical_key("https://a.example/?q", None),
              canonical_key("http://a.example/", None),
              canonical_key("input.jsonl", None)]
    assert ranked[0] > ranked[2] > ranked[1] > ranked[3] > ranked[4] > ranked[5] == LAST


# -- two phases: the best of each split's bests is the best of all ----------------------------------
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 3), st.integers(-3, 3), st.integers(0, 3)),
                min_size=1, max_size=60, unique_by=lambda row: row[3:]), st.integers(1, 6), st.randoms())
def test_two_phase_choice_equals_the_one_shot_choice(rows: list, splits: int, rng: random.Random) -> None:
    ids = [f"d{i:03d}" for i in range(len(rows))]
    labels = np.array([r[0] for r in rows])
    lengths = np.array([r[1] for r in rows])
    prefer = np.array([r[2] for r in rows]) * (2**62 // 3)  # wide keys: near both ends of int64
    whole = survivors(labels, lengths, ids, preference=prefer)
    split_of = np.array([rng.randrange(splits) for _ in rows])
    firsts = []
    for split in range(splits):
        mine = np.flatnonzero(split_of == split)
        if mine.size:
            best = survivors(labels[mine], lengths[mine], [ids[i] for i in mine], preference=prefer[mine])
            firsts += [(mine[row], weight) for row, weight in zip(best.row, best.weight, strict=True)]
    rows_in = np.array([r for r, _ in firsts])
    second = survivors(labels[rows_in], lengths[rows_in], [ids[i] for i in rows_in], preference=prefer[rows_in],
                       weights=np.array([w for _, w in firsts]))
    assert second.label.tolist() == whole.label.tolist()
    assert rows_in[second.row].tolist() == whole.row.tolist()
    assert second.weight.tolist() == whole.weight.tolist()


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.none(), st.floats(-1e6, 1e6), st.integers(-5, 5)), min_size=9, max_size=9))
def test_generated_quality_columns_give_the_same_survivors_with_one_split_and_many(
        ray_local: None, tmp_path_factory: pytest.TempPathFactory, quality: list) -> None:
    root = tmp_path_factory.mktemp("quality")
    texts = [_story(10 + s) for s in range(3)]
    rng = random.Random(5)
    for f in range(3):  # each file: a copy of each of three stories, exact or near
        docs = [texts[s] if (s + f) % 2 else near_copy(texts[s], rng) for s in range(3)]
        pq.write_table(pa.table({"id": [f"f{f}-s{s}" for s in range(3)], "text": docs,
                                 "score": pa.array([None if q is None else float(q) for q in quality[3 * f:3 * f + 3]],
                                                   pa.float64())}), root / f"{f}.parquet")
    kept = []
    for split_bytes, splits in ((1 << 30, 1), (_file_split_bytes(root), 3)):
        out = root / f"out-{splits}"
        stats = run_dedup(DedupConfig(inputs=[str(root / "*.parquet")], output=str(out), split_bytes=split_bytes,
                                      num_partitions=2, prefer="column:score"))
        assert stats["splits"] == splits
        kept.append(sorted(Corpus.open(str(out)).to_table(["id"])["id"].to_pylist()))
    assert kept[0] == kept[1]


def test_the_column_check_reads_a_parquet_footer_or_the_first_jsonl_records(copies: Path, tmp_path: Path) -> None:
    from gristmill.pipeline.job.inputs import resolve_inputs
    from gristmill.pipeline.job.prefer import check_input_column

    lines = [json.dumps({"text": f"t{i}", **({"stars": 4} if i == 7 else {})}) for i in range(20)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    jsonl = resolve_inputs([str(tmp_path / "a.jsonl")], {})
    check_input_column(parse_preference("column:stars"), jsonl, {})  # a field some records lack
    with pytest.raises(DedupError, match=r"a\.jsonl has no 'score' column \(it has: stars, text\)"):
        check_input_column(parse_preference("column:-score"), jsonl, {})
    parquet = resolve_inputs([str(copies)], {})
    check_input_column(parse_preference("column:quality"), parquet, {})
    with pytest.raises(DedupError, match=r"mirror\.parquet has no 'stars' column"):
        check_input_column(parse_preference("column:stars"), parquet, {})
