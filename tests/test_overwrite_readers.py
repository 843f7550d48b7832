"""Readers keep what they opened (pipeline/format/gc.py): a StreamingLoader iterating a corpus while an
``--overwrite`` job commits a new one in its folder reads its epoch to the end, locally and on moto's S3;
``gristmill gc --now`` then reclaims the old files (on a real local Ray, real Parquet files)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_pipeline_data import documents, write_jsonl

from gristmill.loaders import StreamingLoader
from gristmill.pipeline.cli import main
from gristmill.pipeline.format import Corpus, open_fs
from gristmill.pipeline.job import DedupConfig, run_dedup

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize("store", ["local", "s3"])
def test_a_loader_reads_its_epoch_to_the_end_while_an_overwrite_commits(
        ray_local: None, store: str, tmp_path: Path, request: pytest.FixtureRequest,
        capsys: pytest.CaptureFixture[str]) -> None:
    old_texts, new_texts = documents(150, seed=1), documents(90, seed=2)
    write_jsonl(tmp_path / "old.jsonl", old_texts)
    write_jsonl(tmp_path / "new.jsonl", new_texts)
    out, options = str(tmp_path / "out"), {}
    if store == "s3":  # the Ray workers started before the server: they get the credentials explicitly
        out = request.getfixturevalue("s3_bucket") + "/out"
        options = {"key": "testing", "secret": "testing", "client_kwargs": {
            "endpoint_url": request.getfixturevalue("s3_server")["endpoint_url"], "region_name": "us-east-1"}}
    small = {"num_partitions": 2, "shard_bytes": 16 * 1024, "row_group_bytes": 4 * 1024, "storage_options": options}
    run_dedup(DedupConfig(inputs=[str(tmp_path / "old.jsonl")], output=out, **small))
    old = Corpus.open(out, options)
    assert len(old.shards) >= 3  # so the loader still has whole shards to open after the commit
    expected = sorted(old.to_table(["text"])["text"].to_pylist())

    loader = StreamingLoader(out, batch_size=8, shuffle=False, world_size=1, rank=0, prefetch_bytes=1,
                             io_threads=1, max_reads=1, storage_options=options)
    batches = iter(loader)
    seen = list(next(batches)["text"])
    run_dedup(DedupConfig(inputs=[str(tmp_path / "new.jsonl")], output=out, overwrite=True, **small))
    assert Corpus.open(out, options).num_rows != old.num_rows  # the new corpus committed meanwhile
    for batch in batches:
        seen += batch["text"]
    assert sorted(seen) == expected

    fs, root = open_fs(out, options)
    old_shards = [f"{root}/{shard.path}" for shard in old.shards]
    assert all(fs.exists(path) for path in old_shards)
    assert main(["gc", out, "--now"]) == 0
    assert "freed" in capsys.readouterr().out
    fs.invalidate_cache()
    assert not any(fs.exists(path) for path in old_shards)
    assert all(result.ok for result in Corpus.open(out, options).verify())
