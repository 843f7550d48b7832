"""Main-text extraction quality on the shared article-extraction benchmark (token-level P/R/F1).

Why: ``gristmill.crawlers.extract.extract_text`` picks its library and settings by this measurement, quality
and CPU time per page (extraction is what bounds a crawl's pages/s), not by reputation. Scoring
follows scrapinghub/article-extraction-benchmark: whitespace tokens, per-page precision and recall
from token multisets, averaged over pages, F1 of the averages (also shown: the mean of per-page F1).
CPU ms/page is process time after a warm-up page, so it holds on a busy machine. Run:

    .venv/bin/python benchmarks/extraction_f1.py [--data DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from shared_data import ARTICLES  # noqa: E402

DEFAULT_DATA = ARTICLES


def _trafilatura(**options: object) -> Callable[[str], str]:
    import trafilatura

    def run(html: str) -> str:
        return trafilatura.extract(html, include_comments=False, include_tables=True, **options) or ""

    return run


def _resiliparse(html: str) -> str:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    return extract_plain_text(HTMLTree.parse(html), main_content=True, links=False, alt_texts=False,
                              list_bullets=False, form_fields=False)


def _justext(html: str) -> str:
    import justext

    paragraphs = justext.justext(html.encode("utf-8"), justext.get_stoplist("English"))
    return "\n".join(p.text for p in paragraphs if not p.is_boilerplate)


def _baseline(html: str) -> str:
    import lxml.html

    tree = lxml.html.fromstring(html)
    for bad in tree.xpath("//script|//style|//noscript"):
        bad.drop_tree()
    return tree.text_content()


def _gristmill(html: str) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gristmill.crawlers.extract import extract_text

    return extract_text(html)


CANDIDATES: dict[str, Callable[[], Callable[[str], str]]] = {
    "gristmill extract_text": lambda: _gristmill,
    "trafilatura default": lambda: _trafilatura(),
    "trafilatura favor_precision": lambda: _trafilatura(favor_precision=True),
    "trafilatura favor_recall": lambda: _trafilatura(favor_recall=True),
    "trafilatura default fast": lambda: _trafilatura(fast=True),
    "trafilatura favor_precision fast": lambda: _trafilatura(favor_precision=True, fast=True),
    "resiliparse main_content": lambda: _resiliparse,
    "justext": lambda: _justext,
    "lxml text_content baseline": lambda: _baseline,
}


def score(predicted: str, truth: str) -> tuple[float, float]:
    """Token-multiset precision and recall of one page (both 1.0 when both are empty)."""
    pred, gold = Counter(predicted.split()), Counter(truth.split())
    if not pred and not gold:
        return 1.0, 1.0
    common = sum((pred & gold).values())
    precision = common / sum(pred.values()) if pred else 0.0
    recall = common / sum(gold.values()) if gold else 0.0
    return precision, recall


def evaluate(extract: Callable[[str], str], pages: list[tuple[str, str]]) -> dict[str, float]:
    precisions, recalls, f1s = [], [], []
    extract(pages[0][0])  # imports and lazy set-up stay out of the timing
    started = time.process_time()
    for html, truth in pages:
        p, r = score(extract(html), truth)
        precisions.append(p)
        recalls.append(r)
        f1s.append(2 * p * r / (p + r) if p + r else 0.0)
    seconds = time.process_time() - started
    p, r = statistics.fmean(precisions), statistics.fmean(recalls)
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
            "mean_page_f1": statistics.fmean(f1s), "cpu_ms_per_page": 1000 * seconds / len(pages)}


def load_pages(data: Path) -> list[tuple[str, str]]:
    truth = json.loads((data / "ground-truth.json").read_text(encoding="utf-8"))
    pages = []
    for page_id, entry in sorted(truth.items()):
        raw = gzip.decompress((data / "html" / f"{page_id}.html.gz").read_bytes())
        pages.append((raw.decode("utf-8", errors="replace"), entry["articleBody"]))
    return pages


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--only", nargs="*", help="candidate names to run (default: all)")
    args = parser.parse_args()
    pages = load_pages(args.data)
    print(f"{len(pages)} pages from {args.data}\n")
    print("| extractor | precision | recall | F1 | mean page F1 | CPU ms/page |")
    print("|---|---|---|---|---|---|")
    for name, make in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        result = evaluate(make(), pages)
        print(f"| {name} | {result['precision']:.3f} | {result['recall']:.3f} | {result['f1']:.3f} | "
              f"{result['mean_page_f1']:.3f} | {result['cpu_ms_per_page']:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
