"""A corpus several times larger than Ray's object store: the job finishes and accounts for every document.

The job moves documents through its work folder, never through the object store, so the store's
size must not bound the corpus. This runs a real local Ray whose object store is as small as Ray
allows on an input three times that size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gristmill.pipeline.format import Corpus
from gristmill.pipeline.job import DedupConfig, run_dedup

pytestmark = pytest.mark.timeout(300)

OBJECT_STORE_BYTES = 80 * 1024 * 1024  # Ray refuses less than 75 MiB
INPUT_BYTES = 3 * OBJECT_STORE_BYTES
WORDS_PER_DOCUMENT = 2_000
FILES = 8


def _write_input(folder: Path) -> tuple[int, int]:
    """JSONL files of random-word documents (pairwise far apart), every fourth one an exact copy of
    the one before; returns (documents, exact copies)."""
    rng = np.random.default_rng(7)
    vocabulary = np.array([f"w{i:05d}" for i in range(20_000)])
    documents = copies = written = 0
    previous = ""
    for index in range(FILES):
        with open(folder / f"part-{index}.jsonl", "w", encoding="utf-8") as handle:
            while written < INPUT_BYTES * (index + 1) // FILES:
                if documents % 4 == 3:
                    text, copies = previous, copies + 1
                else:
                    text = " ".join(vocabulary[rng.integers(0, len(vocabulary), WORDS_PER_DOCUMENT)])
                handle.write(json.dumps({"id": f"doc-{documents}", "text": text}) + "\n")
                previous, documents, written = text, documents + 1, written + len(text)
    return documents, copies


def test_input_three_times_the_object_store_finishes_with_every_document_accounted(tmp_path: Path) -> None:
    import ray

    inputs = tmp_path / "input"
    inputs.mkdir()
    documents, copies = _write_input(inputs)
    ray.init(address="local", num_cpus=2, object_store_memory=OBJECT_STORE_BYTES, include_dashboard=False,
             logging_level="ERROR", log_to_driver=False)
    try:
        assert ray.cluster_resources()["object_store_memory"] <= OBJECT_STORE_BYTES
        stats = run_dedup(DedupConfig(inputs=[str(inputs)], output=str(tmp_path / "corpus")))
    finally:
        ray.shutdown()
    counts = stats["documents"]
    assert stats["bytes"]["input_documents"] >= 3 * OBJECT_STORE_BYTES
    assert counts["input"] == documents
    assert (counts["exact_duplicate"], counts["near_duplicate"], counts["rejected"]) == (copies, 0, 0)
    assert counts["kept"] == documents - copies == Corpus.open(str(tmp_path / "corpus")).num_rows
