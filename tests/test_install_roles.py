"""The lean install: a training node streams a corpus without Ray, numba, trafilatura, aiohttp or scipy;
the command line names the extra a command is missing; every imported dependency is declared.

The heavy packages are installed in the test environment, so a lean node is simulated: a
``sys.meta_path`` finder in a fresh interpreter refuses to import them, as a missing package would.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from gristmill.pipeline.commands.options import read_toml

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "crawlers", "dedup", "loaders")
HEAVY = ("ray", "numba", "trafilatura", "aiohttp", "scipy", "datasketch")
# Run first in the subprocess: `import x` of a blocked package fails as it would were x not installed.
BLOCKER = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, Missing())
"""


def without(blocked: tuple[str, ...], code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where ``blocked`` packages cannot be imported."""
    return subprocess.run([sys.executable, "-c", BLOCKER + code, ",".join(blocked), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=150)


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_names(requirements: list[str]) -> set[str]:
    return {_normalise(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in requirements}


def _pyproject() -> dict:
    return read_toml(str(REPO / "pyproject.toml"))


def test_a_training_node_streams_a_corpus_without_the_heavy_packages(tmp_path: Path) -> None:
    code = """
from gristmill import loaders
from gristmill.loaders.torch_dataset import StreamingDataLoader, StreamingDataset
from gristmill.pipeline.format import ShardWriter
out = sys.argv[2]
writer = ShardWriter(out, shard_bytes=20_000, row_group_bytes=4_000)
writer.write([{"id": f"doc-{i}", "text": f"document {i} " * (1 + i % 40)} for i in range(500)])
writer.commit()
streamed = [i for batch in loaders.StreamingLoader(out, batch_size=16, columns=["id"], seed=3) for i in batch["id"]]
loader = StreamingDataLoader(StreamingDataset(out, batch_size=16, columns=["id"], seed=3), num_workers=1)
through_torch = [i for batch in loader for i in batch["id"]]
assert sorted(streamed) == sorted(through_torch) == sorted(f"doc-{i}" for i in range(500)), len(streamed)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
print("streamed", len(streamed), "heavy", heavy)
"""
    result = without(HEAVY, code, str(tmp_path / "corpus"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["streamed", "500", "heavy", "[]"]


def test_the_command_line_names_the_missing_extra(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"text": "one document"}\n')
    run_cli = "from gristmill.pipeline.cli import main\nsys.exit(main(sys.argv[2:]))\n"

    dedup = without(("ray",), run_cli, "dedup", str(source), "-o", str(tmp_path / "out"))
    assert dedup.returncode == 2, dedup.stderr[-3000:]
    assert dedup.stderr.startswith("gristmill dedup needs the 'dedup' extra: pip install 'gristmill[dedup]'")
    assert "Traceback" not in dedup.stderr
    crawl = without(("aiohttp",), run_cli, "crawl", str(source), "-o", str(tmp_path / "crawl"))
    assert crawl.returncode == 2, crawl.stderr[-3000:]
    assert crawl.stderr.startswith("gristmill crawl needs the 'crawl' extra: pip install 'gristmill[crawl]'")

    # the commands that read a corpus work on the base install
    corpus = tmp_path / "corpus"
    write = f"from gristmill.pipeline.format import ShardWriter\nw = ShardWriter({str(corpus)!r})\n" \
            "w.write([{'id': 'a', 'text': 'x'}])\nw.commit()\n"
    assert without(HEAVY, write).returncode == 0
    inspect = without(HEAVY, run_cli, "inspect", str(corpus), "--verify", "--json")
    assert inspect.returncode == 0, inspect.stderr[-3000:]
    assert '"ok": true' in inspect.stdout


def test_the_python_api_names_the_missing_extra(tmp_path: Path) -> None:
    """Each optional package a Python entry point loads, when missing: its ``gristmill[...]`` named."""
    (tmp_path / "tokenizer.json").write_text("{}")
    code = """
import pyarrow as pa
from gristmill.loaders import FileTokenizer, StreamingLoader
from gristmill.pipeline.format import write_corpus
calls = {"torch": lambda: __import__("gristmill.loaders.torch_dataset"),
         "tokenizers": lambda: FileTokenizer(sys.argv[2]),
         "s3 loader": lambda: StreamingLoader("s3://bucket/corpus"),
         "s3 writer": lambda: write_corpus(pa.table({"text": ["a"]}), "s3://bucket/out")}
for name, call in calls.items():
    try:
        call()
    except ModuleNotFoundError as exc:
        print(name, "|", exc)
"""
    result = without(("torch", "tokenizers", "s3fs"), code, str(tmp_path / "tokenizer.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    said = dict(line.split(" | ", 1) for line in result.stdout.splitlines())
    assert said == {
        "torch": "gristmill.loaders.torch_dataset needs torch, which is not installed: pip install 'gristmill[torch]'",
        "tokenizers": "FileTokenizer needs tokenizers, which is not installed: pip install 'gristmill[tokenizers]'",
        "s3 loader": "s3://bucket/corpus: s3:// needs s3fs, which is not installed: pip install 'gristmill[s3]'",
        "s3 writer": "s3://bucket/out: s3:// needs s3fs, which is not installed: pip install 'gristmill[s3]'"}


def test_help_imports_no_command_and_version_comes_from_the_metadata() -> None:
    code = """
from gristmill.pipeline.cli import main
try:
    main(sys.argv[2:])
except SystemExit:
    pass
print("LOADED", sorted(m for m in ("pyarrow", "numpy", "ray", "aiohttp", "gristmill.pipeline.format", "tqdm") if m in sys.modules))
from gristmill.pipeline.cli import COMMANDS
print("COMMANDS", sorted(name for name, (module, _) in COMMANDS.items() if module in sys.modules))
"""
    top = without((), code, "--help")
    assert "inspect" in top.stdout and "dedup" in top.stdout
    assert "LOADED []" in top.stdout and "COMMANDS []" in top.stdout
    stats = without((), code, "stats", "--help")
    assert stats.stdout.startswith("usage: gristmill stats") and "COMMANDS ['stats']" in stats.stdout
    from importlib.metadata import version

    shown = subprocess.run([sys.executable, "-m", "gristmill.pipeline.cli", "--version"], cwd=REPO, capture_output=True,
                           text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.strip() == f"gristmill {version('gristmill')}"


def test_base_dependencies_leave_out_the_heavy_packages() -> None:
    project = _pyproject()["project"]
    base = _requirement_names(project["dependencies"])
    assert base.isdisjoint(HEAVY), base & set(HEAVY)
    extras = project["optional-dependencies"]
    assert {"crawl", "dedup", "serve", "all"} <= set(extras)
    assert extras["all"] == ["gristmill[crawl,dedup,serve]"]
    assert "gristmill[all]" in extras["cluster"]  # deploy/ images install .[s3,cluster] and run every command
    assert {"ray", "numba"} <= _requirement_names(extras["dedup"])
    assert {"aiohttp", "lxml", "trafilatura"} <= _requirement_names(extras["crawl"])


def _third_party_imports() -> dict[str, set[str]]:
    """Every top-level module our packages import that is neither ours nor the standard library,
    with the files that import it."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def test_every_imported_package_is_declared() -> None:
    project = _pyproject()["project"]
    declared = _requirement_names(project["dependencies"])
    for name, requirements in project["optional-dependencies"].items():
        if name != "test":  # what the tests use is not what gristmill imports
            declared |= _requirement_names(requirements)
    owners = packages_distributions()
    missing = {}
    for module, files in _third_party_imports().items():
        distributions = {_normalise(d) for d in owners.get(module, [module])}
        if module == "tomli":  # the Python 3.10 fallback of tomllib
            distributions = {"tomli"}
        if not distributions & declared:
            missing[module] = sorted(files)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_every_package_ships_py_typed() -> None:
    data = _pyproject()["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["*"]
    for package in PACKAGES:
        assert (REPO / package / "py.typed").is_file(), package
