"""The input's own columns pass through dedup: name, type and values, into kept and removed shards.

gristmill consumes the text and id columns and its own names (``gristmill.pipeline.format.schemas``); every
other column of a Parquet file (any Arrow type) or a JSONL record reaches the shards, the union over
files with nulls where a file lacks one; two files that disagree on a column's type stop the run
with exit 2 naming the column and both files. Runs on a real local Ray with real Parquet files.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
import re
import string
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gristmill.loaders import StreamingLoader
from gristmill.pipeline.cli import main
from gristmill.pipeline.format import Corpus
from gristmill.pipeline.format.schemas import RESERVED_COLUMNS, SOURCE_COLUMN
from gristmill.pipeline.job import DedupConfig, run_dedup
from gristmill.pipeline.job.extras import ColumnTypes, batch_table
from gristmill.pipeline.job.inputs import Doc
from gristmill.pipeline.job.inputs.records import Extra

WORDS = [f"w{i}" for i in range(400)]


def _text(seed: int) -> str:
    return " ".join(random.Random(seed).choices(WORDS, k=60))


def _rows(n: int, duplicate_every: int = 4) -> list[str]:
    """Texts where every ``duplicate_every``-th is an exact copy of the one before it."""
    texts = []
    for i in range(n):
        texts.append(texts[-1] if i and i % duplicate_every == 0 else _text(i))
    return texts


def _by_id(url: str) -> dict[str, dict]:
    return {row["id"]: row for row in Corpus.open(url).to_table().to_pylist()}


def _user_table(ids: list[str], texts: list[str]) -> pa.Table:
    n = len(ids)
    when = dt.datetime(2024, 5, 1, tzinfo=dt.timezone.utc)
    return pa.table({
        "id": ids, "text": texts,
        "url": [f"https://site{i % 3}.example/p/{i}" for i in range(n)],
        "source": ["pydocs" if i % 2 else "wiki" for i in range(n)],
        "quality": pa.array([i / 10 for i in range(n)], pa.float32()),
        "tokens": pa.array(range(n), pa.int32()),
        "tags": pa.array([[f"t{i}", "x"] for i in range(n)], pa.list_(pa.string())),
        "meta": pa.array([{"lang_score": i * 0.5, "shard": i % 2} for i in range(n)],
                         pa.struct([("lang_score", pa.float64()), ("shard", pa.int64())])),
        "crawled": pa.array([when + dt.timedelta(hours=i) for i in range(n)], pa.timestamp("us", tz="UTC")),
    })


def test_parquet_columns_of_any_type_reach_the_kept_and_removed_shards(ray_local: None, tmp_path: Path) -> None:
    texts = _rows(24)
    table = _user_table([f"d{i}" for i in range(24)], texts)
    (tmp_path / "in").mkdir()
    pq.write_table(table.slice(0, 12), tmp_path / "in" / "a.parquet")
    pq.write_table(table.slice(12), tmp_path / "in" / "b.parquet")
    out, removed = str(tmp_path / "out"), str(tmp_path / "removed")
    run_dedup(DedupConfig(inputs=[str(tmp_path / "in")], output=out, removed=removed, prefer="column:quality",
                          num_partitions=2))

    corpus, gone = Corpus.open(out), Corpus.open(removed)
    for name in ("url", "source", "quality", "tokens", "tags", "meta", "crawled"):
        assert corpus.schema.field(name).type == table.schema.field(name).type, name
        assert gone.schema.field(name).type == table.schema.field(name).type, name
    expected = {row["id"]: row for row in table.to_pylist()}
    kept, lost = _by_id(out), _by_id(removed)
    assert len(kept) + len(lost) == 24 and lost  # the copies went to the removed shards
    for rows in (kept, lost):
        for doc_id, row in rows.items():
            for name in ("url", "source", "quality", "tokens", "tags", "meta", "crawled"):
                assert row[name] == expected[doc_id][name], (doc_id, name)
            assert row[SOURCE_COLUMN] == expected[doc_id]["url"]  # gristmill's own, beside the user's
    # --prefer column:quality kept the higher-quality copy of each pair: the later one
    assert all(f"d{i}" in kept and f"d{i - 1}" in lost for i in range(4, 24, 4))

    loader = StreamingLoader(out, columns=["text", "url", "source", "quality"], batch_size=4, shuffle=False)
    seen = [row for batch in loader for row in zip(batch["url"], batch["source"], batch["quality"], strict=True)]
    assert sorted(seen) == sorted((r["url"], r["source"], r["quality"]) for r in kept.values())


def test_jsonl_keys_pass_through_with_json_types_and_files_union_their_columns(ray_local: None,
                                                                                tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    with open(tmp_path / "in" / "a.jsonl", "w") as handle:
        for i in range(6):
            handle.write(json.dumps({"id": f"a{i}", "text": _text(100 + i), "url": f"https://a.example/{i}",
                                     "score": i, "flag": i % 2 == 0, "meta": {"k": [i, "x"]}}) + "\n")
    with open(tmp_path / "in" / "b.jsonl", "w") as handle:
        for i in range(4):
            handle.write(json.dumps({"id": f"b{i}", "text": _text(200 + i), "score": i + 0.5,
                                     "lang": "en"}) + "\n")
    out = str(tmp_path / "out")
    run_dedup(DedupConfig(inputs=[str(tmp_path / "in")], output=out, num_partitions=2))
    corpus = Corpus.open(out)
    assert corpus.schema.field("score").type == pa.float64()  # ints in one file, floats in the other
    assert corpus.schema.field("flag").type == pa.bool_()
    assert corpus.schema.field("meta").type == pa.string()  # nested values as their JSON text
    rows = _by_id(out)
    assert rows["a3"]["url"] == "https://a.example/3" and rows["a3"][SOURCE_COLUMN] == "https://a.example/3"
    assert rows["a2"]["score"] == 2.0 and rows["a2"]["flag"] is True and json.loads(rows["a2"]["meta"]) == {"k": [2, "x"]}
    assert rows["b1"]["score"] == 1.5 and rows["b1"]["lang"] == "en" and rows["b1"]["url"] is None
    assert rows["a1"]["lang"] is None and rows["b1"]["flag"] is None


def test_a_column_whose_type_differs_between_files_is_exit_2_naming_both(ray_local: None, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": [_text(1)], "year": pa.array([2020], pa.int64())}), tmp_path / "in" / "a.parquet")
    with open(tmp_path / "in" / "b.jsonl", "w") as handle:
        handle.write(json.dumps({"text": _text(2), "year": "twenty"}) + "\n")
    out = tmp_path / "out"
    assert main(["dedup", str(tmp_path / "in"), "-o", str(out), "--quiet"]) == 2
    error = capsys.readouterr().err
    assert "'year'" in error and "a.parquet" in error and "b.jsonl" in error
    assert not (out / "_manifest.json").exists()


def test_a_jsonl_key_mixing_types_within_one_file_is_a_clash_naming_it() -> None:
    docs = [Doc(f"d{i}", "t", "f", None, None, None, f"line {i}",
                extra=Extra("f.jsonl", values={"v": value})) for i, value in enumerate([1, "one"])]
    types = ColumnTypes()
    assert batch_table(docs, types) is None
    with pytest.raises(Exception, match=r"'v' is .* in f.jsonl but .* in f.jsonl"):
        types.schema()


_ARROW_TYPES = st.sampled_from([pa.int8(), pa.int64(), pa.float32(), pa.string(), pa.bool_(), pa.binary(),
                                pa.list_(pa.int32()), pa.timestamp("ms"), pa.date32(),
                                pa.struct([("a", pa.int16()), ("b", pa.string())]),
                                pa.dictionary(pa.int32(), pa.string())])
_NAMES = st.text(string.ascii_letters + string.digits + "_ .-", min_size=1, max_size=12).filter(
    lambda name: name not in RESERVED_COLUMNS)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(columns=st.dictionaries(_NAMES, _ARROW_TYPES, min_size=1, max_size=5), data=st.data())
def test_generated_columns_come_out_as_they_went_in(ray_local: None, tmp_path_factory: pytest.TempPathFactory,
                                                   columns: dict[str, pa.DataType], data: st.DataObject) -> None:
    rows = 6
    values = {}
    for name, arrow_type in columns.items():
        values[name] = data.draw(st.lists(_values_of(arrow_type), min_size=rows, max_size=rows))
    table = pa.table({"id": [f"g{i}" for i in range(rows)], "text": [_text(300 + i) for i in range(rows)],
                      **{name: pa.array(values[name], arrow_type) for name, arrow_type in columns.items()}})
    root = tmp_path_factory.mktemp("generated")
    pq.write_table(table, root / "in.parquet")
    out = str(root / "out")
    run_dedup(DedupConfig(inputs=[str(root / "in.parquet")], output=out, num_partitions=1))
    corpus = Corpus.open(out)
    written = corpus.to_table()
    for name, arrow_type in columns.items():
        assert corpus.schema.field(name).type == arrow_type
        assert dict(zip(written["id"].to_pylist(), written[name].to_pylist(), strict=True)) == dict(
            zip(table["id"].to_pylist(), table[name].to_pylist(), strict=True))


def _values_of(arrow_type: pa.DataType) -> st.SearchStrategy:
    if pa.types.is_dictionary(arrow_type):
        return st.one_of(st.none(), st.sampled_from(["a", "b"]))
    if pa.types.is_struct(arrow_type):
        return st.one_of(st.none(), st.fixed_dictionaries({"a": st.integers(-100, 100), "b": st.text(max_size=5)}))
    if pa.types.is_list(arrow_type):
        return st.one_of(st.none(), st.lists(st.integers(-1000, 1000), max_size=3))
    simple = {pa.int8(): st.integers(-128, 127), pa.int64(): st.integers(-2**63, 2**63 - 1),
              pa.float32(): st.floats(width=32, allow_nan=False), pa.string(): st.text(max_size=8),
              pa.bool_(): st.booleans(), pa.binary(): st.binary(max_size=8),
              pa.timestamp("ms"): st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2100, 1, 1)).map(
                  lambda t: t.replace(microsecond=t.microsecond // 1000 * 1000)),
              pa.date32(): st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2200, 1, 1))}
    return st.one_of(st.none(), simple[arrow_type])


def test_a_users_source_column_is_never_taken_for_gristmills_source(tmp_path: Path) -> None:
    """Without a URL a document's gristmill_source is its file: a ``source`` column ("pydocs") is the
    user's, carried, not read as where the document came from (a corpus shard of format 2 is the
    exception: its ``source`` column was gristmill's)."""
    from gristmill.pipeline.format.existing import index_parquet
    from gristmill.pipeline.job.inputs import ReadOptions, read_file, resolve_inputs

    path = tmp_path / "plain" / "data.parquet"
    path.parent.mkdir()
    pq.write_table(pa.table({"text": ["some words here"], "source": ["pydocs"]}), path)
    [item] = resolve_inputs([str(path)])
    [doc] = read_file(item, ReadOptions())
    assert doc.source == item.source and doc.extra.table["source"].to_pylist() == ["pydocs"]
    index_parquet(str(path.parent))  # listed by a manifest now, still not a corpus of format 2
    [item] = resolve_inputs([str(path.parent)])
    assert item.rows == 1
    [doc] = read_file(item, ReadOptions())
    assert doc.source == item.source

    old = tmp_path / "old.parquet"  # a format 2 dedup shard: its "source" was gristmill's
    pq.write_table(pa.table({"text": ["x y"], "source": ["https://a.example/1"], "cluster_id": ["c"]}), old)
    [item] = resolve_inputs([str(old)])
    [doc] = read_file(dataclasses.replace(item, rows=1), ReadOptions())
    assert doc.source == "https://a.example/1"


