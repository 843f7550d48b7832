"""Near-duplicate detection quality against the exact Jaccard similarity of the same shingle sets.

Documents: Debian's ``/usr/share/doc/*/copyright`` files (many carry the same licence with small
changes), real Python source files from two installed CPython 3.11 trees (different patch releases,
so many files are real near-duplicates of each other), and edited copies of some sources (tokens
replaced, deleted or inserted at a random rate of 0-8 %). Ground truth: the exact Jaccard similarity
of the word 5-gram sets of every pair (one sparse matrix product, so every pair is counted).

Reported at each threshold: pair precision/recall of the LSH candidates (pairs sharing a bucket) and of
the verified pairs (estimated Jaccard >= threshold), and document precision/recall/F1 of "this document
is a removable duplicate", where the truth clusters are the connected components of the exact pairs
with Jaccard >= threshold and both sides keep the survivor chosen by the same policy (longest, then
smallest id). datasketch's MinHashLSH on the same shingles is measured the same way.

    .venv-bench/bin/python benchmarks/dedup_quality.py
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from minhash_speed import word_shingles  # noqa: E402

from gristmill import dedup  # noqa: E402

ROOTS = ("/usr/lib/python3.11", "/root/.pyenv/versions/3.11.7/lib/python3.11")


def read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def corpus(sources: int | None, edited: int, seed: int) -> tuple[list[str], list[str]]:
    """(texts, kinds): licence files, sources from both trees (same relative paths), edited copies."""
    texts, kinds = [], []
    for path in sorted(Path("/usr/share/doc").glob("*/copyright")):
        text = path.read_bytes().decode("utf-8", errors="replace")
        texts.append(text)
        kinds.append("licence")
    rng = random.Random(seed)
    relative = sorted(
        p.relative_to(ROOTS[0]) for p in Path(ROOTS[0]).rglob("*.py") if 2000 < p.stat().st_size < 30000
    )
    picked = relative if sources is None else rng.sample(relative, min(sources, len(relative)))
    originals = []
    for rel in sorted(picked):
        for root in ROOTS:
            text = read(Path(root) / rel)
            if text is not None:
                texts.append(text)
                kinds.append("source")
                originals.append(text)
    for text in rng.sample(originals, min(edited, len(originals))):
        texts.append(edit(text, rng.uniform(0.0, 0.08), rng))
        kinds.append("edited")
    return texts, kinds


def edit(text: str, rate: float, rng: random.Random) -> str:
    out = []
    for token in text.split():
        roll = rng.random()
        if roll < rate / 3:
            out.append(f"edited{rng.randrange(10**6)}")
        elif roll < 2 * rate / 3:
            continue
        else:
            out.append(token)
            if roll > 1 - rate / 3:
                out.append(f"inserted{rng.randrange(10**6)}")
    return " ".join(out)


def exact_jaccard(shingle_sets: list[list[str]]) -> sp.coo_matrix:
    """Upper-triangle Jaccard of every pair sharing at least one shingle (exact, by set counts)."""
    vocabulary: dict[str, int] = {}
    rows, cols = [], []
    for doc, shingles in enumerate(shingle_sets):
        for s in shingles:
            cols.append(vocabulary.setdefault(s, len(vocabulary)))
            rows.append(doc)
    x = sp.csr_matrix(
        (np.ones(len(rows), np.int32), (rows, cols)), shape=(len(shingle_sets), len(vocabulary))
    )
    sizes = np.asarray(x.sum(axis=1)).ravel()
    common = sp.triu(x @ x.T, k=1).tocoo()
    union = sizes[common.row] + sizes[common.col] - common.data
    return sp.coo_matrix((common.data / union, (common.row, common.col)), shape=common.shape)


def pair_codes(left: np.ndarray, right: np.ndarray, n: int) -> np.ndarray:
    lo, hi = np.minimum(left, right), np.maximum(left, right)
    return np.unique(lo.astype(np.int64) * n + hi)


def bucket_pairs(hashes: np.ndarray, n: int) -> np.ndarray:
    """Every pair of documents sharing a bucket in some band (all pairs, for evaluation only)."""
    codes = []
    for band in hashes.T:
        order = np.argsort(band, kind="stable")
        starts = np.flatnonzero(np.r_[True, band[order][1:] != band[order][:-1]])
        for begin, end in zip(starts, np.r_[starts[1:], n], strict=True):
            if end - begin > 1:
                members = order[begin:end]
                i, j = np.triu_indices(members.size, k=1)
                codes.append(pair_codes(members[i], members[j], n))
    return np.unique(np.concatenate(codes)) if codes else np.zeros(0, np.int64)


def removable(pairs: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Documents that are not the survivor of their component (same policy as deduplicate)."""
    n = lengths.size
    keys = np.arange(n, dtype=np.int64)
    labels = dedup.connected_components(keys, pairs // n, pairs % n)
    is_rep, _ = dedup.choose_representatives(labels, lengths, keys)
    return ~is_rep


def scores(predicted: np.ndarray, truth: np.ndarray) -> tuple[float, float, float]:
    """Precision, recall, F1 of two boolean arrays or two sets of pair codes."""
    if predicted.dtype == bool:
        hits, p, t = np.count_nonzero(predicted & truth), np.count_nonzero(predicted), np.count_nonzero(truth)
    else:
        hits, p, t = np.intersect1d(predicted, truth).size, predicted.size, truth.size
    precision = hits / p if p else 1.0
    recall = hits / t if t else 1.0
    return precision, recall, 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def datasketch_pairs(shingle_sets: list[list[str]], threshold: float, num_perm: int) -> np.ndarray:
    from datasketch import MinHash, MinHashLSH

    n = len(shingle_sets)
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    hashes = []
    for doc, shingles in enumerate(shingle_sets):
        m = MinHash(num_perm=num_perm, seed=1)
        m.update_batch([s.encode("utf-8") for s in shingles])
        lsh.insert(doc, m)
        hashes.append(m)
    left, right = [], []
    for doc, m in enumerate(hashes):
        for other in lsh.query(m):
            if other != doc:
                left.append(doc)
                right.append(other)
    return pair_codes(np.array(left, np.int64), np.array(right, np.int64), n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sources",
        type=int,
        default=None,
        help="source paths picked (each read from both trees); default all",
    )
    parser.add_argument("--edited", type=int, default=600)
    parser.add_argument("--thresholds", type=float, nargs="+", default=[0.7, 0.8])
    parser.add_argument("--num-perm", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    texts, kinds = corpus(args.sources, args.edited, args.seed)
    n = len(texts)
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    shingle_sets = [word_shingles(t, 5) for t in texts]
    jaccard = exact_jaccard(shingle_sets)
    counts = {k: kinds.count(k) for k in ("licence", "source", "edited")}
    print(f"{n} documents {counts}, {sum(map(len, texts)) / 1e6:.1f} M characters")

    hasher = dedup.MinHasher(num_perm=args.num_perm, shingle="word")
    signatures = hasher.signatures(texts)
    all_codes = pair_codes(jaccard.row, jaccard.col, n)
    all_j = jaccard.data[np.argsort(jaccard.row.astype(np.int64) * n + jaccard.col)]
    pair_rows, doc_rows, curve_rows = [], [], []
    for t in args.thresholds:
        close = jaccard.data >= t
        truth = pair_codes(jaccard.row[close], jaccard.col[close], n)
        true_removable = removable(truth, lengths)
        for verify in (True, False):
            bands, rows = dedup.choose_bands(t, args.num_perm, verify)
            label = f"gristmill, {bands}x{rows} bands" + (" + verification" if verify else "")
            candidates = bucket_pairs(dedup.band_hashes(signatures, bands, rows), n)
            if verify:
                found = np.isin(all_codes, candidates)
                for lo in np.arange(0.5, 1.0, 0.05):
                    in_bin = (all_j >= lo) & (all_j < lo + 0.05) if lo < 0.949 else all_j >= lo
                    rate, expected = found[in_bin].mean(), dedup.s_curve(bands, rows, all_j[in_bin]).mean()
                    curve_rows.append(
                        (t, f"{bands}x{rows}", f"{lo:.2f}-{lo + 0.05:.2f}", int(in_bin.sum()), rate, expected)
                    )
                estimate = dedup.estimated_jaccard(signatures[candidates // n], signatures[candidates % n])
                pair_rows.append(
                    (
                        t,
                        truth.size,
                        f"gristmill LSH candidates, {bands}x{rows} bands",
                        candidates.size,
                        *scores(candidates, truth),
                    )
                )
                candidates = candidates[estimate >= t]
            pair_rows.append((t, truth.size, label, candidates.size, *scores(candidates, truth)))
            result = dedup.deduplicate(
                texts, threshold=t, num_perm=args.num_perm, shingle="word", verify=verify
            )
            assert (result.stats["bands"], result.stats["rows"]) == (bands, rows)
            predicted = np.array(result.table.column("status").to_pylist()) != "kept"
            doc_rows.append(
                (
                    t,
                    int(true_removable.sum()),
                    f"gristmill deduplicate(verify={verify})",
                    int(predicted.sum()),
                    *scores(predicted, true_removable),
                )
            )
        theirs = datasketch_pairs(shingle_sets, t, args.num_perm)
        pair_rows.append((t, truth.size, "datasketch MinHashLSH", theirs.size, *scores(theirs, truth)))
        ds_removable = removable(theirs, lengths)
        doc_rows.append(
            (
                t,
                int(true_removable.sum()),
                "datasketch MinHashLSH + the same clustering",
                int(ds_removable.sum()),
                *scores(ds_removable, true_removable),
            )
        )

    print("\nPairs (truth: exact Jaccard >= threshold)\n")
    print("| threshold | true pairs | method | predicted pairs | precision | recall | F1 |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for t, true_count, name, count, p, r, f in pair_rows:
        print(f"| {t} | {true_count} | {name} | {count} | {p:.4f} | {r:.4f} | {f:.4f} |")
    print("\nDocuments (is this document a removable duplicate?)\n")
    print("| threshold | truly removable | method | predicted removable | precision | recall | F1 |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for t, true_count, name, count, p, r, f in doc_rows:
        print(f"| {t} | {true_count} | {name} | {count} | {p:.4f} | {r:.4f} | {f:.4f} |")
    print("\nCandidate rate by exact Jaccard vs the S-curve (its mean over the pairs in each bin)\n")
    print("| threshold | bands x rows | Jaccard bin | pairs | became candidates | S-curve |")
    print("|---:|---|---|---:|---:|---:|")
    for t, banding, name, count, rate, expected in curve_rows:
        print(f"| {t} | {banding} | {name} | {count} | {rate:.3f} | {expected:.3f} |")


if __name__ == "__main__":
    main()
