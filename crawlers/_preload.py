"""Imported once by the extraction pool's fork server: every worker, and every recycled one, forks with
trafilatura and the language model already in memory instead of loading them itself (about a second
of CPU per worker, on the crawl's critical path at start-up).

The fork server ignores SIGINT only once its preloading is done; a Ctrl-C meanwhile (the crawl's first
seconds) would kill it with a traceback, so it ignores SIGINT from here on: the crawl owns Ctrl-C.
"""

import signal

from .extract import prepare_worker

signal.signal(signal.SIGINT, signal.SIG_IGN)
prepare_worker()
