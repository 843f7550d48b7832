"""Silent corruption: one flipped byte in a data page of a real corpus shard.

Without page checksums a flip inside zstd-compressed text often decodes, to altered text. Every shard
writer now stores a CRC per page and every reader verifies it, so the promise is: whatever byte of
the text column is flipped, the loader raises a LoaderError naming the shard, ``Corpus.read_shard``
a CorpusError naming it, and the dedup job's Parquet input rejects the damaged row group as
``corrupt``; none of them ever hands out altered text.
"""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_format import make_documents

from gristmill.loaders import StreamingLoader
from gristmill.loaders.blocks import LoaderError
from gristmill.pipeline.format import Corpus, CorpusError, ShardWriter
from gristmill.pipeline.job.inputs import Doc, ReadOptions, Reject, read_file, resolve_inputs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, list[str], tuple[int, int]]:
    """A one-shard corpus: its folder, the shard's pristine bytes, its texts, and the byte range of the
    text column's data pages."""
    root = tmp_path_factory.mktemp("checksums") / "corpus"
    docs = make_documents(300)
    with ShardWriter(str(root), shard_bytes=64 << 20, row_group_bytes=64 << 20) as writer:
        writer.write(docs)
    writer.commit(stats={})
    [shard] = Corpus.open(str(root)).shards
    path = root / shard.path
    metadata = pq.ParquetFile(path).metadata
    column = metadata.row_group(0).column(metadata.schema.to_arrow_schema().get_field_index("text"))
    start = column.data_page_offset
    return root, path.read_bytes(), [d["text"] for d in docs], (start, start + column.total_compressed_size)


def shard_file(root: Path) -> Path:
    return root / Corpus.open(str(root)).shards[0].path


def flipped(pristine: bytes, at: int, mask: int) -> bytes:
    data = bytearray(pristine)
    data[at] ^= mask
    return bytes(data)


def test_shards_carry_page_checksums_without_which_a_flip_decodes_to_altered_text(corpus) -> None:
    """The reason for the guard: unverified, some single flip in the text pages decodes cleanly to
    other text; verified, that same flip is an error."""
    root, pristine, texts, (start, end) = corpus
    for at in range(start + (end - start) // 2, end):
        damaged = flipped(pristine, at, 0x01)
        try:
            decoded = pq.read_table(io.BytesIO(damaged), columns=["text"]).column("text").to_pylist()
        except (OSError, pa.ArrowException):  # a flip the decoder itself notices
            continue
        if decoded != texts:
            break
    else:
        pytest.fail("no flip decoded to altered text; the test shard no longer shows the hazard")
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.read_table(io.BytesIO(damaged), columns=["text"], page_checksum_verification=True)


def loader_texts(root: Path) -> list[str]:
    loader = StreamingLoader(str(root), batch_size=64, shuffle=False, columns=("text",))
    return [t for batch in loader for t in batch["text"]]


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data(), mask=st.integers(1, 255))
def test_no_reader_hands_out_altered_text(corpus, data: st.DataObject, mask: int) -> None:
    root, pristine, texts, (start, end) = corpus
    at = data.draw(st.integers(start, end - 1), label="flipped byte")
    path = shard_file(root)
    path.write_bytes(flipped(pristine, at, mask))
    try:
        try:
            assert sorted(loader_texts(root)) == sorted(texts)
        except LoaderError as exc:
            assert str(path) in str(exc)
        try:
            assert Corpus.open(str(root)).read_shard(Corpus.open(str(root)).shards[0])["text"].to_pylist() == texts
        except CorpusError as exc:
            assert str(path) in str(exc)
        [item] = resolve_inputs([str(path)])
        records = list(read_file(item, ReadOptions()))
        assert [r.text for r in records if isinstance(r, Doc)] == texts[:len([r for r in records if isinstance(r, Doc)])]
        rejected = [r for r in records if isinstance(r, Reject)]
        assert all(r.kind == "corrupt" and str(path) in r.source for r in rejected)
        assert sum(r.count for r in rejected) + len(records) - len(rejected) == len(texts)
    finally:
        path.write_bytes(pristine)
