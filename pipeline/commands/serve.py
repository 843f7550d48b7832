"""``gristmill serve``: the dedup service over a corpus's signature index (see docs/SERVICE.md)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from gristmill.pipeline.commands import options
from gristmill.pipeline.service.client import TOKEN_ENV

LOCAL_STATE = "gristmill-serve-state"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", metavar="CORPUS",
                        help="corpus whose signature index to load (written by gristmill dedup); "
                             "default: none, start empty")
    parser.add_argument("--state-dir", metavar="DIR|URL",
                        help="where the snapshots and insert logs live: a local folder, or with --shards any "
                             "fsspec store (s3://...), where every insert is shipped before it is acknowledged "
                             "and a shard can restart on any node (default: INDEX/_serve with --shards and a "
                             f"--index on a store, else {LOCAL_STATE})")
    options.add_renamed(parser, "--state", "--state-dir", "state_dir")
    parser.add_argument("--job", metavar="TOML",
                        help="read options from this TOML file's [serve] table (or its top level); "
                             "options on the command line win (default: none)")
    parser.add_argument("--shards", type=int, default=1, metavar="K",
                        help="run K index shards as Ray actors behind this front (default %(default)s: one "
                             "index in this process)")
    parser.add_argument("--ray-address", metavar="ADDR", default=os.environ.get("RAY_ADDRESS"),
                        help="with --shards: the Ray cluster to join (default: $RAY_ADDRESS, else start a "
                             "local Ray)")
    parser.add_argument("--shard-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="with --shards: longest wait on a shard before a request is answered 503 "
                             "(default %(default)s)")
    parser.add_argument("--compact-every", type=int, default=1_000_000, metavar="N",
                        help="write a new snapshot in the background after N inserts (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default %(default)s); any non-loopback address needs a token")
    parser.add_argument("--port", type=int, default=8765, help="port (default %(default)s; 0 picks a free one)")
    parser.add_argument("--token-file", metavar="PATH",
                        help=f"file holding the bearer token clients must send (default: ${TOKEN_ENV}, else "
                             "no token)")
    parser.add_argument("--max-batch", type=int, default=1024,
                        help="most documents per request (default %(default)s)")
    parser.add_argument("--max-body-bytes", type=options.size, default=16 << 20, metavar="SIZE",
                        help=f"largest request body, e.g. 64MiB (default {options.format_size(16 << 20)})")
    options.add_renamed(parser, "--max-body-mb", "--max-body-bytes", "max_body_bytes",
                        convert=options.mib_to_bytes)
    parser.add_argument("--read-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="longest wait for a request's head or body; a slower client is cut off "
                             "(default %(default)s)")
    parser.add_argument("--export", metavar="OUT",
                        help="instead of serving: write every document the state holds as a corpus index "
                             "at OUT (what gristmill dedup --against reads) and exit (default: serve)")
    options.add_output_flags(parser, json_help="print the start-up summary, the listening address and "
                                               "--export's result as JSON objects, one per line")
    empty = parser.add_argument_group("parameters of an empty index (without --index)")
    empty.add_argument("--threshold", type=float, default=0.8,
                       help="Jaccard similarity at which two documents are near duplicates (default %(default)s)")
    empty.add_argument("--num-perm", type=int, default=128,
                       help="MinHash permutations per signature (default %(default)s)")
    empty.add_argument("--ngram", type=int, default=5, help="words per shingle (default %(default)s)")


def _say(args: argparse.Namespace, text: str, **fields: Any) -> None:
    """One result line on stdout: ``text`` for people, or ``fields`` as a JSON object with --json."""
    print(json.dumps(fields) if args.json else f"gristmill serve: {text}", flush=True)


def _token(args: argparse.Namespace) -> str | None:
    """The bearer token from ``--token-file`` or the environment; a blank one is an error, not "no token"."""
    from gristmill.pipeline.service.server import check_token

    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as handle:
                return check_token(handle.read().strip(), args.token_file)
        except UnicodeDecodeError:
            raise ValueError(f"{args.token_file}: the token file is not UTF-8 text") from None
    if TOKEN_ENV in os.environ:
        return check_token(os.environ[TOKEN_ENV], TOKEN_ENV)
    return None


def _state_dir(args: argparse.Namespace) -> str:
    """``--state-dir``, or its default: under a remote ``--index`` with ``--shards`` (nodes share no
    disk), else a local folder. A store needs ``--shards``: one process keeps its state on its disk."""
    from gristmill.pipeline.format.storage import is_local, open_fs

    if args.state_dir is None:
        remote_index = args.index is not None and not is_local(open_fs(args.index)[0])
        return f"{args.index.rstrip('/')}/_serve" if remote_index and args.shards > 1 else LOCAL_STATE
    if not is_local(open_fs(args.state_dir)[0]) and args.shards == 1:
        raise ValueError(f"--state-dir {args.state_dir}: a state on a store needs --shards K (K > 1); one process "
                         "keeps its state in a local folder")
    return args.state_dir


def _open_shard(args: argparse.Namespace, params: Any, k: int) -> tuple[Any, Callable[[], None]]:
    """Shard ``k`` of the state as an index to read, and what lets it go: a local folder is opened in
    place (its lock keeps a server out meanwhile); a state on a store is read, never written (a
    serving shard goes on), into a scratch copy that is removed again."""
    from gristmill.pipeline.format.storage import is_local, open_fs
    from gristmill.pipeline.service.core import DedupService
    from gristmill.pipeline.service.shards import copy_from_store

    if is_local(open_fs(args.state_dir)[0]):
        folder = args.state_dir if args.shards == 1 else os.path.join(args.state_dir, f"shard-{k}")
        service = DedupService(folder, params, index_url=args.index, part=(k, args.shards))
        return service, service.close
    scratch = tempfile.mkdtemp(prefix=f"gristmill-export-{k}-")
    service, _ = copy_from_store(scratch, params, args.index, (k, args.shards),
                                 f"{args.state_dir.rstrip('/')}/shard-{k}", take_over=False)

    def close() -> None:
        service.close()
        shutil.rmtree(scratch, ignore_errors=True)

    return service, close


def _export(args: argparse.Namespace, params: Any) -> int:
    """Write every document of the state (each shard's in turn, one open at a time) as a corpus index."""
    from gristmill.pipeline.format.lease import acquire_leases, release_leases
    from gristmill.pipeline.format.signature_index import write_index
    from gristmill.pipeline.format.storage import is_local, open_fs
    from gristmill.pipeline.service.durable import check_shard_count

    local = is_local(open_fs(args.state_dir)[0])
    source = os.path.abspath(args.state_dir) if local else args.state_dir.rstrip("/")
    if not local:
        check_shard_count(source, args.shards, create=False)
    opened = [_open_shard(args, params, 0)]
    first = opened[0][0]
    count = 0

    def tables() -> Iterator[Any]:
        nonlocal count
        for k in range(args.shards):
            service, close = opened.pop() if opened else _open_shard(args, params, k)
            try:
                count += len(service.index)
                yield from service.index.tables()
            finally:
                close()

    # one writer per output folder, as for gristmill dedup: another job is refused, this same export waits
    try:
        leases = acquire_leases([args.export], f"serve-export:{source}")
        try:
            name = write_index(args.export, first.params, tables(), stats={"exported_from": source,
                                                                          "shards": args.shards})
        finally:
            release_leases(leases)
    finally:
        for _, close in opened:
            close()
    path = f"{args.export.rstrip('/')}/{name}"
    _say(args, f"wrote {count} documents to {path}", exported=count, index=path)
    return 0


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from gristmill.pipeline.format import CorpusError
    from gristmill.pipeline.format.signature_index import check_export_folder, params_for
    from gristmill.pipeline.service.columns import return_freed_memory
    from gristmill.pipeline.service.core import DedupService
    from gristmill.pipeline.service.insert_log import LogError
    from gristmill.pipeline.service.server import check_bind, serve_forever
    from gristmill.pipeline.service.snapshot import StateError

    return_freed_memory()  # process-wide allocator settings: the serving process is ours alone
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if args.job:
            options.apply_job_file(args._parser, args, args.job, "serve", args._argv)
        if (args.max_batch < 1 or not args.max_body_bytes > 0 or not args.read_timeout > 0
                or args.compact_every < 1 or args.shards < 1):
            raise ValueError("--max-batch, --max-body-bytes, --read-timeout, --compact-every and --shards must be "
                             "positive")
        if not args.shard_timeout > 0:
            raise ValueError("--shard-timeout must be positive")
        args.state_dir = _state_dir(args)
        token = _token(args)
        check_bind(args.host, token)
        params = None if args.index else params_for(args.threshold, args.num_perm, args.ngram)
        if args.export:
            check_export_folder(args.export)  # before loading: refused in a second, not after minutes
            return _export(args, params)
        if args.shards == 1:
            service: Any = DedupService(args.state_dir, params, index_url=args.index,
                                        compact_every=args.compact_every)
            _say(args, f"{len(service.index)} documents ({service.index.base_count} from the index, "
                       f"{service.counters.replayed} replayed from the logs in {args.state_dir})",
                 documents=len(service.index), from_index=service.index.base_count,
                 replayed=service.counters.replayed, state_dir=args.state_dir)
        else:
            import ray

            from gristmill.pipeline.service.durable import read_placements
            from gristmill.pipeline.service.shards import ShardedService

            ray.init(address=args.ray_address, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=False)
            service = ShardedService(args.state_dir, args.shards, params, index_url=args.index,
                                     compact_every=args.compact_every, call_timeout=args.shard_timeout)
            documents = service.stats()["documents"]
            placement = read_placements(args.state_dir, args.shards) if service.durable else None
            where = "" if placement is None else ", generations " + ", ".join(
                str(p["generation"]) if p else "?" for p in placement) + " (as the store records them)"
            _say(args, f"{documents} documents in {args.shards} shards{where}", documents=documents,
                 shards=args.shards, state_dir=args.state_dir, placement=placement)
    except (OSError, ValueError, CorpusError, LogError, StateError) as exc:
        print(f"gristmill serve: {exc}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        _say(args, f"listening on {url}", listening=url)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, task.cancel)  # Ctrl-C stays KeyboardInterrupt: exit 130
        await serve_forever(service, args.host, args.port, token=token, max_batch=args.max_batch,
                            max_body_bytes=args.max_body_bytes, read_timeout=args.read_timeout,
                            ready=ready)

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        _say(args, "stopped", stopped=True)
    return 0
