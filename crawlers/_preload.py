"""Imported once by the extraction pool's fork server: every worker, and every recycled one, forks with
trafilatura and the language model already in memory instead of loading them itself (about a second
of CPU per worker, on the crawl's critical path at start-up)."""

from .extract import prepare_worker

prepare_worker()
