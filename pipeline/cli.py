"""The ``gristmill`` command line: one sub-command per module, imported only when it runs.

Each module in ``COMMANDS`` defines ``add_arguments(parser)`` and ``run(args) -> int``. The top-level
help comes from ``COMMANDS`` alone and only the chosen command's module is imported, so
``gristmill --help`` stays fast and works on a lean install; a command whose extra is not installed
says which one to install.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # logging is imported only when a command runs: `gristmill --help` stays quick
    import logging

# name -> (module, one-line summary); the summaries live here so `gristmill --help` imports no command.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("gristmill.pipeline.commands.inspect",
              "Summarise a corpus from its manifest: shards, rows, bytes, row groups, schema (--verify checks checksums)."),
    "index": ("gristmill.pipeline.commands.index",
              "Make a folder of existing Parquet files (Hugging Face, datatrove, Spark) a corpus: a manifest, no rewrite."),
    "crawl": ("gristmill.pipeline.commands.crawl",
              "Crawl seed URLs or sitemaps into raw corpus shards (re-running resumes)."),
    "serve": ("gristmill.pipeline.commands.serve",
              "Serve dedup checks over HTTP: POST /check and /add against a corpus's signature index plus everything added."),
    "dedup": ("gristmill.pipeline.commands.dedup",
              "Deduplicate Parquet/JSONL/WARC documents (exact + MinHash) into a sharded corpus, on Ray."),
    "stats": ("gristmill.pipeline.commands.stats",
              "Print a corpus's dedup statistics: documents kept/removed/rejected, breakdowns, clusters, stage times."),
    "clusters": ("gristmill.pipeline.commands.clusters",
              "List the largest duplicate clusters; --show ID prints one cluster's members side by side with diffs."),
    "rejects": ("gristmill.pipeline.commands.rejects",
              "List the input records a dedup run rejected: file, position, kind and reason (--json: JSON Lines)."),
    "gc": ("gristmill.pipeline.commands.gc",
              "Reclaim space: remove the files earlier manifests listed, kept for their readers (--now: all of them)."),
}
RESUMABLE = ("dedup", "crawl")  # commands that pick up where they stopped when run again
# Commands that only read: once their output is flushed they end the process at once (see ``main``).
READ_ONLY = ("inspect", "stats", "clusters", "rejects")
INTERRUPTED = 130  # the shell's status for a process stopped by SIGINT (128 + 2)
DISTRIBUTION = "gristmill"
EXIT_STATUS = """exit status:
  0    success
  1    finished, but produced nothing or failed its check: dedup kept no document because every
       input record was rejected (or there were none), crawl stored nothing, inspect --verify
       found a corrupt shard, clusters --show found no such cluster
  2    usage or input error: a bad option, an input or corpus that cannot be read, a missing extra,
       an output folder another job is writing, a store that fails a request (one line names it)
  130  interrupted (Ctrl-C); dedup and crawl resume where they stopped when run again
"""


def build_parser(load: Collection[str] = ()) -> argparse.ArgumentParser:
    """The whole command line; only the commands in ``load`` get their options (importing their module),
    the others are names with a summary, which is all the top-level help shows."""
    parser = argparse.ArgumentParser(
        prog="gristmill", description="Crawl, deduplicate and stream LLM training corpora.",
        epilog=EXIT_STATUS, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_ShowVersion, nargs=0, help="print the installed version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, summary) in COMMANDS.items():
        command = sub.add_parser(name, help=summary, description=summary)
        if name in load:
            module = importlib.import_module(module_name)
            module.add_arguments(command)
            command.set_defaults(_run=module.run, _parser=command)
    return parser


class _ShowVersion(argparse.Action):
    """``--version``: the installed distribution's version, looked up only when asked (the metadata
    scan would cost every ``--help`` tens of milliseconds in a large environment)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            shown = version(DISTRIBUTION)
        except PackageNotFoundError:
            shown = "(not installed)"
        print(f"{parser.prog} {shown}")
        parser.exit()


def chosen_command(tokens: Sequence[str]) -> str | None:
    """The command the tokens name: the first one that is not an option (the top level takes no values)."""
    first = next((token for token in tokens if not token.startswith("-")), None)
    return first if first in COMMANDS else None


