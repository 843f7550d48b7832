"""Sizes with units, ``"64MiB"`` or ``"1.5GB"`` or plain bytes: one vocabulary for every ``gristmill``
flag and job file (pipeline/commands/options.py) and the loader's byte arguments (``cache_bytes``,
``prefetch_bytes``, ...), so the same size is spelt the same way in a shell and in a training script."""

from __future__ import annotations

import re

UNITS = {"": 1, "b": 1,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*")


def parse_size(text: str | int | float) -> int:
    """Bytes from ``"64MiB"``, ``"1.5GB"``, ``"4096"`` or a number; ValueError naming the value otherwise.

    Units are decimal (kB, MB, GB, TB) or binary (KiB, MiB, GiB, TiB), any case; a bare number is bytes.
    """
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a size")
    if isinstance(text, int | float):
        number, unit = float(text), ""
    else:
        match = _SIZE.fullmatch(str(text))
        if not match or match.group(2).lower() not in UNITS:
            raise ValueError(f"{text!r} is not a size: write bytes or a number with a unit, e.g. 64MiB or 1.5GB "
                             f"(units: {', '.join(u for u in ('kB', 'MB', 'GB', 'TB', 'KiB', 'MiB', 'GiB', 'TiB'))})")
        number, unit = float(match.group(1)), match.group(2).lower()
    value = number * UNITS[unit]
    if not value == value or value < 0 or value > 2**62:  # NaN, negative or absurd
        raise ValueError(f"{text!r} is not a size between 0 and 4 EiB")
    return int(value)
