"""Before any work on a cluster of several nodes: every local path the job reads or writes must be one
that every node sees, or the job is refused naming it.

Why: nodes share no disk unless the operator mounted one. An input folder only the head node had
cost its documents with exit 0; a local ``-o`` ran the read stage, then died in the next one with a
raw ``FileNotFoundError``. Object storage URLs are not checked (every node reaches them); a local
path is checked from a task pinned to each alive node: an input file by its size, a folder the job
writes by a marker file the driver writes there and removes after.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from typing import Any

from gristmill.pipeline.format import MANIFEST_NAME, open_fs
from gristmill.pipeline.job.config import DedupConfig, DedupError
from gristmill.pipeline.job.inputs import InputFile

MARKER_PREFIX = ".gristmill-node-check-"


def is_local(url: str, storage_options: dict[str, Any]) -> bool:
    fs, _ = open_fs(url, storage_options)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _probes(config: DedupConfig, files: Sequence[InputFile]) -> tuple[list[tuple[str, str, int]], list[str]]:
    """(flag, path, size) for one input file per local folder, each local ``--against`` corpus's manifest,
    and a marker in each local folder the job writes (created, as are missing folders, which are listed
    second, deepest first, for removal)."""
    options = config.storage_options
    probes: list[tuple[str, str, int]] = []
    folders: set[str] = set()
    for item in files:
        if is_local(item.url, options):
            _, path = open_fs(item.url, options)
            if os.path.dirname(path) not in folders:
                folders.add(os.path.dirname(path))
                probes.append(("input", path, item.size))
    for url in config.against:  # read only: its manifest stands for it
        if is_local(url, options):
            _, folder = open_fs(url, options)
            manifest = os.path.join(folder, MANIFEST_NAME)
            probes.append(("--against", manifest, os.path.getsize(manifest)))
    writes = {"-o": config.output, "--removed": config.removed, "--work-dir": config.work_dir}
    marked, created = _markers(writes, options)
    return probes + marked, created


def _markers(writes: dict[str, str | None], options: dict[str, Any]) -> tuple[list[tuple[str, str, int]], list[str]]:
    """A marker file (flag, path, size) in each local folder of ``writes`` (flag -> URL), and the folders
    this made (deepest first, for removal)."""
    probes: list[tuple[str, str, int]] = []
    created: list[str] = []
    for flag, url in writes.items():
        if not url or not is_local(url, options):
            continue
        _, folder = open_fs(url, options)
        missing = folder
        while missing and not os.path.exists(missing):
            created.append(missing)
            missing = os.path.dirname(missing)
        os.makedirs(folder, exist_ok=True)
        marker = os.path.join(folder, f"{MARKER_PREFIX}{uuid.uuid4().hex}")
        with open(marker, "wb") as handle:
            handle.write(b"gristmill")
        probes.append((flag, marker, len(b"gristmill")))
    return probes, created


def _unseen(probes: list[tuple[str, str, int]]) -> list[int]:
    """On one node: the probes whose file is missing there or of another size."""
    missing = []
    for index, (_, path, size) in enumerate(probes):
        try:
            if os.stat(path).st_size != size:
                missing.append(index)
        except OSError:
            missing.append(index)
    return missing


def check_local_paths(ray: Any, config: DedupConfig, files: Sequence[InputFile]) -> None:
    """Refuse (``DedupError``, one line) a local path that some alive node of the connected Ray cluster
    does not see; nothing to check on one node."""
    if _alive(ray) >= 2:
        _refuse_unseen(ray, *_probes(config, files), DedupError)


def check_written_folders(ray: Any, writes: dict[str, str | None], options: dict[str, Any]) -> None:
    """Refuse (ValueError, one line) a local folder of ``writes`` (flag -> URL) that some alive node of
    the connected Ray cluster does not see (the crawl's output and state); nothing to check on one node."""
    if _alive(ray) >= 2:
        _refuse_unseen(ray, *_markers(writes, options), ValueError)


def _alive(ray: Any) -> int:
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def _refuse_unseen(ray: Any, probes: list[tuple[str, str, int]], created: list[str], error: type[Exception]) -> None:
    """Look for every probe from a task pinned to each alive node; ``error`` names the first one missing."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if not probes:
        return
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    try:
        look = ray.remote(num_cpus=0, max_retries=0)(_unseen)
        refs = [look.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                .remote(probes) for node in nodes]
        for node, unseen in zip(nodes, ray.get(refs), strict=True):
            if unseen:
                flag, path, _ = probes[unseen[0]]
                shown = path if flag == "input" else os.path.dirname(path)
                raise error(f"{flag} {shown} is a local path that node {node['NodeManagerAddress']} "
                            f"({node['NodeID'][:12]}) of this {len(nodes)}-node Ray cluster does not see; use "
                            "object storage (s3://...) or a folder every node mounts")
    finally:
        for _, path, _ in probes:
            if os.path.basename(path).startswith(MARKER_PREFIX):
                os.remove(path)
        for folder in created:  # deepest first: only what this check made, and only while empty
            try:
                os.rmdir(folder)
            except OSError:
                break
