"""Where every block of a corpus is: shard, row group, rows and byte range, as flat int64 arrays.

Everything that plans an epoch or fetches a block reads these arrays rather than the manifest's
per-shard objects. They are the corpus format's block table (``gristmill.pipeline.format.BlockTable``): read
once per process from the version 2 sidecar, or built from a version 1 manifest's inline row groups,
so ``Layout.of(corpus.shards)`` costs no copy.
"""

from __future__ import annotations

from gristmill.pipeline.format import BlockTable

Layout = BlockTable

__all__ = ["Layout"]
