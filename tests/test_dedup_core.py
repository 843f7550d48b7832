"""deduplicate(): the in-memory path end to end, on real near-duplicate licence texts."""

from __future__ import annotations

import glob
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from gristmill import dedup

COLUMNS = [
    "id",
    "content_hash",
    "cluster_id",
    "cluster_size",
    "is_representative",
    "duplicate_of",
    "similarity",
    "status",
]


def words(seed: int, count: int = 400) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(count))


def edit(text: str, changes: int, seed: int) -> str:
    rng = random.Random(seed)
    tokens = text.split()
    for _ in range(changes):
        tokens[rng.randrange(len(tokens))] = f"edit{rng.randrange(10**6)}"
    return " ".join(tokens)


def check_invariants(result: dedup.DedupResult, n: int) -> None:
    table, stats = result.table, result.stats
    assert table.column_names == COLUMNS and table.num_rows == n
    assert sum(stats[s] for s in dedup.STATUSES) == stats["documents"] == n
    rows = table.to_pylist()
    by_id = {row["id"]: row for row in rows}
    for row in rows:
        rep = by_id[row["cluster_id"]]
        assert rep["is_representative"] and rep["cluster_id"] == rep["id"]
        assert row["is_representative"] == (row["status"] == "kept") == (row["duplicate_of"] is None)
        if not row["is_representative"]:
            assert row["duplicate_of"] == row["cluster_id"]
        if row["status"] == "exact_duplicate":
            assert row["content_hash"] == rep["content_hash"] and row["similarity"] == 1.0
    sizes = {}
    for row in rows:
        sizes[row["cluster_id"]] = sizes.get(row["cluster_id"], 0) + 1
    assert all(row["cluster_size"] == sizes[row["cluster_id"]] for row in rows)
    assert sum(size * count for size, count in stats["cluster_sizes"].items()) == n


def test_exact_near_and_unique_documents() -> None:
    base = words(1)
    texts = [
        base,  # 0
        base.upper().replace(" ", "\t"),  # 1: exact after normalisation, same length
        edit(base, 3, seed=2) + " and a longer tail",  # 2: near, longest: the survivor
        words(3),  # 3: unrelated
        edit(base, 120, seed=4),  # 4: far too different
    ]
    result = dedup.deduplicate(texts, ids=["a", "b", "c", "d", "e"])
    check_invariants(result, 5)
    table = result.table.to_pydict()
    assert table["status"] == ["near_duplicate", "near_duplicate", "kept", "kept", "kept"]
    assert table["cluster_id"] == ["c", "c", "c", "d", "e"]
    assert table["cluster_size"] == [3, 3, 3, 1, 1]
    assert table["content_hash"][0] == table["content_hash"][1] != table["content_hash"][2]
    assert 0.8 <= table["similarity"][0] == table["similarity"][1] < 1.0
    assert result.stats["cluster_sizes"] == {1: 2, 3: 1}
    assert (result.stats["bands"], result.stats["rows"]) == dedup.choose_bands(0.8, 128, verify=True)


def test_exact_duplicates_of_the_survivor() -> None:
    base = words(5)
    result = dedup.deduplicate([base, base, "  " + base + "!", words(6)])
    check_invariants(result, 4)
    table = result.table.to_pydict()
    assert table["status"] == ["exact_duplicate", "exact_duplicate", "kept", "kept"]  # index 2 is longest
    assert table["id"] == [0, 1, 2, 3] and table["duplicate_of"] == [2, 2, None, None]
    assert result.stats["exact_unique"] == 2


def test_priority_column_overrides_length() -> None:
    base = words(7)
    texts = [base, base + " extra words at the end"]
    by_length = dedup.deduplicate(texts).table.column("is_representative").to_pylist()
    by_priority = dedup.deduplicate(texts, priority=[10, 1]).table.column("is_representative").to_pylist()
    assert by_length == [False, True] and by_priority == [True, False]


