"""A missing optional dependency named the way the command line names it: the extra to install."""

from __future__ import annotations


def missing_extra(error: ModuleNotFoundError, extra: str, needed_by: str) -> ModuleNotFoundError:
    """``error`` again, saying which ``gristmill[extra]`` provides the module ``needed_by`` needs."""
    return ModuleNotFoundError(f"{needed_by} needs {error.name}, which is not installed: pip install "
                               f"'gristmill[{extra}]'", name=error.name)
