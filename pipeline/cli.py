"""The ``gristmill`` command line: one sub-command per module, imported only when it runs.

Each module in ``COMMANDS`` defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; it
must import its heavy dependencies (Ray, aiohttp, torch) inside ``run`` so ``gristmill --help`` and
``gristmill inspect`` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

COMMANDS: dict[str, str] = {
    "inspect": "pipeline.inspect_cmd",
    "crawl": "crawlers.cli",
    "serve": "pipeline.serve_cmd",
    "dedup": "pipeline.dedup_cmd",
    "stats": "pipeline.stats_cmd",
    "clusters": "pipeline.clusters_cmd",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gristmill", description="Crawl, deduplicate and stream LLM training corpora."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit status."""
    args = build_parser().parse_args(argv)
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
