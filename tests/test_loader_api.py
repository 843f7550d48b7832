"""Small parts of the loader's Python API: sizes with units, len() of the PyTorch adapter, and a missing
optional dependency named by the extra that installs it, as the command line names it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gristmill.loaders import FileTokenizer, StreamingLoader
from tests.test_loader import make_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("api"))
    make_corpus(path, 300, seed=5)
    return path


def test_byte_arguments_take_units_as_the_command_line_does(corpus: str) -> None:
    loader = StreamingLoader(corpus, cache_bytes="10GB", prefetch_bytes="64MiB", coalesce_bytes="0")
    assert (loader.cache_bytes, loader.prefetch_bytes, loader.coalesce_bytes) == (10**10, 64 << 20, 0)
    with pytest.raises(ValueError, match="cache_bytes: 'lots' is not a size"):
        StreamingLoader(corpus, cache_bytes="lots")
    with pytest.raises(ValueError, match="prefetch_bytes must be >= 1"):
        StreamingLoader(corpus, prefetch_bytes="0MiB")
    with pytest.raises(TypeError, match="cache_bytes must be an integer"):
        StreamingLoader(corpus, cache_bytes=1.5)


def test_the_torch_adapter_has_a_length(corpus: str) -> None:
    from gristmill.loaders.torch_dataset import StreamingDataLoader, StreamingDataset

    dataset = StreamingDataset(corpus, batch_size=16, columns=["id"], world_size=1, rank=0)
    loader = StreamingDataLoader(dataset)
    assert len(dataset) == len(loader) == len(dataset.loader) == sum(1 for _ in loader) == 19


def test_a_missing_extra_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; "
                           "import gristmill.loaders.torch_dataset"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "ModuleNotFoundError: gristmill.loaders.torch_dataset needs torch, which is not installed: pip install " \
           "'gristmill[torch]'" in done.stderr
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ModuleNotFoundError, match=r"FileTokenizer needs tokenizers.*'gristmill\[tokenizers\]'"):
        FileTokenizer(str(tmp_path / "tokenizer.json"))
