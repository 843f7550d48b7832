"""Where the shared data sets live: ``shared/data`` beside the checkout (``../shared``) or beside the
folder that holds it (a worktree one level further down)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def shared_data(name: str) -> Path:
    """``shared/data/NAME`` of the nearest of those two places; the first when neither has it (so a
    missing data set is reported under the conventional path)."""
    places = [folder / "shared" / "data" / name for folder in (REPO.parent, REPO.parent.parent)]
    return next((place for place in places if place.exists()), places[0])


ARTICLES = shared_data("article-extraction-benchmark")
