"""The vocabulary every ``gristmill`` command shares: sizes with units, ``--json``/``--quiet``, renamed
flags that keep working, and TOML job files.

One module so the same idea is spelt the same way everywhere (issue 19): a size is ``64MiB`` or
``1.5GB`` (or plain bytes) on every flag and in every job file; a renamed flag prints one
deprecation line and then behaves exactly like its new spelling.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gristmill.pipeline.format.sizes import UNITS, parse_size


def size(text: str) -> int:
    """``type=`` for argparse: a size with units (see :func:`parse_size`)."""
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def format_size(value: int) -> str:
    """``67108864`` -> ``"64MiB"``: how help texts show a size default, exact where a binary unit divides it."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = UNITS[unit.lower()]
        if value and value % scale == 0:
            return f"{value // scale}{unit}"
    return f"{value}B"


def add_output_flags(parser: argparse.ArgumentParser, json_help: str = "print the result as JSON on stdout") -> None:
    """``--json`` and ``--quiet``, the same on every command."""
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print only warnings, errors and the result: no progress")


class _Renamed(argparse.Action):
    """An old flag spelling: one deprecation line on stderr, then it acts as its new spelling."""

    warned: set[str] = set()  # once per process, though a job file's check parses the line again

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", convert: Any = None,
                 **kwargs: Any) -> None:
        self.new, self.convert = new, convert
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string not in self.warned:
            self.warned.add(str(option_string))
            print(f"gristmill: {option_string} is deprecated; use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, self.convert(values) if self.convert else values)


def add_renamed(parser: argparse.ArgumentParser, old: str, new: str, dest: str, *, convert: Any = None,
                nargs: Any = None, metavar: str | None = None) -> None:
    """Keep ``old`` working for ``new`` (stored in ``dest``), hidden from ``--help``.

    ``convert`` turns the old value into the new one (``--max-body-mb 16`` -> 16 MiB in bytes); it
    must raise ArgumentTypeError for a bad value. Pass ``nargs=0`` for an old boolean flag, whose
    ``convert`` then takes None.
    """
    parser.add_argument(old, dest=dest, action=_Renamed, new=new, convert=convert, nargs=nargs,
                        metavar=metavar, help=argparse.SUPPRESS, default=argparse.SUPPRESS)


def mib_to_bytes(text: str) -> int:
    """``convert`` for old ``--...-mb`` flags, which took MiB as a float."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of MiB") from None
    return size(f"{value}MiB")


def read_toml(path: str) -> dict[str, Any]:
    """A TOML file as a dict; OSError or ValueError naming the file when it cannot be read."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    with open(path, "rb") as handle:
        try:
            return tomllib.load(handle)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: not a valid TOML file: {exc}") from None


def job_table(path: str, command: str) -> dict[str, Any]:
    """The options of a job file for ``command``: its ``[command]`` table, or the top level when it has
    none; keys spelt as flags (``max-pages``) or as Python names (``max_pages``)."""
    data = read_toml(path)
    table = data.get(command, data)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: [{command}] is not a table")
    return {str(key).replace("-", "_"): value for key, value in table.items()}


@dataclass(frozen=True)
class JobKey:
    """A job-file key with no flag (a table of storage options, a list where the flag takes text): what it
    must be, in words for the error, and the check that converts it (ValueError/TypeError when wrong)."""

    expected: str
    convert: Callable[[Any], Any]


def apply_job_file(parser: argparse.ArgumentParser, args: argparse.Namespace, path: str, command: str,
                   argv: Sequence[str], job_only: Mapping[str, JobKey] | None = None) -> None:
    """Fill ``args`` from a TOML job file wherever the command line left the parser's default.

    The command's parser is the one typed schema of its flags and its job file: every key must be an
    option of the command or one of ``job_only`` (ValueError naming the file and the key otherwise), and
    its value must be what the option takes (``expected``): an integer option a TOML integer, a number
    option an integer or float, a size bytes or text with a unit (``"64MiB"``), a flag true or false,
    text options text; a wrong type is a ValueError naming the file, the key and the type expected.
    Options ``argv`` (the command's own tokens) spells out always win, even when equal to their default.
    """
    explicit = explicit_dests(parser, argv)
    actions = {action.dest: action for action in parser._actions
               if action.dest not in ("help", "job") and action.option_strings and not isinstance(action, _Renamed)}
    positional = {action.dest: action for action in parser._actions if not action.option_strings}
    extra = dict(job_only or {})
    values = {}
    for key, value in job_table(path, command).items():
        action = actions.get(key) or positional.get(key)
        if action is None and key not in extra:
            known = ", ".join(sorted(k.replace("_", "-") for k in (*actions, *positional, *extra)))
            raise ValueError(f"{path}: unknown option {key.replace('_', '-')!r} (known: {known})")
        checked = _job_only_value(path, key, extra[key], value) if key in extra else \
            _job_value(path, key, action, value)  # type: ignore[arg-type]
        if key not in explicit:  # checked all the same: the file is wrong whoever wins
            values[key] = checked
    for key, value in values.items():  # only once every key is known good
        setattr(args, key, value)


def _job_only_value(path: str, key: str, spec: JobKey, value: Any) -> Any:
    try:
        return spec.convert(value)
    except (ValueError, TypeError):
        raise ValueError(f"{path}: {key.replace('_', '-')}: expected {spec.expected}, got {_shown(value)}") from None


# What a job-file value must be for an option of each ``type=``: (in words, TOML types taken as they are).
_NUMBER_TYPES: dict[Any, tuple[str, tuple[type, ...]]] = {
    int: ("an integer", (int,)),
    float: ("a number", (int, float)),
}


def expected_type(action: argparse.Action) -> str:
    """What an option's value must be, in the words a job-file error uses."""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "true or false"
    if action.choices is not None:
        return "one of " + ", ".join(map(repr, action.choices))
    if action.type in _NUMBER_TYPES:
        return _NUMBER_TYPES[action.type][0]
    if action.type is size:
        return "a size (bytes, or text with a unit such as \"64MiB\")"
    if action.type in (None, str):
        return "text"
    return f"a value {getattr(action.type, '__name__', 'its type')} accepts"


def _shown(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "list", dict: "table"}
    return f"the {kind.get(type(value), type(value).__name__)} {value!r}"


def _job_value(path: str, key: str, action: argparse.Action, value: Any) -> Any:
    """A job-file value checked against the option's type and converted the way the command line would."""
    where = f"{path}: {key.replace('_', '-')}"
    expected = expected_type(action)
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {_shown(value)}")
        return value  # the key is the option's dest: `verify = false` for --no-verify means verify is False
    many = isinstance(action, argparse._AppendAction) or action.nargs in ("*", "+")
    values = value if isinstance(value, list) and many else [value]
    if isinstance(value, list) and not many:
        raise ValueError(f"{where}: takes one value, expected {expected}, got {_shown(value)}")
    converted = []
    for item in values:
        if isinstance(item, dict | list | bool) or not isinstance(item, str | int | float):
            raise ValueError(f"{where}: expected {expected}, got {_shown(item)}")
        if action.type in _NUMBER_TYPES and not isinstance(item, _NUMBER_TYPES[action.type][1]):
            raise ValueError(f"{where}: expected {expected}, got {_shown(item)}")
        try:  # as on the command line: the value through the option's type (none: the text itself)
            item = (action.type or str)(item if isinstance(item, str) or action.type in _NUMBER_TYPES else str(item))
        except (argparse.ArgumentTypeError, ValueError, TypeError, OverflowError) as exc:
            raise ValueError(f"{where}: expected {expected}, got {_shown(item)} ({exc})") from None
        if action.choices is not None and item not in action.choices:
            raise ValueError(f"{where}: expected {expected}, got {_shown(item)}")
        converted.append(item)
    return converted if many else converted[0]


def explicit_dests(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The ``dest`` of every option ``argv`` (the command's own tokens) spells out, abbreviations
    included: ``argv`` parsed again with every default suppressed and nothing required leaves only those."""
    saved = [(action, action.default, action.required) for action in parser._actions]
    try:
        for action, _, _ in saved:
            action.default, action.required = argparse.SUPPRESS, False
        given, _ = parser.parse_known_args(list(argv))
    finally:
        for action, default, required in saved:
            action.default, action.required = default, required
    return set(vars(given))


def error_line(exc: BaseException) -> str:
    """An error as the one line a command prints: a Ray task's error is shown as its cause (Ray's
    ``RayTaskError`` subclasses the cause's type but renders the whole remote traceback)."""
    shown = exc
    while type(shown).__module__.startswith("ray") and isinstance(getattr(shown, "cause", None), BaseException):
        shown = shown.cause  # a task's error raised again in the actor that awaited it: the innermost
    return str(shown) or type(shown).__name__