def missing_extra(error: ModuleNotFoundError, command: str) -> str | None:
    """The extra of this distribution that provides the module ``error`` misses: the command's own
    extra when it lists that module, else the first that does; None for a module no extra provides."""
    from importlib.metadata import PackageNotFoundError, requires

    module = (error.name or "").split(".")[0]
    try:
        requirements = requires(DISTRIBUTION) or []
    except PackageNotFoundError:
        return None
    extras = []
    for requirement in requirements:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement)
        if name and extra and re.sub(r"[-.]", "_", name.group(0)).lower() == module.lower():
            extras.append(extra.group(1))
    extras = [extra for extra in extras if extra not in ("all", "test")] or extras
    return command if command in extras else (extras[0] if extras else None)


def quiet_third_party_warnings() -> None:
    """Drop the notices of libraries we use that are not the user's concern on a normal run.

    Ray logs "Token authentication is enabled for this Ray cluster" on every local ``ray.init()``:
    that is Ray's secure default doing its job, so only that line goes; Ray's other warnings (token
    authentication disabled on a cluster we join, among them) still show.
    """
    import logging

    # the same function each time: addFilter keeps one copy however many commands a process runs
    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(_not_ray_token_notice)


def _not_ray_token_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def _is_interrupt(error: BaseException | None) -> bool:
    """Ctrl-C: a KeyboardInterrupt, or a SystemError raised with one pending, however deep the chain
    (numba's dispatcher wraps a KeyboardInterrupt raised while compiled code runs in a SystemError
    caused by it, and may wrap that again); any other SystemError is a crash."""
    while isinstance(error, SystemError):
        error = error.__cause__ or error.__context__
    return isinstance(error, KeyboardInterrupt)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status (see ``EXIT_STATUS``).

    Ctrl-C, a reader that closed the pipe (``| head``) and an unreadable file end the command with
    one line instead of a traceback: they are the user's or the system's doing, not a bug.

    Run as the program, a read-only command ends the process as soon as its output is flushed
    (``_end_process``): Arrow's C++ thread pools are torn down by static destructors after the
    interpreter has finalised, and that teardown aborted ``gristmill stats`` with "terminate called
    without an active exception" (exit 134) in 2 of 50 runs here after a correct result
    (apache/arrow#34314, open; no public call joins those pools). A read-only command has nothing
    left to write or release by then, so skipping the teardown loses nothing. Commands that write
    (dedup, crawl, serve) keep the normal exit: their atexit hooks and threads may still be finishing.
    """
    tokens = list(sys.argv[1:] if argv is None else argv)
    command = chosen_command(tokens)
    status = _dispatch(tokens, command, as_program=argv is None)
    if argv is None and command in READ_ONLY:
        _end_process(status)
    return status


def _dispatch(tokens: list[str], command: str | None, as_program: bool) -> int:
    """Parse ``tokens`` and run the command; the exit status, with the common failures as one line."""
    try:
        args = build_parser(load=[command] if command else []).parse_args(tokens)
        args._argv = tokens[tokens.index(args.command) + 1:]  # the command's own tokens, for --job files
        quiet_third_party_warnings()
        status = int(args._run(args) or 0)
        sys.stdout.flush()  # here, so a closed pipe is seen inside this try rather than at exit
        return status
    except ModuleNotFoundError as exc:
        extra = missing_extra(exc, str(command))
        if extra is None:
            raise
        print(f"gristmill {command} needs the {extra!r} extra: pip install 'gristmill[{extra}]' "
              f"(missing module: {exc.name})", file=sys.stderr)
        return 2
    except (KeyboardInterrupt, SystemError) as exc:
        if not _is_interrupt(exc):
            raise
        resume = "; run the same command again to resume" if command in RESUMABLE else ""
        print(f"gristmill {command}: interrupted{resume}", file=sys.stderr)
        if as_program:  # in-process callers (tests) get the status back
            _end_process(INTERRUPTED)
        return INTERRUPTED
    except BrokenPipeError:
        # The reader has all it wanted. Point stdout at /dev/null so the interpreter's last flush of
        # what is still buffered cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # its message names the file (pipeline.format.storage.naming)
        from gristmill.pipeline.commands.options import error_line

        print(f"gristmill {command}: {error_line(exc)}", file=sys.stderr)
        return 2


def _end_process(status: int) -> NoReturn:
    """Exit now with ``status``, once the output and the log handlers are flushed, skipping the
    interpreter's teardown. Used where what the command owns is already released: after an interrupt
    (dedup stops its Ray, crawl commits its state; Ray's C++ exit handler can race its own threads and
    crash, seen as SIGSEGV instead of 130 in about one of ten interrupted dedup runs) and after a
    read-only command (Arrow's pools, see ``main``)."""
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


if __name__ == "__main__":
    sys.exit(main())
