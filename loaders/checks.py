"""Checks for arguments and checkpoint fields: a wrong value fails at once, by name, not later as wrong batches.

A wrong *type* of argument is a ``TypeError`` and a wrong value a ``ValueError``; a checkpoint's fields
pass ``error=ValueError``, since there the state is the argument and any bad field is a bad value of it.
``bool`` is refused where a number is wanted (``True`` would otherwise pass as 1).
"""

from __future__ import annotations

import math
import numbers
import reprlib

from gristmill.pipeline.format.sizes import parse_size

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80


def shown(value: object) -> str:
    """``repr(value)`` cut short: a hostile value must not make a message of megabytes."""
    return _SHORT.repr(value)


def integer(value: object, name: str, *, minimum: int | None = None, maximum: int | None = None,
            error: type[Exception] = TypeError) -> int:
    """``value`` as an int within ``[minimum, maximum]``; ``error`` for a non-integer, ValueError out of range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{name} must be an integer, got {shown(value)} ({type(value).__name__})")
    number = int(value)
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {number}")
    return number


def byte_size(value: object, name: str, *, minimum: int | None = None) -> int:
    """A size in bytes: an integer, or text with a unit as the command line takes it (``"10GB"``, ``"64MiB"``)."""
    if isinstance(value, str):
        try:
            value = parse_size(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None
    return integer(value, name, minimum=minimum)


def optional_integer(value: object, name: str, *, minimum: int | None = None, maximum: int | None = None,
                     error: type[Exception] = TypeError) -> int | None:
    """None, or ``value`` checked as by ``integer``."""
    return None if value is None else integer(value, name, minimum=minimum, maximum=maximum, error=error)


def flag(value: object, name: str, *, error: type[Exception] = TypeError) -> bool:
    """``value`` if it is a bool (``0``/``1``/``"yes"`` are refused: a typo should not pass as a choice)."""
    if not isinstance(value, bool):
        raise error(f"{name} must be True or False, got {shown(value)} ({type(value).__name__})")
    return value


def positive_finite(value: object, name: str, *, error: type[Exception] = TypeError) -> float:
    """``value`` as a float that is finite and > 0 (a mixing weight)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be a number, got {shown(value)} ({type(value).__name__})")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {number}")
    return number
