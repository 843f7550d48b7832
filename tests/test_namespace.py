"""The distribution installs its four folders as ``gristmill.pipeline``, ``gristmill.crawlers``,
``gristmill.dedup`` and ``gristmill.loaders``: a training repository's own ``pipeline.py`` or
``dedup.py`` (or PyPI's ``pipeline`` distribution) cannot shadow them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHADOWS = ("pipeline", "dedup", "loaders", "crawlers")


def test_a_users_pipeline_and_dedup_modules_shadow_nothing(tmp_path: Path) -> None:
    for name in SHADOWS:  # a user's modules that break whoever imports them by the bare name
        (tmp_path / f"{name}.py").write_text(f"raise ImportError('the user\\'s own {name}.py was imported')\n")
    code = ("from gristmill.loaders import StreamingLoader\n"
            "from gristmill.pipeline.format import Corpus\n"
            "import gristmill.dedup, gristmill.crawlers.urls, gristmill.pipeline.cli\n"
            "print(gristmill.pipeline.cli.__file__)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).resolve() == REPO / "pipeline" / "cli.py"
    command = subprocess.run([sys.executable, "-m", "gristmill.pipeline.cli", "--version"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert command.returncode == 0 and "gristmill" in command.stdout + command.stderr, command.stderr
