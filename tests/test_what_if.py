"""``gristmill clusters --what-if``: clusters recut from the stored candidate pairs agree with a fresh
dedup at that threshold; and ``clusters`` streaming agrees with the whole removed table (real Parquet,
a real local Ray job, real texts with near copies at several similarity levels)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pipeline_data import real_texts, write_parquet

from gristmill.pipeline.cli import main
from gristmill.pipeline.format import Corpus, CorpusError
from gristmill.pipeline.format.pairs_table import PairsInfo, iter_pairs
from gristmill.pipeline.report.duplicates import find_cluster, find_clusters, open_removed
from gristmill.pipeline.report.what_if import what_if

pytestmark = pytest.mark.timeout(300)
LEVELS = (0.95, 0.85, 0.75, 0.65)  # the Jaccard of the planted near copies to their original


def graded_copy(text: str, similarity: float, rng: random.Random, ngram: int = 5) -> str:
    """``text`` with enough scattered words replaced that its shingle Jaccard to ``text`` is about ``similarity``."""
    words = text.split(" ")
    changes = max(1, round(len(words) * (1 - similarity) / (ngram * (1 + similarity))))
    for position in rng.sample(range(len(words)), changes):
        words[position] = f"CHANGED{rng.randrange(10**6)}"
    return " ".join(words)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory, ray_local: None) -> dict[str, Path]:
    """One job at 0.7 (with --removed) and fresh jobs at 0.8 and 0.9 with the same LSH bands."""
    root = tmp_path_factory.mktemp("what-if")
    rng = random.Random(3)
    texts = []
    for i, text in enumerate(real_texts(40, min_words=200)):
        texts.append(text)
        texts += [graded_copy(text, LEVELS[i % 4], rng) for _ in range(1 + i % 3)]
        texts += [text] if i % 5 == 0 else []  # exact copies too
    write_parquet(root / "in.parquet", texts, prefix="d")
    out = {"0.7": root / "c0.7"}
    assert main(["dedup", str(root / "in.parquet"), "-o", str(out["0.7"]), "--threshold", "0.7",
                 "--removed", str(root / "removed"), "-q"]) == 0
    params = Corpus.open(str(out["0.7"])).stats["params"]
    for threshold in ("0.8", "0.9"):
        out[threshold] = root / f"c{threshold}"
        assert main(["dedup", str(root / "in.parquet"), "-o", str(out[threshold]), "--threshold", threshold,
                     "--bands", str(params["bands"]), "--rows", str(params["rows"]), "-q"]) == 0
    return out


def test_raising_the_threshold_matches_a_fresh_dedup(jobs: dict[str, Path]) -> None:
    corpus = Corpus.open(str(jobs["0.7"]))
    documents = corpus.stats["documents"]
    for threshold in (0.8, 0.9):
        result = what_if(corpus, threshold)
        fresh = Corpus.open(str(jobs[str(threshold)])).stats["documents"]
        assert result["exact"] and not result["notes"]
        assert result["what_if"]["kept"] == fresh["kept"]
        assert result["what_if"]["near_duplicates"] == fresh["near_duplicate"]
        assert result["exact_duplicates"] == fresh["exact_duplicate"] == documents["exact_duplicate"]
        assert result["now"]["kept"] == documents["kept"] and result["now"]["near_duplicates"] == documents["near_duplicate"]
    # the input plants copies at several levels: each raise of the threshold keeps more
    kept = [what_if(corpus, t)["what_if"]["kept"] for t in (0.7, 0.8, 0.9)]
    assert kept[0] < kept[1] < kept[2]


def test_lowering_the_threshold_says_it_is_a_lower_bound(jobs: dict[str, Path]) -> None:
    corpus = Corpus.open(str(jobs["0.7"]))
    result = what_if(corpus, 0.6)
    assert not result["exact"] and "lower bound" in result["notes"][0]
    assert result["what_if"]["near_duplicates"] > result["now"]["near_duplicates"]  # the 0.65 copies join


def test_clusters_what_if_command(jobs: dict[str, Path], capsys: pytest.CaptureFixture) -> None:
    url = str(jobs["0.7"])
    assert main(["clusters", url, "--what-if", "0.9", "--json", "-q"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["what_if"]["kept"] == Corpus.open(str(jobs["0.9"])).stats["documents"]["kept"]
    assert captured.err == ""  # -q: no progress
    assert main(["clusters", url, "--what-if", "0.6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("What if the threshold were 0.6?") and "note: 0.6 is below the job's threshold 0.7" in out
    assert main(["clusters", url, "--what-if", "0.3"]) == 2  # below the floor (0.7 - 0.2)
    assert "holds pairs down to 0.5; a threshold of 0.3 needs a rerun" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["clusters", url, "--what-if", "1.5"])
    assert "not a similarity in (0, 1]" in capsys.readouterr().err


def test_a_corpus_without_pairs_is_a_clear_error(jobs: dict[str, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture) -> None:
    older = tmp_path / "older"
    shutil.copytree(jobs["0.8"], older)
    manifest = json.loads((older / "_manifest.json").read_text())
    del manifest["extra"]["pairs"]  # as an older gristmill wrote it
    (older / "_manifest.json").write_text(json.dumps(manifest))
    assert main(["clusters", str(older), "--what-if", "0.9"]) == 2
    assert "lists no candidate pairs table" in capsys.readouterr().err


def test_streamed_clusters_agree_with_the_whole_removed_table(jobs: dict[str, Path]) -> None:
    corpus = Corpus.open(str(jobs["0.7"]))
    removed = open_removed(corpus)
    table = removed.to_table(["id", "cluster_id", "cluster_size", "removed_as"])
    expected = {row["cluster_id"]: row for row in table.group_by("cluster_id").aggregate(
        [("cluster_size", "max"), ("id", "count")]).to_pylist()}
    listing = find_clusters(corpus, removed)
    assert listing.count == len(expected) == len(listing)
    assert {c.id: (c.size, c.exact + c.near) for c in listing} == {
        key: (row["cluster_size_max"], row["id_count"]) for key, row in expected.items()}
    kept = corpus.to_table(["id", "cluster_size"])
    assert listing.held == table.num_rows + pc.sum(pc.is_in(kept["id"], value_set=pa.array(list(expected)))).as_py()
    assert [c.id for c in find_clusters(corpus, removed, top=3)] == [c.id for c in listing[:3]]
    member = table["id"][0].as_py()
    cluster = find_cluster(corpus, removed, member)
    same = table.filter(pc.equal(table["cluster_id"], cluster.id))
    assert {m.id for m in cluster.members} == set(same["id"].to_pylist())
    assert cluster.representative is not None and cluster.representative.id == cluster.id


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.one_of(st.none(), st.integers(), st.text(max_size=5), st.dictionaries(
    st.sampled_from(["files", "threshold", "floor", "num_perm", "earlier_splits", "key_bits", "rows", "x"]),
    st.one_of(st.integers(-5, 70_000), st.floats(allow_nan=True), st.text(max_size=8),
              st.lists(st.one_of(st.text(max_size=12), st.integers()), max_size=3)))))
def test_a_hostile_pairs_entry_is_refused_or_sane(entry: object) -> None:
    fake = SimpleNamespace(url="memory://c", manifest=SimpleNamespace(extra={"pairs": entry}))
    try:
        info = PairsInfo.of(fake)  # type: ignore[arg-type]
    except CorpusError as exc:
        assert "memory://c" in str(exc)
        return
    assert 0 <= info.floor <= info.threshold <= 1 and 0 < info.num_perm < 2**16
    assert all(isinstance(name, str) for name in info.files)


@pytest.fixture(scope="module")
def copied(jobs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of a finished corpus whose pairs file the hostile tests overwrite."""
    folder = tmp_path_factory.mktemp("hostile") / "corpus"
    shutil.copytree(jobs["0.8"], folder)
    return folder


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_a_hostile_pairs_file_is_a_clear_error(copied: Path, data: bytes) -> None:
    corpus = Corpus.open(str(copied))
    info = PairsInfo.of(corpus)
    (copied / info.files[0]).write_bytes(data)
    with pytest.raises(CorpusError, match=f"{info.files[0]}: (cannot read pairs file|not a pairs file)"):
        list(iter_pairs(corpus, info))
    outside = PairsInfo(["../elsewhere.parquet"], *list(info.to_dict().values())[1:])
    with pytest.raises(CorpusError):  # a manifest's path is followed only inside the corpus
        list(iter_pairs(corpus, outside))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edges=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 12), st.integers(0, 1), st.integers(0, 12),
                                st.integers(26, 32)), max_size=60),
       threshold=st.sampled_from([0.85, 0.9, 0.95, 1.0]), fold=st.integers(1, 8))
