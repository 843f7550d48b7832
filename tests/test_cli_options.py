"""The shared command-line vocabulary: sizes with units, renamed flags, TOML job files."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gristmill.pipeline.commands.options import (
    add_renamed,
    apply_job_file,
    format_size,
    mib_to_bytes,
    parse_size,
    size,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("4096", 4096), ("64MiB", 64 << 20), ("64mib", 64 << 20), ("1.5GB", 1_500_000_000), ("2 KiB", 2048),
    ("1TB", 10**12), (".5MiB", 1 << 19), (7, 7),
])
def test_sizes_with_units(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@given(st.integers(min_value=1, max_value=2**50))
def test_format_size_round_trips(value: int) -> None:
    assert parse_size(format_size(value)) == value


@given(st.text(max_size=12))
def test_any_text_is_a_size_or_a_clear_error(text: str) -> None:
    try:
        value = parse_size(text)
    except ValueError as exc:
        assert repr(text) in str(exc)
    else:
        assert 0 <= value <= 2**62


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gristmill crawl")
    parser.add_argument("seeds")
    parser.add_argument("--max-body", type=size, default=10 << 20)
    add_renamed(parser, "--max-body-mb", "--max-body", "max_body", convert=mib_to_bytes)
    parser.add_argument("--max-pages", type=int)
    parser.add_argument("--no-robots", action="store_true")
    parser.add_argument("--proxy", action="append", default=[])
    parser.add_argument("--follow", choices=("same-host", "any"), default="same-host")
    parser.add_argument("--user-agent")
    parser.add_argument("--resolve", action="append", default=[])
    return parser


def test_renamed_flag_warns_and_converts(capsys: pytest.CaptureFixture[str]) -> None:
    args = _parser().parse_args(["seeds.txt", "--max-body-mb", "1.5"])
    assert args.max_body == 3 << 19
    assert "--max-body-mb is deprecated; use --max-body" in capsys.readouterr().err
    assert "--max-body-mb" not in _parser().format_help()


def test_job_file_fills_what_the_command_line_left(tmp_path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[crawl]\nmax-body = "2MiB"\nmax_pages = 7\nno-robots = true\nproxy = ["a", "b"]\n'
                   'follow = "any"\n')
    parser = _parser()
    argv = ["seeds.txt", "--max-pages", "100", "--max-body", "10MiB"]  # explicit, though equal to default
    args = parser.parse_args(argv)
    apply_job_file(parser, args, str(job), "crawl", argv)
    assert (args.max_body, args.max_pages, args.no_robots, args.proxy, args.follow) == (
        10 << 20, 100, True, ["a", "b"], "any")


def test_job_file_values_of_untyped_options_are_text(tmp_path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('user-agent = 5\nresolve = ["a=127.0.0.1", 7]\n')
    parser = _parser()
    args = parser.parse_args(["seeds.txt"])
    apply_job_file(parser, args, str(job), "crawl", ["seeds.txt"])
    assert (args.user_agent, args.resolve) == ("5", ["a=127.0.0.1", "7"])


@pytest.mark.parametrize(("text", "message"), [
    ("bogus = 1", "unknown option 'bogus'"),
    ("max-pages = 'x'", "max-pages: expected an integer, got the string 'x'"),
    ("max-pages = '7'", "max-pages: expected an integer, got the string '7'"),
    ("max-pages = 7.5", "max-pages: expected an integer, got the float 7.5"),
    ("max-body = 'lots'", "max-body: expected a size .*, got the string 'lots' .'lots' is not a size"),
    ("no-robots = 1", "no-robots: expected true or false, got the integer 1"),
    ("max-pages = 3\nmax-body = [1, 2]", "max-body: takes one value"),
    ("follow = 'nowhere'", "follow: expected one of 'same-host', 'any', got the string 'nowhere'"),
    ("max-pages = ", "not a valid TOML file"),
    ("user-agent = false", "user-agent: expected text, got the boolean False"),
    ("resolve = [true]", "resolve: expected text, got the boolean True"),
    ("proxy = {a = 1}", "proxy: expected text, got the table"),
])
def test_bad_job_file_names_file_and_key(tmp_path, text: str, message: str) -> None:
    job = tmp_path / "job.toml"
    job.write_text(text + "\n")
    parser = _parser()
    args = parser.parse_args(["seeds.txt"])
    before = vars(args).copy()
    with pytest.raises(ValueError, match=message) as caught:
        apply_job_file(parser, args, str(job), "crawl", ["seeds.txt"])
    assert str(job) in str(caught.value)
    assert vars(args) == before  # nothing applied from a file with one bad key
