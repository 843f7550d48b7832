"""``make demo``: what gristmill can do today, run on data every Debian machine has.

Writes the licence texts under /usr/share/doc/*/copyright into a corpus in the gristmill format and
prints its summary. The crawl -> dedup -> loader flow replaces this once those stages exist; until
then the demo says plainly that it only exercises the corpus format.
"""

from __future__ import annotations

import glob
import sys
from pathlib import Path

from pipeline.format import Corpus, ShardWriter
from pipeline.inspect_cmd import render, summarise

OUTPUT = Path("demo-output")


def main() -> int:
    paths = sorted(glob.glob("/usr/share/doc/*/copyright"))
    corpus_url = str((OUTPUT / "copyright-corpus").resolve())
    with ShardWriter(corpus_url, shard_bytes=4 << 20, row_group_bytes=256 << 10) as writer:
        for path in paths:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
            writer.write([{"id": path, "text": text, "source": path, "language": "en"}])
    writer.commit(stats={"documents_in": len(paths)})
    print(render(summarise(Corpus.open(corpus_url), verify=True)))
    print(
        f"\nDemo: wrote {len(paths)} licence files into a gristmill corpus at {corpus_url}.\n"
        "Only the corpus format exists so far; crawl, dedup and streaming are not part of this demo yet."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
