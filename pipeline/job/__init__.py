"""The Ray dedup job (``gristmill dedup``): raw documents in, a deduplicated, sharded corpus out.

docs/PIPELINE.md describes the stages, what each holds in memory and the statistics.
"""

from pipeline.job.driver import STAGES, DedupConfig, DedupError, job_stages, run_dedup

__all__ = ["STAGES", "DedupConfig", "DedupError", "job_stages", "run_dedup"]
