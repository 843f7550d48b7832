"""Tasks sent only their own arguments: the job context goes into Ray's object store once per run, and a
read task of a 100k-file plan is sent a few KB, not the plan."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import pytest

from gristmill.pipeline.job import DedupConfig
from gristmill.pipeline.job.config import index_params
from gristmill.pipeline.job.inputs import InputFile, plan_splits
from gristmill.pipeline.job.tasks import Job, make_runner, task_arguments
from gristmill.pipeline.job.workdir import WorkDir

pytestmark = pytest.mark.timeout(240)


def test_a_read_task_of_a_100k_file_plan_is_sent_a_few_kb(ray_local: None, tmp_path: Path) -> None:
    import ray

    files = [InputFile(f"s3://bucket/crawl/2026-11/segment-{i // 1000:04d}/part-{i:06d}.jsonl", "jsonl", None,
                       3_000_000, "s3://bucket/crawl/2026-11/") for i in range(100_000)]
    config = DedupConfig(inputs=[f.url for f in files], output=str(tmp_path / "out"))
    splits = plan_splits(files, config.split_bytes)
    assert len(pickle.dumps(splits)) > 1 << 20  # the plan is megabytes: the driver keeps it
    values = {"config": dataclasses.replace(config, inputs=[]), "params": index_params(config), "index_files": [],
              "work": WorkDir(str(tmp_path / "work")), "fingerprint": "f" * 64, "num_partitions": 64,
              "num_splits": len(splits)}
    job = Job(**{f.name: values[f.name] for f in dataclasses.fields(Job) if f.init and f.name in values})  # as the driver builds it
    biggest = max(splits, key=lambda s: len(pickle.dumps(s)))
    arguments = task_arguments((job, biggest))
    assert isinstance(arguments[0], ray.ObjectRef) and arguments[1] is biggest
    shipped = len(ray.cloudpickle.dumps(arguments))
    assert shipped < 16 * 1024
    assert task_arguments((job, 7))[0] == arguments[0]  # put once, one reference for every task
    assert len(pickle.dumps(job)) < 16 * 1024  # the shared context itself stays small
    # a real task: Ray hands it the context the reference names, and its own split
    received = make_runner(ray)(lambda job, split: (job.fingerprint, job.num_splits, split), [(job, biggest)])
    assert received == [("f" * 64, len(splits), biggest)]
