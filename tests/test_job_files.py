"""One typed schema for job files and flags: every command's parser types its TOML job file, so a
value of the wrong type is exit 2 naming the file, the key and the type expected, never a traceback."""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gristmill.pipeline.cli import build_parser, main
from gristmill.pipeline.commands import dedup as dedup_cmd
from gristmill.pipeline.commands.options import _Renamed, apply_job_file, parse_size, size

JOB_COMMANDS = ("crawl", "serve", "dedup")


def command_parser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(load=[command])
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def schema(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions
            if a.dest not in ("help", "job") and not isinstance(a, _Renamed | argparse._VersionAction)}


PARSERS = {command: command_parser(command) for command in JOB_COMMANDS}


def toml_value(value: Any) -> str:
    """TOML for a generated value (strings as basic strings, tables inline)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"


scalars = st.one_of(st.booleans(), st.integers(-10**6, 10**12), st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from(["128", "64MiB", "lots", "same-host", "0.5", "", "x y"]),
                    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=8))
values = st.one_of(scalars, st.lists(scalars, max_size=3), st.dictionaries(st.sampled_from(["a", "b"]), scalars,
                                                                            max_size=2))


def is_scalar_of(action: argparse.Action, value: Any) -> bool:
    """The oracle: what the option's type takes, written out independently of the checker."""
    if isinstance(value, bool | list | dict):
        return False
    if action.type is int:
        return isinstance(value, int)
    if action.type is float:
        return isinstance(value, int | float)
    if action.type is size:
        try:
            parse_size(value if isinstance(value, str) else str(value))
        except ValueError:
            return False
        return True
    if action.choices is not None:
        return value in action.choices
    if action.type is None:
        return True  # text options take numbers as their text, as the command line would
    try:
        action.type(value if isinstance(value, str) else str(value))
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return False
    return True


def acceptable(action: argparse.Action | None, key: str, value: Any, command: str) -> bool:
    if action is None:
        if command == "dedup" and key == "storage_options":
            return isinstance(value, dict)
        if command == "dedup" and key == "prefer":
            return isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value)
        return False
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return isinstance(value, bool)
    if command == "dedup" and key == "prefer":
        return isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value)
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+")
    if isinstance(value, list):
        return many and all(is_scalar_of(action, v) for v in value)
    return is_scalar_of(action, value)


@st.composite
def job_files(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    command = draw(st.sampled_from(JOB_COMMANDS))
    keys = sorted(schema(PARSERS[command]))
    extra = ["storage_options"] if command == "dedup" else []
    chosen = draw(st.lists(st.sampled_from([*keys, *extra, "no_such_key"]), min_size=1, max_size=4, unique=True))
    return command, {key: draw(values) for key in chosen}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(job_files())
def test_a_job_file_is_applied_whole_or_refused_naming_a_bad_key(job: tuple[str, dict[str, Any]]) -> None:
    command, table = job
    parser = PARSERS[command]
    actions = schema(parser)
    with tempfile.TemporaryDirectory() as folder:
        path = str(Path(folder) / "job.toml")
        Path(path).write_text("".join(f"{key} = {toml_value(value)}\n" for key, value in table.items()))
        argv = ["in"] if command == "crawl" else []
        args = parser.parse_args(argv)
        before = vars(args).copy()
        bad = [key for key, value in table.items() if not acceptable(actions.get(key), key, value, command)]
        try:
            apply_job_file(parser, args, path, command, argv, dedup_cmd._job_only() if command == "dedup" else None)
        except ValueError as exc:
            message = str(exc)
            assert bad, f"refused a good job file: {message}"
            assert "\n" not in message and message.startswith(f"{path}: ")
            assert any(f"{key.replace('_', '-')!r}" in message or f": {key.replace('_', '-')}:" in message
                       for key in bad), message
            assert vars(args) == before  # nothing applied from a file with one bad key
            return
        assert not bad, f"accepted {bad} of {table}"
        for key in table:
            action = actions.get(key)
            got = getattr(args, key)
            if action is not None and action.type in (int, size):
                assert all(isinstance(v, int) and not isinstance(v, bool) for v in (got if isinstance(got, list)
                                                                                    else [got]))
            if action is not None and action.type is float:
                assert isinstance(got, float)


@pytest.mark.parametrize(("command", "line", "key", "expected"), [
    ("dedup", 'num_perm = "128"', "num-perm", "an integer"),
    ("dedup", "threshold = true", "threshold", "a number"),
    ("dedup", 'storage_options = "x"', "storage-options", "a table of fsspec options"),
    ("dedup", "prefer = [1]", "prefer", "text, or a list of domains as text"),
    ("crawl", 'max-pages = "5"', "max-pages", "an integer"),
    ("serve", 'port = "8080"', "port", "an integer"),
])
def test_a_wrong_type_is_exit_2_naming_key_and_type(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
                                                    line: str, key: str, expected: str) -> None:
    job = tmp_path / "job.toml"
    head = {"dedup": f'inputs = ["in.jsonl"]\noutput = "{tmp_path / "out"}"\n',
            "crawl": f'output = "{tmp_path / "out"}"\n', "serve": ""}[command]
    job.write_text(f"{head}{line}\n")
    argv = {"dedup": [], "crawl": [str(tmp_path / "seeds.txt")], "serve": []}[command]
    assert main([command, "--job", str(job), *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{job}: {key}: expected {expected}, got" in err, err
    assert not (tmp_path / "out").exists()


def test_verify_false_in_a_dedup_job_file_turns_verification_off(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('inputs = ["in.jsonl"]\noutput = "out"\nverify = false\nnum-perm = 64\nstorage_options = {a = 1}\n')
    parser = PARSERS["dedup"]
    argv = ["--job", str(job)]
    args = parser.parse_args(argv)
    args._argv = argv
    config = dedup_cmd.config_from_args(args)
    assert (config.verify, config.num_perm, config.storage_options) == (False, 64, {"a": 1})
