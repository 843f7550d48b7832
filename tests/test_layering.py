"""The layering rules of DESIGN.md ("Who depends on whom"), read from the code's own imports.

Every ``.py`` file under dedup/, pipeline/, crawlers/ and loaders/ is parsed and every import counts,
one inside a function too (a lazy import is still an arrow). The floors:

    3  pipeline/ (all but format): job, service, commands, report, demo, cli
    2  crawlers/, loaders/
    1  pipeline/format/   (the corpus contract)
    0  dedup/

An arrow goes down a floor, or stays inside its own package (floor 3 is one building: its rooms may
use each other). On top of that: ``pipeline/__init__.py`` imports nothing; the service never imports
the batch job; nothing imports a command (``pipeline.cli`` loads them by name; ``pipeline.commands.options``,
the vocabulary every command shares, is the package's one library module); nobody imports a
private name from another room; Ray is used on floor 3 only, torch only by the PyTorch adapter,
aiohttp not by dedup/, the format or loaders/. Our packages are imported as ``gristmill.X`` (a bare
``pipeline`` or ``dedup`` could be a user's module); module names below leave the prefix off. A failure
names the file, the line and the rule.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("dedup", "pipeline", "crawlers", "loaders")
NAMESPACE = "gristmill."  # what the distribution installs the four folders under
COMMAND_LIBRARIES = ("pipeline.commands.options",)  # modules of pipeline/commands that are not commands
ROOMS = ("pipeline.format", "pipeline.job", "pipeline.service", "pipeline.commands", "pipeline.report",
         "pipeline.demo", "pipeline.cli")


@dataclass(frozen=True)
class Arrow:
    """One import: ``source`` (the importing module) imports ``target`` (a module or a name in one)."""

    source: str
    target: str
    where: str  # path:line
    name: str | None = None  # for ``from module import name``: the name
    bare: bool = False  # an absolute import of one of our packages without the gristmill. prefix


def _target(name: str) -> tuple[str, bool]:
    """An imported name without the namespace prefix, and whether it named one of ours without it."""
    if name.startswith(NAMESPACE):
        return name[len(NAMESPACE):], False
    return name, name.split(".")[0] in PACKAGES


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def arrows(root: Path) -> Iterator[Arrow]:
    """Every import in every module of our packages under ``root``."""
    for top in PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            module = module_name(path, root)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Import):
                    for alias in node.names:
                        target, bare = _target(alias.name)
                        yield Arrow(module, target, where, bare=bare)
                elif isinstance(node, ast.ImportFrom):
                    base, bare = node.module or "", False
                    if node.level:  # relative: from the package, up level - 1
                        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                        base = ".".join([*anchor, *([base] if base else [])])
                    elif base == NAMESPACE.rstrip("."):  # `from gristmill import dedup`
                        base = ""
                    else:
                        base, bare = _target(base)
                    for alias in node.names:  # the name may be a submodule: `from gristmill.pipeline import job`
                        yield Arrow(module, f"{base}.{alias.name}".lstrip("."), where, alias.name, bare)


def floor(module: str) -> int | None:
    """The floor of one of our modules (None for anything else: the standard library, third parties)."""
    top = module.split(".")[0]
    if top == "dedup":
        return 0
    if _under(module, "pipeline.format"):
        return 1
    if top in ("crawlers", "loaders"):
        return 2
    return 3 if top == "pipeline" else None


def package_of(module: str) -> str:
    """What an arrow may stay inside of: the format for floor 1, otherwise the top-level package."""
    return "pipeline.format" if floor(module) == 1 else module.split(".")[0]


def room_of(module: str) -> str:
    return next((room for room in ROOMS if _under(module, room)), package_of(module))


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


# Third-party packages only some of our modules may import: who may, in words and as a test.
HEAVY: dict[str, tuple[str, Callable[[str], bool]]] = {
    "ray": ("floor 3 (pipeline/ but the format)", lambda module: floor(module) == 3),
    "torch": ("loaders.torch_dataset (the PyTorch adapter)", lambda module: module == "loaders.torch_dataset"),
    "aiohttp": ("crawlers/ and floor 3", lambda module: floor(module) == 3 or _under(module, "crawlers")),
}


def broken_rules(arrow: Arrow) -> list[str]:
    """Why this import is not allowed (empty when it is)."""
    problems = []
    if arrow.bare:
        problems.append(f"import it as {NAMESPACE}{arrow.target.split('.')[0]}: a bare name can be shadowed")
    source_floor, target_floor = floor(arrow.source), floor(arrow.target)
    if target_floor is not None:
        assert source_floor is not None
        if target_floor >= source_floor and package_of(arrow.target) != package_of(arrow.source):
            problems.append(f"floor {source_floor} may not import floor {target_floor} ({package_of(arrow.target)}): "
                            "imports only run downward")
        if arrow.source == "pipeline":
            problems.append("pipeline/__init__.py stays empty of imports")
        if _under(arrow.source, "pipeline.service") and _under(arrow.target, "pipeline.job"):
            problems.append("the service never imports the batch job (the signature index is "
                            "pipeline.format.signature_index)")
        if _under(arrow.target, "pipeline.commands") and not any(_under(arrow.target, m) for m in COMMAND_LIBRARIES):
            problems.append("commands are not libraries: move what is shared into a module both import")
        if arrow.name and arrow.name.startswith("_") and room_of(arrow.source) != room_of(arrow.target):
            problems.append(f"{arrow.name} is private to {room_of(arrow.target)}")
    top = arrow.target.split(".")[0]
    if top in HEAVY and not HEAVY[top][1](arrow.source):
        problems.append(f"{top} may only be imported by {HEAVY[top][0]}")
    return problems


def violations(root: Path) -> list[str]:
    return [f"{a.where}: {a.source} imports {a.target}: {problem}"
            for a in arrows(root) for problem in broken_rules(a)]


def test_the_code_keeps_the_layering_rules() -> None:
    seen = {a.source for a in arrows(REPO)}  # the walk saw the code (a wrong root would pass vacuously)
    assert {"dedup.lsh", "pipeline.format.reader", "crawlers.crawler", "loaders.loader", "pipeline.job.driver"} <= seen
    assert violations(REPO) == []


@pytest.mark.parametrize("module", ["gristmill.loaders", "gristmill.pipeline.format"])
def test_importing_the_lower_floors_loads_no_ray_aiohttp_or_torch(module: str) -> None:
    code = f"import sys, {module}; print(','.join(m for m in ('ray', 'aiohttp', 'torch') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name in (*PACKAGES, *files):
        path = tmp_path / name if name.endswith(".py") else tmp_path / name / "__init__.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files.get(name, ""), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(("path", "code", "rule"), [
    ("dedup/core.py", "from gristmill.pipeline.format import Corpus", "imports only run downward"),
    ("pipeline/format/reader.py", "def f():\n    from gristmill.pipeline.job import run_dedup", "imports only run downward"),
    ("pipeline/format/reader.py", "from gristmill.crawlers import crawl", "imports only run downward"),
    ("crawlers/crawler.py", "from gristmill.pipeline.service.client import ServiceError", "imports only run downward"),
    ("loaders/blocks.py", "from ..crawlers import urls", "imports only run downward"),
    ("loaders/blocks.py", "import gristmill.crawlers.urls", "imports only run downward"),
    ("pipeline/__init__.py", "from gristmill.pipeline.format import Corpus", "stays empty of imports"),
    ("pipeline/service/server.py", "from gristmill.pipeline.job.config import DedupConfig", "never imports the batch job"),
    ("pipeline/demo/__main__.py", "from gristmill.pipeline.commands.stats import render", "commands are not libraries"),
    ("pipeline/service/server.py", "from gristmill.pipeline.format.reader import _private", "private to pipeline.format"),
    ("loaders/loader.py", "import ray", "ray may only be imported by"),
    ("loaders/loader.py", "import torch", "torch may only be imported by"),
    ("pipeline/format/writer.py", "import aiohttp", "aiohttp may only be imported by"),
    ("loaders/blocks.py", "from pipeline.format import Corpus", "a bare name can be shadowed"),
    ("crawlers/crawler.py", "import dedup", "a bare name can be shadowed"),
])
def test_a_planted_violation_is_named(tmp_path: Path, path: str, code: str, rule: str) -> None:
    found = violations(_tree(tmp_path, {path: code}))
    assert len(found) == 1 and found[0].startswith(path) and rule in found[0]


def test_downward_and_inside_arrows_pass(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "pipeline/format/reader.py": "from gristmill.dedup import lsh\nfrom gristmill.pipeline.format.manifest import CorpusError",
        "crawlers/output.py": "from gristmill.pipeline.format import ShardWriter\nfrom .frontier import ResultLog",
        "pipeline/job/inputs/warc.py": "from gristmill.crawlers.extract import extract_text\nfrom gristmill.pipeline import format",
        "pipeline/cli.py": "import importlib\nfrom gristmill import dedup",
        "pipeline/commands/crawl.py": "from gristmill.pipeline.commands.options import size",
        "loaders/torch_dataset.py": "import torch",
    })
    assert violations(root) == []
