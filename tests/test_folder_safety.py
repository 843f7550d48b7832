"""Nothing a job writes overlaps what it reads or another output; a different job never silently replaces
a corpus; files of an earlier job go only after the new manifest commits; every manifest reader refuses
paths that leave the corpus folder (on a real local Ray, real Parquet files)."""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pipeline_data import documents, write_jsonl

from gristmill.pipeline.cli import main
from gristmill.pipeline.format import CORPUS_SCHEMA, Corpus, CorpusError, ShardWriter, member_path
from gristmill.pipeline.job import DedupConfig, DedupError, run_dedup
from gristmill.pipeline.job.inputs import InputError

pytestmark = pytest.mark.timeout(240)


@pytest.fixture()
def raw(tmp_path: Path) -> Path:
    """An input folder of 60 documents with exact and near copies among them."""
    folder = tmp_path / "raw"
    folder.mkdir()
    texts = documents(40)
    write_jsonl(folder / "a.jsonl", texts + texts[:10] + [t + " extra words here" for t in texts[10:20]])
    return folder


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


# -- overlapping folders ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["removed=output", "removed inside output", "output inside removed",
                                    "output inside input", "input inside output", "output = input",
                                    "against = output", "against inside input"])
def test_overlapping_folders_are_refused_before_any_work(raw: Path, tmp_path: Path, layout: str) -> None:
    out, removed, against = tmp_path / "out", tmp_path / "removed", None
    inputs = [str(raw)]
    if layout == "removed=output":
        removed = out
    elif layout == "removed inside output":
        removed = out / "removed"
    elif layout == "output inside removed":
        out = removed / "kept"
    elif layout == "output inside input":
        out = raw / "corpus"
    elif layout == "input inside output":
        out = tmp_path
    elif layout == "output = input":
        out = raw
    elif layout == "against = output":
        against = out
    elif layout == "against inside input":
        against = raw / "old"
    before = _files(tmp_path)
    with pytest.raises(DedupError, match="overlap|inside"):
        run_dedup(DedupConfig(inputs=inputs, output=str(out), removed=str(removed),
                              against=str(against) if against else None))
    assert _files(tmp_path) == before  # refused before the work folder or any shard was made