def test_recut_in_batches_equals_one_union_find(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                                                edges: list[tuple[int, int, int, int, int]], threshold: float,
                                                fold: int) -> None:
    """Pairs folded a few at a time give the components of all of them at once; split 0 plays an --against
    corpus, whose documents are never removed."""
    import numpy as np
    import pyarrow.parquet as pq

    from gristmill.dedup.cluster import connected_components, distinct
    from gristmill.pipeline.format import CORPUS_SCHEMA, ShardWriter
    from gristmill.pipeline.format.pairs_table import PAIRS_SCHEMA
    from gristmill.pipeline.report import what_if as module

    monkeypatch.setattr(module, "FOLD_PAIRS", fold)
    url = tmp_path_factory.mktemp("pairs") / "c"
    left = np.array([s << 32 | o for s, o, _, _, _ in edges], np.int64)
    right = np.array([s << 32 | o for _, _, s, o, _ in edges], np.int64)
    matches = np.array([m for *_, m in edges], np.uint16)
    (url / "_pairs").mkdir(parents=True)
    pq.write_table(pa.table([left, right, matches], schema=PAIRS_SCHEMA), url / "_pairs" / "p.parquet", row_group_size=5)
    with ShardWriter(str(url), CORPUS_SCHEMA) as writer:
        writer.write([{"id": "x", "text": "x"}])
        writer.commit(stats={"documents": {"input": 1, "kept": 1}}, extra={"pairs": {
            "files": ["_pairs/p.parquet"], "threshold": 0.8, "floor": 0.6, "num_perm": 32, "earlier_splits": 1,
            "key_bits": 32, "rows": len(edges)}})
    cut = module.recut(Corpus.open(str(url)), PairsInfo.of(Corpus.open(str(url))), threshold)
    linked = (matches / 32 >= threshold) & (left != right)  # a document paired with itself is no cluster
    keys = distinct(np.concatenate([left[linked], right[linked]]))
    labels = connected_components(keys, left[linked], right[linked])
    earlier = (keys >> 32) < 1
    near = 0
    for label in np.unique(labels):
        members = labels == label
        near += int((members & ~earlier).sum()) - (0 if (members & earlier).any() else 1)
    sizes = np.unique(labels, return_counts=True)[1]
    assert (cut.near_duplicates, cut.clusters, cut.largest) == (near, int(sizes.size), int(sizes.max(initial=0)))
