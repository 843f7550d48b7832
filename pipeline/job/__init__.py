"""The Ray dedup job (``gristmill dedup``): raw documents in, a deduplicated, sharded corpus out.

One module per stage (docs/PIPELINE.md has the details, the memory each needs and the statistics):

1. ``read``     per split (Ray tasks): parse, reject bad records, normalise + exact hash, MinHash
                signature of each content hash new to the split, write the documents; shuffle
                (content hash, key) by hash.
2. ``exact``    per hash partition (Ray tasks): one survivor per content hash.
3. ``sign``     per split: the exact survivors' signatures (by content hash), band
                hashes; shuffle (band hash, key) by hash.
4. ``buckets``  per hash partition: candidate edges within each band bucket.
   ``verify``   (unless ``--no-verify``) each candidate edge joined with its two documents' signatures
                in two per-split hops (by the left key's split, then the right key's); only edges whose
                estimated Jaccard reaches the threshold go on.
5. ``components`` (stage ``cc``) rounds of large-star / small-star over hash-partitioned edges until stable.
6. ``clusters`` labels joined with signatures per split, shuffled by label; survivor choice and the
                estimated similarity of every removed member to its representative.
7. ``write``    per split: kept rows into shards (and removed rows into ``--removed``), the signature
                index, per-split statistics (``stats``); the driver writes the manifest last.

Around them: ``config`` (what a job is asked), ``datasets`` (every file a stage writes, named once),
``tasks`` (the context a task gets, completion records), ``extras`` (the input's own columns, carried
from read to write beside the documents), ``plan`` (fingerprint, ``--against``, folder
claims) and ``driver`` (``run_dedup``); ``inputs``, ``workdir`` and ``folders`` serve only the job.

A document's key is ``split << 32 | ordinal`` (input order), every reduce sorts, and shards are cut
per split, so the result does not depend on CPUs, partitions or nodes. Each task writes its
results and then a completion record under ``OUTPUT/_work``; a rerun skips what is recorded.
"""

from gristmill.pipeline.job.config import DedupConfig, DedupError
from gristmill.pipeline.job.driver import STAGES, job_stages, run_dedup

__all__ = ["STAGES", "DedupConfig", "DedupError", "job_stages", "run_dedup"]