def test_overlap_through_the_command_line_exits_2_naming_both_flags(raw: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(["dedup", str(raw), "-o", str(out), "--removed", str(out)]) == 2
    err = capsys.readouterr().err
    assert "-o" in err and "--removed" in err and "overlap" in err
    assert not out.exists()


def test_a_symlinked_output_is_seen_through(raw: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(raw)
    with pytest.raises(DedupError, match="inside"):
        run_dedup(DedupConfig(inputs=[str(raw)], output=str(link / "corpus")))


# -- a different job into a committed corpus; stale files; idempotent re-runs -----------------------
def test_a_different_job_is_refused_then_replaces_with_overwrite_and_stale_files_go(
        ray_local: None, raw: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, removed = tmp_path / "out", tmp_path / "removed"
    first = run_dedup(DedupConfig(inputs=[str(raw)], output=str(out), removed=str(removed), num_partitions=2))
    old_files, old_removed = _files(out), _files(removed)
    created = Corpus.open(str(out)).manifest.created

    # the same command again: an idempotent resume that finds the job complete and changes nothing
    mtimes = {name: os.stat(out / name).st_mtime_ns for name in old_files}
    assert run_dedup(DedupConfig(inputs=[str(raw)], output=str(out), removed=str(removed), num_partitions=2)) == first
    assert {name: os.stat(out / name).st_mtime_ns for name in _files(out)} == mtimes

    other = DedupConfig(inputs=[str(raw)], output=str(out), removed=str(removed), num_partitions=2, threshold=0.5)
    with pytest.raises(DedupError, match="different job.*--overwrite"):
        run_dedup(other)
    assert _files(out) == old_files and Corpus.open(str(out)).manifest.created == created

    other.overwrite = True
    second = run_dedup(other)
    corpus = Corpus.open(str(out))
    assert second["params"]["threshold"] == 0.5 and corpus.stats == second
    assert all(result.ok for result in corpus.verify())
    index = corpus.manifest.extra["signature_index"]
    listed = {s.path for s in corpus.shards} | set(index["files"]) | set(index["band_files"]) | set(
        corpus.manifest.extra["stats_table"]["files"]) | set(corpus.manifest.extra["pairs"]["files"]) | {
        corpus.manifest.extra["rejects"], "_manifest.json", corpus.manifest.blocks_file["path"]}
    # the earlier job's shards, _index, _rejects and _stats files are retired, kept for readers of its manifest
    retired = set(json.loads((out / "_retired.json").read_text())["retired"])
    assert _files(out) == listed | retired | {"_retired.json"}
    assert retired == old_files - {"_manifest.json"} - {Corpus.open(str(out)).manifest.blocks_file["path"]} - {
        f for f in old_files if f.startswith("_blocks/")}
    # gristmill gc --now takes them away, naming each one and the bytes freed
    sizes = {name: (out / name).stat().st_size for name in retired}
    assert main(["gc", str(out), "--now"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in retired) and f"({sum(sizes.values()):,} bytes)" in printed
    assert _files(out) == listed
    assert main(["gc", str(removed), "--now"]) == 0
    removed_corpus = Corpus.open(str(removed))
    assert _files(removed) == {s.path for s in removed_corpus.shards} | {"_manifest.json",
                                                                         removed_corpus.manifest.blocks_file["path"]}
    assert not (old_removed - {"_manifest.json"}) & _files(removed)
    # kept and removed shards never share a name
    assert not {s.path for s in corpus.shards} & {s.path for s in removed_corpus.shards}


def test_stale_files_stay_until_the_new_manifest_commits(ray_local: None, raw: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import gristmill.pipeline.job.driver as job

    out = tmp_path / "out"
    run_dedup(DedupConfig(inputs=[str(raw)], output=str(out), num_partitions=2))
    old_files = _files(out)
    real_write = job.write_manifest

    def crash_on_commit(url: str, *args: object, **kwargs: object) -> object:
        if url == str(out):
            raise OSError("disk full (simulated) while committing")
        return real_write(url, *args, **kwargs)

    monkeypatch.setattr(job, "write_manifest", crash_on_commit)
    with pytest.raises(OSError, match="simulated"):
        run_dedup(DedupConfig(inputs=[str(raw)], output=str(out), num_partitions=2, threshold=0.6, overwrite=True))
    corpus = Corpus.open(str(out))  # the earlier corpus is whole: every file it lists is still there
    assert corpus.stats["params"]["threshold"] == 0.8 and all(r.ok for r in corpus.verify())
    assert old_files <= _files(out)


def test_a_folder_with_foreign_files_is_refused_and_overwrite_leaves_them(ray_local: None, raw: Path,
                                                                          tmp_path: Path) -> None:
    out = tmp_path / "home"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(DedupError, match="not empty and holds no gristmill corpus"):
        run_dedup(DedupConfig(inputs=[str(raw)], output=str(out), num_partitions=2))
    run_dedup(DedupConfig(inputs=[str(raw)], output=str(out), num_partitions=2, overwrite=True))
    assert (out / "notes.txt").read_text() == "mine"  # cleaning touches only files of ours


# -- path containment ---------------------------------------------------------------------------------
ESCAPES = ["../elsewhere/x.parquet", "/etc/passwd", "s3://other-bucket/x.parquet", "a/../../x.parquet",
           "./x.parquet", "a//x.parquet", "..", "C:\\x.parquet", "x.parquet\x00", "", "file:///etc/passwd"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet=st.sampled_from("ab./\\:~\x00%"), max_size=12), st.text(max_size=12),
                 st.sampled_from(ESCAPES), st.integers(), st.none(), st.lists(st.text(max_size=3), max_size=2)))
def test_member_path_never_leaves_the_root(relative: object) -> None:
    root = "/corpus/root"
    try:
        path = member_path(root, relative, "m.json", "shard path")
    except CorpusError as exc:
        assert "m.json" in str(exc)
        return
    assert posixpath.normpath(path).startswith(root + "/") and posixpath.normpath(path) == path


@pytest.fixture()
def corpus_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    writer = ShardWriter(str(folder), CORPUS_SCHEMA, row_group_bytes=4096, shard_bytes=8192)
    writer.write(pa.Table.from_pylist([{"id": f"d{i}", "text": f"document {i} " * 20} for i in range(50)],
                                      schema=CORPUS_SCHEMA))
    writer.commit()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "x.parquet").write_bytes((folder / writer.shards[0].path).read_bytes())
    return folder


def _tamper(folder: Path, change: object) -> None:
    manifest = json.loads((folder / "_manifest.json").read_text())
    change(manifest)
    (folder / "_manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("escape", ESCAPES)
def test_every_reader_refuses_a_shard_path_that_escapes(corpus_dir: Path, escape: str,
                                                        capsys: pytest.CaptureFixture) -> None:
    from gristmill.loaders import StreamingLoader

    _tamper(corpus_dir, lambda m: m["shards"][0].__setitem__("path", escape))
    with pytest.raises(CorpusError, match="shard path"):
        Corpus.open(str(corpus_dir))
    with pytest.raises(CorpusError, match="manifest"):
        StreamingLoader(str(corpus_dir), batch_size=2)
    assert main(["inspect", str(corpus_dir), "--verify"]) == 2
    assert "shard path" in capsys.readouterr().err
    with pytest.raises(InputError, match="shard path"):  # the corpus as dedup input: refused at planning
        run_dedup(DedupConfig(inputs=[str(corpus_dir)], output=str(corpus_dir.parent / "out")))


def test_a_symlinked_shard_pointing_outside_is_refused(corpus_dir: Path) -> None:
    shard = next(corpus_dir.glob("part-*.parquet"))
    shard.unlink()
    shard.symlink_to(corpus_dir.parent / "elsewhere" / "x.parquet")
    with pytest.raises(CorpusError, match="resolves outside"):
        Corpus.open(str(corpus_dir))


@pytest.mark.parametrize("field,value", [("rows", -1), ("bytes", 10), ("footer_length", 1)])
def test_impossible_shard_numbers_are_refused(corpus_dir: Path, field: str, value: object) -> None:
    _tamper(corpus_dir, lambda m: m["shards"][0].__setitem__(field, value))
    with pytest.raises(CorpusError, match="inconsistent sizes"):
        Corpus.open(str(corpus_dir))


def test_index_files_in_extra_are_contained_for_serve_and_against(ray_local: None, raw: Path,
                                                                  tmp_path: Path) -> None:
    from gristmill.pipeline.format.signature_index import load_index

    out = tmp_path / "out"
    run_dedup(DedupConfig(inputs=[str(raw)], output=str(out), num_partitions=2))
    index_file = next((out / "_index").glob("*.parquet"))
    (tmp_path / "stolen.parquet").write_bytes(index_file.read_bytes())
    _tamper(out, lambda m: m["extra"]["signature_index"]["files"].append("../stolen.parquet"))
    with pytest.raises(CorpusError, match="signature index file '../stolen.parquet'"):
        load_index(str(out))
    assert main(["serve", "--index", str(out), "--state", str(tmp_path / "state"), "--port", "0"]) == 2
    with pytest.raises(DedupError, match="signature index file"):
        run_dedup(DedupConfig(inputs=[str(raw)], output=str(tmp_path / "next"), against=str(out)))


def test_the_removed_corpus_a_manifest_names_must_name_the_same_job_back(ray_local: None, raw: Path,
                                                                         tmp_path: Path) -> None:
    from gristmill.pipeline.report.duplicates import open_removed

    run_dedup(DedupConfig(inputs=[str(raw)], output=str(tmp_path / "a"), removed=str(tmp_path / "a-removed"),
                          num_partitions=2))
    run_dedup(DedupConfig(inputs=[str(raw)], output=str(tmp_path / "b"), removed=str(tmp_path / "b-removed"),
                          num_partitions=2, threshold=0.6))
    assert open_removed(Corpus.open(str(tmp_path / "a"))).url == str(tmp_path / "a-removed")
    _tamper(tmp_path / "a", lambda m: m["extra"]["job"].__setitem__("removed", str(tmp_path / "b-removed")))
    with pytest.raises(CorpusError, match="written by another job"):
        open_removed(Corpus.open(str(tmp_path / "a")))
    # named explicitly by the user, it is used as asked
    assert open_removed(Corpus.open(str(tmp_path / "a")), str(tmp_path / "b-removed")).num_rows > 0


def test_a_folder_walk_reads_a_nested_corpus_by_its_manifest_only(ray_local: None, raw: Path,
                                                                  tmp_path: Path) -> None:
    """An earlier corpus (with its _index, _rejects and an unlisted stray shard) inside an input folder
    counts its listed rows once; a glob over it keeps only the shards its manifest lists."""
    from gristmill.pipeline.job.inputs import resolve_inputs

    first = tmp_path / "first"
    run_dedup(DedupConfig(inputs=[str(raw)], output=str(first), num_partitions=2))
    corpus = Corpus.open(str(first))
    stray = first / "part-99999-stray-00000.parquet"
    stray.write_bytes((first / corpus.shards[0].path).read_bytes())
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "more.jsonl").write_text((raw / "a.jsonl").read_text())
    first.rename(bundle / "first")
    found = {f.url: f.rows for f in resolve_inputs([str(bundle)])}
    listed = {str(bundle / "first" / s.path): s.rows for s in corpus.shards}
    assert found == {**listed, str(bundle / "more.jsonl"): None}
    globbed = {f.url for f in resolve_inputs([str(bundle / "first" / "*.parquet")])}
    assert globbed == set(listed)  # neither the stray shard nor _index / _rejects files
    stats = run_dedup(DedupConfig(inputs=[str(bundle)], output=str(tmp_path / "second"), num_partitions=2))
    lines = len((raw / "a.jsonl").read_text().splitlines())
    assert stats["documents"]["input"] == corpus.num_rows + lines
