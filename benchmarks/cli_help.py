"""How long ``gristmill --help`` takes in a fresh interpreter, beside the floor and the alternatives.

Issue 19 asks for ``gristmill --help`` under 0.3 s; before, it imported every command module
(pyarrow, the report, the job's modules). Each case runs as a new process, the cases interleaved
round by round so the shared machine's load falls on all alike; reported are medians and ratios:

- ``python -c pass``: the floor, an interpreter that starts and exits;
- ``gristmill --help`` and ``gristmill stats --help`` through the console script;
- every command module imported, as the top-level help did before (what lazy imports save);
- ``scrapy --help``, the command line of the crawler users would pick instead (when installed).

    .venv-bench/bin/python benchmarks/cli_help.py --rounds 15
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
EAGER = ("import importlib\nfrom gristmill.pipeline.cli import COMMANDS, build_parser\n"
         "[importlib.import_module(module) for module, _ in COMMANDS.values()]\nbuild_parser().format_help()")


def cases() -> dict[str, list[str]]:
    """Name -> command line of each case this environment can run."""
    found = {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "gristmill --help": [str(BIN / "gristmill"), "--help"],
        "gristmill stats --help": [str(BIN / "gristmill"), "stats", "--help"],
        "every command imported (the old --help)": [sys.executable, "-c", EAGER],
    }
    scrapy = BIN / "scrapy" if (BIN / "scrapy").exists() else shutil.which("scrapy")
    if scrapy:
        found["scrapy --help"] = [str(scrapy), "--help"]
    return found


def timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="fresh processes per case (default %(default)s)")
    args = parser.parse_args()
    commands = cases()
    for command in commands.values():  # warm the page cache and byte-code once; not timed
        timed(command)
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.rounds):
        for name, command in commands.items():
            seconds[name].append(timed(command))
    floor = statistics.median(seconds["python -c pass (floor)"])
    help_median = statistics.median(seconds["gristmill --help"])
    print(f"{'case':<42} {'median s':>9} {'min s':>7} {'x floor':>8} {'x gristmill --help':>19}")
    results = []
    for name, values in seconds.items():
        median = statistics.median(values)
        results.append({"case": name, "median_s": round(median, 4), "min_s": round(min(values), 4),
                        "runs": len(values)})
        print(f"{name:<42} {median:>9.3f} {min(values):>7.3f} {median / floor:>8.1f} {median / help_median:>19.2f}")
    print(json.dumps({"rounds": args.rounds, "python": sys.version.split()[0], "results": results}))


if __name__ == "__main__":
    main()
