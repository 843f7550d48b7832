"""The four top-level folders install as ``gristmill.pipeline``, ``gristmill.crawlers``, ``gristmill.dedup``
and ``gristmill.loaders``, so nothing named ``pipeline`` or ``dedup`` in a user's folder or environment
can shadow them (``gristmill`` itself is a namespace). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

FOLDERS = ("pipeline", "crawlers", "dedup", "loaders")

setup(
    packages=[f"gristmill.{name}" for folder in FOLDERS for name in (folder, *(f"{folder}.{sub}" for sub in find_packages(folder)))],
    package_dir={f"gristmill.{folder}": folder for folder in FOLDERS},
)
