"""Exit 0 means success, every time: each read-only command run 200 times as the program ends 0.

``gristmill stats`` used to abort in Arrow's thread-pool teardown at interpreter exit ("terminate called
without an active exception", exit 134) after printing a correct result: 16 of 100 runs here before
``gristmill.pipeline.cli`` ended read-only commands with ``os._exit`` once their output was flushed. The loop runs
in one harness process that forks a child per run (tests/exit_loop.py), so 200 runs cost the commands
and their exits, not 200 interpreter start-ups; a few real subprocess runs check the output arrives
whole through a pipe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
RUNS = 200


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real dedup output (kept, removed, rejects, statistics), written by a subprocess so that this
    process never holds Ray's threads."""
    folder = tmp_path_factory.mktemp("exit-loop")
    lines = []
    for index in range(60):
        text = " ".join(f"word{(index // 3 * 7 + k) % 50}" for k in range(40)) + ("" if index % 3 else " tail")
        lines.append(json.dumps({"id": str(index), "text": text}))
    lines.append("this line is not JSON")
    (folder / "in.jsonl").write_text("\n".join(lines) + "\n")
    done = subprocess.run([sys.executable, "-m", "gristmill.pipeline.cli", "dedup", str(folder / "in.jsonl"), "-o",
                           str(folder / "corpus"), "--removed", str(folder / "removed"), "-q"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return folder / "corpus"


COMMANDS = [["inspect"], ["stats"], ["rejects"], ["clusters"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_read_only_command_exits_0_every_time(corpus: Path, command: list[str]) -> None:
    done = subprocess.run([sys.executable, str(HERE / "exit_loop.py"), str(RUNS), "2", *command, str(corpus)],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["statuses"] == {"0": RUNS}, result["stderr"]


@pytest.mark.parametrize("command", [*COMMANDS, ["stats", "--json"], ["rejects", "--json"], ["clusters", "--json"]],
                         ids=" ".join)
def test_real_runs_deliver_their_whole_output_through_a_pipe(corpus: Path, command: list[str]) -> None:
    expected = subprocess.run([sys.executable, "-c", "import sys; from gristmill.pipeline.cli import main; "
                               "sys.exit(main(sys.argv[1:]))", *command, str(corpus)],  # in-process exit path
                              capture_output=True, text=True, timeout=300)
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "gristmill.pipeline.cli", *command, str(corpus)], capture_output=True,
                              text=True, timeout=300)
        assert (done.returncode, done.stdout) == (0, expected.stdout) and done.stdout.endswith("\n"), done.stderr
    if "--json" in command and command[0] != "rejects":
        json.loads(done.stdout)