_JSON_KINDS = {
    "bool": st.booleans(), "int": st.integers(-2**63, 2**63 - 1), "float": st.floats(allow_nan=False),
    "str": st.text(max_size=8), "nested": st.lists(st.integers(-5, 5) | st.text(max_size=3), max_size=3),
}
_KIND_OF = {bool: "bool", int: "int", float: "float", str: "str", list: "nested"}
_JSON_ARROW = {"bool": pa.bool_(), "int": pa.int64(), "float": pa.float64(), "str": pa.string(), "nested": pa.string()}


@settings(max_examples=40, deadline=None)
@given(kinds=st.dictionaries(_NAMES, st.sampled_from(sorted(_JSON_KINDS)), min_size=1, max_size=4), data=st.data())
def test_generated_jsonl_keys_come_out_with_their_json_types(tmp_path_factory: pytest.TempPathFactory,
                                                             kinds: dict[str, str], data: st.DataObject) -> None:
    """Each key keeps its values under the type its JSON kind maps to (objects and arrays as JSON text),
    null where a record lacks it; a key whose kinds do not unify is a clash naming it and the file."""
    from gristmill.pipeline.job import DedupError
    from gristmill.pipeline.job.inputs import ReadOptions, read_file, resolve_inputs

    records = []
    for i in range(data.draw(st.integers(1, 6))):
        present = data.draw(st.lists(st.sampled_from(sorted(kinds)), unique=True))
        records.append({"text": f"doc {i}", **{k: data.draw(_JSON_KINDS[kinds[k]]) for k in present}})
    clash = data.draw(st.sampled_from([None, *sorted(kinds)]))
    if clash is not None:  # one more record gives the key a value of a kind that does not unify with it
        other = "int" if kinds[clash] in ("str", "nested") else "str"
        records.append({"text": "odd", clash: data.draw(_JSON_KINDS[other])})
    path = tmp_path_factory.mktemp("jsonl") / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    [item] = resolve_inputs([str(path)])
    docs = list(read_file(item, ReadOptions()))
    types = ColumnTypes()
    table = batch_table(docs, types)
    used = {k for r in records for k in r if k != "text"}
    if clash is not None and clash in used and len({type(r[clash]) for r in records if clash in r}) > 1:
        with pytest.raises(DedupError, match=re.escape(f"{clash!r}") + ".* in .*in.jsonl"):
            types.schema()
        return
    schema = types.schema()
    for key in used:
        [kind] = {_KIND_OF[type(r[key])] for r in records if key in r}  # the odd record's alone, if only it
        assert schema.field(key).type == _JSON_ARROW[kind]
        expected = [json.dumps(r[key], separators=(",", ":")) if kind == "nested" and key in r else r.get(key)
                    for r in records]
        values = table[key].to_pylist()
        if kind == "nested":
            values = [None if v is None else json.dumps(json.loads(v), separators=(",", ":")) for v in values]
        assert values == expected
