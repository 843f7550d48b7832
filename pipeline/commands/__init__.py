"""The ``gristmill`` subcommands, one module each, thin: arguments, a call into the library, exit status.

Each defines ``add_arguments(parser)`` and ``run(args) -> int`` and imports its heavy
dependencies (Ray, aiohttp, torch) inside ``run``, so ``gristmill CMD --help`` is fast and a missing
extra is named when the command runs (``gristmill.pipeline.cli`` imports only the chosen command's module).
Helpers two commands share live in a library module both import, never in a command.
"""
