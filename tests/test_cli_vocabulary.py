"""One vocabulary for every ``gristmill`` command (issue 19): every flag explained with its default, sizes
with units under ``--<thing>-bytes``, ``--json`` and ``--quiet`` everywhere; and serve's job files and
renamed flags, end to end."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gristmill.pipeline.cli import COMMANDS, build_parser
from gristmill.pipeline.commands.options import format_size

pytestmark = pytest.mark.timeout(120)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of one command, its module imported (only that one)."""
    parser = build_parser(load=[name])
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[name]


def visible_options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The flags ``--help`` shows (renamed old spellings are hidden on purpose)."""
    return [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._HelpAction)]


def vocabulary_problems(name: str) -> list[str]:
    """Every way the command ``name`` departs from the shared vocabulary, one line each."""
    parser = command_parser(name)
    problems = []
    flags = {flag for action in visible_options(parser) for flag in action.option_strings}
    for required in ("--json", "--quiet", "-q"):
        if required not in flags:
            problems.append(f"no {required}")
    for action in visible_options(parser):
        flag = max(action.option_strings, key=len)
        if not action.help:
            problems.append(f"{flag} has no help text")
            continue
        if flag.endswith("-mb"):
            problems.append(f"{flag} takes MiB: name it --...-bytes with options.size")
        if isinstance(action, argparse._StoreAction) and action.default is not None \
                and "default" not in action.help.lower():
            problems.append(f"{flag} does not state its default ({action.default!r})")
        if flag.endswith("-bytes"):
            try:
                accepts = action.type is not None and action.type("64MiB") == 64 << 20
            except (argparse.ArgumentTypeError, ValueError):
                accepts = False
            if not accepts:
                problems.append(f"{flag} does not accept 64MiB")
            elif isinstance(action.default, int) and format_size(action.default) not in action.help \
                    and "%(default)s" in action.help:
                problems.append(f"{flag} shows its default in bytes, not as {format_size(action.default)}")
    return problems


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_speaks_the_vocabulary(name: str) -> None:
    assert vocabulary_problems(name) == []


def test_the_check_finds_a_flag_that_departs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk above cannot pass vacuously: a command with every kind of fault is caught."""
    import gristmill.pipeline.commands.rejects as rejects

    def faulty(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--max-body-mb", type=float, default=16.0)
        parser.add_argument("--split-bytes", type=int, default=1 << 20, help="split size")

    monkeypatch.setattr(rejects, "add_arguments", faulty)
    assert vocabulary_problems("rejects") == [
        "no --json", "no --quiet", "no -q", "--max-body-mb has no help text",
        "--split-bytes does not state its default (1048576)", "--split-bytes does not accept 64MiB"]


def test_serve_takes_a_job_file_sizes_with_units_and_its_old_spellings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from gristmill.pipeline.cli import main
    from gristmill.pipeline.commands import options

    monkeypatch.setattr(options._Renamed, "warned", set())  # deprecations warn once a process: start afresh

    state = tmp_path / "state"
    job = tmp_path / "serve.toml"
    job.write_text(f'[serve]\nstate-dir = "{state}"\nmax-body-bytes = "1MiB"\nnum-perm = 64\n')
    assert main(["serve", "--job", str(job), "--export", str(tmp_path / "export"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["exported"] == 0 and result["index"].startswith(str(tmp_path / "export"))
    assert state.is_dir()  # the job file's state-dir was used

    args = build_parser(load=["serve"]).parse_args(["serve", "--max-body-mb", "0.5", "--state", str(state)])
    assert (args.max_body_bytes, args.state_dir) == (1 << 19, str(state))
    err = capsys.readouterr().err
    assert "--max-body-mb is deprecated; use --max-body-bytes" in err and "--state is deprecated" in err
    assert build_parser(load=["serve"]).parse_args(["serve", "--max-body-bytes", "64MiB"]).max_body_bytes == 64 << 20

    job.write_text('[serve]\nmax-body-byte = "1MiB"\n')
    assert main(["serve", "--job", str(job), "--export", str(tmp_path / "export2")]) == 2
    assert f"{job}: unknown option 'max-body-byte'" in capsys.readouterr().err
