"""Progress inside the dedup stages: as each Ray task finishes, the rows and input bytes it did; plain
periodic lines when stderr is not a terminal, nothing with --quiet."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from test_pipeline_data import documents, write_jsonl

from gristmill.pipeline.cli import main
from gristmill.pipeline.job import DedupConfig, job_stages, run_dedup
from gristmill.pipeline.report.progress import StageProgress

pytestmark = pytest.mark.timeout(240)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_lines_come_at_most_every_interval_with_rate_and_eta() -> None:
    stream, clock = io.StringIO(), _Clock()
    progress = StageProgress("dedup", ("read", "exact"), stream=stream, interval=10.0, clock=clock)
    progress.begin("read", total_bytes=400 * 2**20)
    for second in range(1, 31):  # a task of 10 MiB and 1,000 documents every second
        clock.now = float(second)
        progress.task_done({"docs": 1000, "bytes": 10 * 2**20})
    progress.end("read")
    lines = stream.getvalue().splitlines()
    assert lines[:3] == [
        "dedup [1/2] read: 100.0 MiB of 400.0 MiB (25%), 10 tasks, 10,000 docs, 10.0 MiB/s, ETA 0:30",
        "dedup [1/2] read: 200.0 MiB of 400.0 MiB (50%), 20 tasks, 20,000 docs, 10.0 MiB/s, ETA 0:20",
        "dedup [1/2] read: 300.0 MiB of 400.0 MiB (75%), 30 tasks, 30,000 docs, 10.0 MiB/s, ETA 0:10",
    ]
    assert lines[3] == "dedup [1/2] read: done in 0:30 (30 tasks, 30,000 docs, 300.0 MiB)"
    progress.end("exact", resumed=True)
    assert stream.getvalue().splitlines()[-1] == "dedup [2/2] exact: finished by an earlier run"


def test_quiet_prints_nothing() -> None:
    stream = io.StringIO()
    progress = StageProgress("dedup", ("read",), quiet=True, stream=stream, interval=0.0)
    progress.begin("read", 100)
    progress.task_done({"docs": 1, "bytes": 50})
    progress.end("read")
    assert stream.getvalue() == ""


def test_a_run_with_several_splits_reports_progress_inside_the_read_stage(ray_local: None, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for i in range(4):
        write_jsonl(tmp_path / "in" / f"{i}.jsonl", documents(6, seed=i), prefix=f"f{i}-")
    config = DedupConfig(inputs=[str(tmp_path / "in")], output=str(tmp_path / "out"), split_bytes=100_000,
                         num_partitions=2)
    stream = io.StringIO()
    stats = run_dedup(config, progress=StageProgress("dedup", job_stages(config), stream=stream, interval=0.0))
    assert stats["splits"] >= 4
    lines = stream.getvalue().splitlines()
    done = next(i for i, line in enumerate(lines) if re.match(r"dedup \[1/\d+\] read: done", line))
    inside = [line for line in lines[:done] if line.startswith("dedup [1/")]
    assert len(inside) > 1  # several updates before the stage ended
    total = sum((tmp_path / "in" / f"{i}.jsonl").stat().st_size for i in range(4))
    assert all(" of " in line and "ETA" in line and "docs" in line for line in inside)
    assert inside[-1].split(" of ")[1].startswith(f"{total / 1024:.1f} KiB")  # the input's bytes are the total
    docs = stats["documents"]["input"] - stats["documents"]["rejected"]
    assert re.search(rf"\((\d+) tasks, {docs:,} docs, ", lines[done])  # a read task per split, a count per cut file
    assert int(re.search(r"\((\d+) tasks", lines[done]).group(1)) >= stats["splits"]
    assert all(any(f"] {stage}: done in" in line for line in lines) for stage in job_stages(config))


def test_the_command_prints_stage_lines_to_a_log_and_nothing_with_quiet(
        ray_local: None, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write_jsonl(tmp_path / "in.jsonl", documents(8), prefix="x")
    assert main(["dedup", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out")]) == 0
    err = capsys.readouterr().err
    assert re.search(r"^dedup \[1/\d+\] read: done in \d+:\d\d \(1 tasks, ", err, re.M)
    assert main(["dedup", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "again"), "-q"]) == 0
    assert capsys.readouterr().err == ""


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_each_stage_gets_a_bar_of_its_bytes() -> None:
    stream = _Terminal()
    progress = StageProgress("dedup", ("read", "exact"), stream=stream)
    progress.begin("read", total_bytes=4 * 2**20)
    for _ in range(4):
        progress.task_done({"docs": 10, "bytes": 2**20})
    progress.end("read")
    progress.begin("exact")
    progress.task_done({})
    progress.end("exact")
    shown = stream.getvalue()
    assert "dedup [1/2] read:   0%|" in shown and "/4.00M [" in shown  # a bar of the stage's bytes
    assert "dedup [2/2] exact: " in shown and " tasks/s]" in shown  # unknown bytes: a count of tasks
    done = [part for part in re.split(r"[\r\n]", shown) if "done in" in part]
    assert done == ["dedup [1/2] read: done in 0:00 (4 tasks, 40 docs, 4.0 MiB)",
                    "dedup [2/2] exact: done in 0:00 (1 tasks)"]