def test_verification_removes_unconfirmed_candidates() -> None:
    base = words(8, 40)
    texts = [edit(base, k, seed=k) for k in range(0, 12)]
    same_bands = {"false_positive_weight": 0.5, "false_negative_weight": 0.5}
    unverified = dedup.deduplicate(texts, threshold=0.8, verify=False, **same_bands)
    verified = dedup.deduplicate(texts, threshold=0.8, verify=True, **same_bands)
    assert verified.stats["bands"] == unverified.stats["bands"] == dedup.optimal_bands(0.8, 128)[0]
    check_invariants(unverified, len(texts))
    check_invariants(verified, len(texts))
    assert verified.stats["candidate_pairs"] == unverified.stats["candidate_pairs"]
    assert (
        verified.stats["linked_pairs"]
        <= unverified.stats["linked_pairs"]
        == unverified.stats["candidate_pairs"]
    )
    assert verified.stats["kept"] >= unverified.stats["kept"]
    default = dedup.deduplicate(texts, threshold=0.8, verify=False).stats
    assert (default["bands"], default["rows"]) == dedup.choose_bands(0.8, 128, verify=False)


def test_empty_and_whitespace_only_documents() -> None:
    result = dedup.deduplicate(["", "   ", "\n", "real text " * 10, ""])
    check_invariants(result, 5)
    table = result.table.to_pydict()
    assert table["status"] == ["exact_duplicate", "kept", "exact_duplicate", "kept", "exact_duplicate"]
    empty = dedup.deduplicate([])
    assert empty.table.num_rows == 0 and empty.stats["documents"] == 0


def test_arrow_input_and_ids() -> None:
    base = words(9)
    texts = pa.chunked_array([pa.array([base, words(10)]), pa.array([edit(base, 2, seed=1)])])
    ids = pa.array([1000, 2000, 3000], pa.int64())
    result = dedup.deduplicate(texts, ids=ids)
    check_invariants(result, 3)
    assert result.table.schema.field("id").type == pa.int64()
    assert (
        result.table.column("cluster_id").to_pylist()[0] == result.table.column("cluster_id").to_pylist()[2]
    )


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="unique"):
        dedup.deduplicate(["a", "b"], ids=[1, 1])
    with pytest.raises(ValueError, match="2 ids for 3 documents"):
        dedup.deduplicate(["a", "b", "c"], ids=[1, 2])
    with pytest.raises(TypeError, match="document 1 is null"):
        dedup.deduplicate(["a", None])


def test_real_licence_files_cluster_by_licence() -> None:
    """Debian copyright files: many carry the same licence text; results match the exact Jaccard."""
    paths = sorted(glob.glob("/usr/share/doc/*/copyright"))[:250]
    assert len(paths) >= 100, "needs Debian's /usr/share/doc/*/copyright files"
    texts = [Path(p).read_text(encoding="utf-8", errors="replace") for p in paths]
    result = dedup.deduplicate(texts, ids=paths, threshold=0.8)
    check_invariants(result, len(texts))
    rows = result.table.to_pylist()
    shingles = [shingle_set(t) for t in texts]
    index = {p: i for i, p in enumerate(paths)}
    removed = [r for r in rows if r["status"] == "near_duplicate"]
    assert removed, "the sample holds near-duplicate licence files"
    for row in removed:
        a, b = shingles[index[row["id"]]], shingles[index[row["duplicate_of"]]]
        assert len(a & b) / len(a | b) > 0.6  # estimated >= 0.8 directly or through a chain
    assert np.isclose(
        np.mean([r["similarity"] for r in removed]),
        np.mean([jaccard(shingles[index[r["id"]]], shingles[index[r["duplicate_of"]]]) for r in removed]),
        atol=0.05,
    )


def shingle_set(text: str, n: int = 5) -> set[tuple[str, ...]]:
    tokens = dedup.normalize(text).split()
    return {tuple(tokens[i : i + n]) for i in range(max(1, len(tokens) - n + 1))}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b)


def test_importing_dedup_and_planning_a_job_loads_no_numba() -> None:
    """The job's driver only plans (bands, seed); numba's compiler state (~100 MB) loads with the first kernel."""
    code = (
        "import sys, gristmill.dedup as dedup, gristmill.pipeline.job.config as job; "
        "job.index_params(job.DedupConfig(inputs=['in'], output='out')); "
        "before = 'numba' in sys.modules; dedup.content_hash('x'); "
        "print(before, 'numba' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                            capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
