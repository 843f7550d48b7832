"""``gristmill serve``: the dedup service over a corpus's signature index (see docs/SERVICE.md)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

from pipeline.service.client import TOKEN_ENV


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--index", metavar="CORPUS",
                        help="corpus whose signature index to load (written by gristmill dedup); omit to start empty")
    parser.add_argument("--state", default="gristmill-serve-state", metavar="DIR",
                        help="local folder for the snapshots, insert logs and memory-mapped signatures "
                             "(default: %(default)s)")
    parser.add_argument("--shards", type=int, default=1, metavar="K",
                        help="run K index shards as Ray actors behind this front (default %(default)s: one "
                             "index in this process)")
    parser.add_argument("--ray-address", metavar="ADDR",
                        help="with --shards: the Ray cluster to join (default: start a local Ray)")
    parser.add_argument("--compact-every", type=int, default=1_000_000, metavar="N",
                        help="write a new snapshot in the background after N inserts (default %(default)s)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default %(default)s); any non-loopback address needs a token")
    parser.add_argument("--port", type=int, default=8765, help="port (default %(default)s; 0 picks a free one)")
    parser.add_argument("--token-file", metavar="PATH",
                        help=f"file holding the bearer token clients must send (or set {TOKEN_ENV})")
    parser.add_argument("--max-batch", type=int, default=1024, help="most documents per request (default %(default)s)")
    parser.add_argument("--max-body-mb", type=float, default=16.0,
                        help="largest request body in MiB (default %(default)s)")
    parser.add_argument("--read-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="longest wait for a request's head or body; a slower client is cut off "
                             "(default %(default)s)")
    parser.add_argument("--export", metavar="OUT",
                        help="instead of serving: write every document the state holds as a corpus index "
                             "at OUT (what gristmill dedup --against reads) and exit")
    empty = parser.add_argument_group("parameters of an empty index (without --index)")
    empty.add_argument("--threshold", type=float, default=0.8)
    empty.add_argument("--num-perm", type=int, default=128)
    empty.add_argument("--ngram", type=int, default=5)


def _token(args: argparse.Namespace) -> str | None:
    """The bearer token from ``--token-file`` or the environment; a blank one is an error, not "no token"."""
    from pipeline.service.server import check_token

    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as handle:
                return check_token(handle.read().strip(), args.token_file)
        except UnicodeDecodeError:
            raise ValueError(f"{args.token_file}: the token file is not UTF-8 text") from None
    if TOKEN_ENV in os.environ:
        return check_token(os.environ[TOKEN_ENV], TOKEN_ENV)
    return None


def _export(args: argparse.Namespace, params: Any) -> int:
    """Write every document of the state (each shard's in turn, one open at a time) as a corpus index."""
    from pipeline.format.signature_index import write_index
    from pipeline.service.server import DedupService

    folders = [args.state] if args.shards == 1 else [os.path.join(args.state, f"shard-{k}") for k in range(args.shards)]
    opened = [DedupService(folders[0], params, index_url=args.index, part=(0, args.shards))]
    count = 0

    def tables() -> Iterator[Any]:
        nonlocal count
        for k, folder in enumerate(folders):
            service = opened.pop() if opened else DedupService(folder, params, index_url=args.index,
                                                               part=(k, args.shards))
            try:
                count += len(service.index)
                yield from service.index.tables()
            finally:
                service.close()

    first = opened[0]
    try:
        name = write_index(args.export, first.params, tables(), stats={"exported_from": os.path.abspath(args.state),
                                                                       "shards": args.shards})
    finally:
        for service in opened:
            service.close()
    print(f"gristmill serve: wrote {count} documents to {args.export.rstrip('/')}/{name}")
    return 0


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging
    import signal

    from pipeline.format import CorpusError
    from pipeline.format.signature_index import check_export_folder, params_for
    from pipeline.service.columns import return_freed_memory
    from pipeline.service.server import DedupService, LogError, StateError, check_bind, serve_forever

    return_freed_memory()  # process-wide allocator settings: the serving process is ours alone
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        if (args.max_batch < 1 or not args.max_body_mb > 0 or not args.read_timeout > 0 or args.compact_every < 1
                or args.shards < 1):
            raise ValueError("--max-batch, --max-body-mb, --read-timeout, --compact-every and --shards must be "
                             "positive")
        token = _token(args)
        check_bind(args.host, token)
        params = None if args.index else params_for(args.threshold, args.num_perm, args.ngram)
        if args.export:
            check_export_folder(args.export)  # before loading: refused in a second, not after minutes
            return _export(args, params)
        if args.shards == 1:
            service: Any = DedupService(args.state, params, index_url=args.index, compact_every=args.compact_every)
            print(f"gristmill serve: {len(service.index)} documents ({service.index.base_count} from the index, "
                  f"{service.counters.replayed} replayed from the logs in {args.state})", flush=True)
        else:
            import ray

            from pipeline.service.shards import ShardedService

            ray.init(address=args.ray_address, include_dashboard=False, logging_level="ERROR",
                     log_to_driver=False)
            service = ShardedService(args.state, args.shards, params, index_url=args.index,
                                     compact_every=args.compact_every)
            print(f"gristmill serve: {service.stats()['documents']} documents in {args.shards} shards", flush=True)
    except (OSError, ValueError, CorpusError, LogError, StateError) as exc:
        print(f"gristmill serve: {exc}", file=sys.stderr)
        return 2

    def ready(url: str) -> None:
        print(f"gristmill serve: listening on {url}", flush=True)

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, task.cancel)  # Ctrl-C stays KeyboardInterrupt: exit 130
        await serve_forever(service, args.host, args.port, token=token, max_batch=args.max_batch,
                            max_body_bytes=int(args.max_body_mb * 1024 * 1024), read_timeout=args.read_timeout,
                            ready=ready)

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        print("gristmill serve: stopped", flush=True)
    return 0
