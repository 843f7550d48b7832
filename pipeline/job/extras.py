"""The input's own columns, carried from the read stage to the shards under their names, types and values.

gristmill consumes the text and id columns and its own names (``gristmill.pipeline.format.schemas.passes_through``);
every other input column passes through. The read stage writes each batch's columns beside the
split's documents file (``EXTRAS``, one file per read batch, the batch being one row group of the
documents file), never through the shuffles; the driver unifies what every split saw into one schema
(files with different columns: the union, nulls where absent; an int32 and an int64 column: int64);
the write stage appends them to each row group it writes. Two files giving one column types that do
not unify (a number and a text) stop the job before any shuffle, naming the column and both files.

JSONL values keep their JSON types: true/false as bool, integers as int64, other numbers as float64
(a column mixing both: float64), strings as string; objects, arrays and integers beyond 64 bits
arrive as their JSON text (``gristmill.pipeline.job.inputs.jsonl``), a string. Parquet columns keep their
Arrow types.
"""

from __future__ import annotations

import base64
import hashlib
import json
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gristmill.pipeline.job.config import DedupError
from gristmill.pipeline.job.datasets import EXTRAS
from gristmill.pipeline.job.inputs import Doc
from gristmill.pipeline.job.inputs.records import encodable, printable
from gristmill.pipeline.job.workdir import WorkDir


class ColumnTypes:
    """The Arrow type of each carried column as the files of a split (or of the job) gave it, with one
    file per distinct type, to name in a conflict; kept as JSON in the read stage's results."""

    def __init__(self, seen: Mapping[str, Mapping[str, Sequence[str]]] | None = None) -> None:
        # column -> type as text -> [the type's serialized schema (base64), a file that gave it]
        self.seen: dict[str, dict[str, list[str]]] = {name: {k: list(v) for k, v in types.items()}
                                                     for name, types in (seen or {}).items()}

    def add(self, schema: pa.Schema, file: str) -> None:
        for spec in schema:
            types = self.seen.setdefault(spec.name, {})
            if pa.types.is_null(spec.type):
                types.setdefault("null", ["", file])  # unifies with any type: no schema to keep
            elif str(spec.type) not in types:
                encoded = base64.b64encode(pa.schema([spec]).serialize().to_pybytes()).decode("ascii")
                types[str(spec.type)] = [encoded, file]

    def merge(self, other: ColumnTypes) -> None:
        for name, types in other.seen.items():
            mine = self.seen.setdefault(name, {})
            for text, entry in types.items():
                mine.setdefault(text, entry)

    def to_json(self) -> dict[str, dict[str, list[str]]]:
        return self.seen

    def digest(self) -> str:
        """The names and types, without the files: equal for splits whose columns are the same."""
        text = json.dumps(sorted((name, sorted(types)) for name, types in self.seen.items()))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    def schema(self) -> pa.Schema:
        """One nullable field per column, its types unified (null with anything, int32 with int64, int
        with float); DedupError naming the column, two of its types and the files that gave them when
        they do not unify."""
        fields = []
        for name, types in self.seen.items():
            typed = [(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(encoded))).field(0), file)
                     for encoded, file in types.values() if encoded]
            if not typed:
                fields.append(pa.field(name, pa.null()))
                continue
            unified, first_file = typed[0]
            for spec, file in typed[1:]:
                try:
                    unified = pa.unify_schemas([pa.schema([unified]), pa.schema([spec])],
                                               promote_options="permissive").field(0)
                except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    raise DedupError(
                        f"input column {name!r} is {unified.type} in {first_file} but {spec.type} in {file}; "
                        "make the files agree on its type (or rename it in one of them)") from None
            fields.append(pa.field(name, unified.type))
        return pa.schema(fields)


_JSON_TYPES = {type(None): pa.null(), bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string()}


def _json_array(values: list[Any], arrow_type: pa.DataType) -> pa.Array:
    """A JSONL column's values as an Arrow array of ``arrow_type`` (integers go into a float column as
    floats); strings a column cannot hold (lone surrogates) are escaped, checked only when Arrow refuses."""
    try:
        return pa.array(values, arrow_type)
    except (pa.ArrowException, UnicodeEncodeError):
        return pa.array([printable(v) if isinstance(v, str) and not encodable(v) else v for v in values], arrow_type)


def _column_type(name: str, values: list[Any], file: str, types: ColumnTypes) -> pa.DataType | None:
    """One JSONL column's type over a run of records; None (and the clash recorded in ``types``) when
    its values mix types that do not unify."""
    kinds = {_JSON_TYPES.get(kind, pa.string()) for kind in set(map(type, values))} - {pa.null()}
    if not kinds:
        return pa.null()
    if kinds == {pa.int64(), pa.float64()}:
        return pa.float64()
    if len(kinds) == 1:
        return kinds.pop()
    for kind in kinds:  # the schema() of these types names the column and this file
        types.add(pa.schema([pa.field(name, kind)]), file)
    return None


def _jsonl_run(docs: Sequence[Doc], types: ColumnTypes) -> pa.Table | None:
    """A run of consecutive records of one JSONL file as a table; None when a column mixes types."""
    file = docs[0].extra.file  # type: ignore[union-attr]
    names: dict[str, None] = {}
    for doc in docs:
        names.update(dict.fromkeys(doc.extra.values))  # type: ignore[union-attr]
    columns, fields = [], []
    for name in names:
        values = [doc.extra.values.get(name) for doc in docs]  # type: ignore[union-attr]
        arrow_type = _column_type(name, values, file, types)
        if arrow_type is None:
            return None
        fields.append(pa.field(printable(name), arrow_type))
        columns.append(_json_array(values, arrow_type))
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def _no_columns(rows: int) -> pa.Table:
    return pa.table({"_": pa.nulls(rows)}).drop_columns(["_"])


def _runs(docs: Sequence[Doc]) -> Iterable[list[Doc]]:
    """Consecutive documents that share a source of columns: one Parquet row group, one JSONL file, or none."""
    run: list[Doc] = []
    for doc in docs:
        if run and _run_key(run[-1]) != _run_key(doc):
            yield run
            run = []
        run.append(doc)
    if run:
        yield run


def _run_key(doc: Doc) -> tuple[Any, ...]:
    extra = doc.extra
    if extra is None:
        return (None,)
    return ("parquet", id(extra.table)) if extra.table is not None else ("jsonl", extra.file)


def batch_table(docs: Sequence[Doc], types: ColumnTypes) -> pa.Table | None:
    """The carried columns of one read batch, a row per document (nulls where a document's file lacks
    a column); every run's types go into ``types``. None when the batch has no such column, or when
    types clash (``types`` then holds the clash, which the driver reports before any shuffle)."""
    tables = []
    for run in _runs(docs):
        extra = run[0].extra
        if extra is None:
            table = _no_columns(len(run))
        elif extra.table is not None:
            table = extra.table.take([doc.extra.row for doc in run])  # type: ignore[union-attr]
            types.add(table.schema, extra.file)
        else:
            table = _jsonl_run(run, types)
            if table is None:
                return None
            types.add(table.schema, extra.file)
        tables.append(table)
    if not any(t.num_columns for t in tables):
        return None
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # the clash is in ``types``


def write_batch(work: WorkDir, split: int, batch: int, table: pa.Table | None) -> None:
    if table is not None:
        work.write_table(EXTRAS.file(split, batch), table)


def save_split_types(work: WorkDir, split: int, types: ColumnTypes) -> str | None:
    """A split's column types, into the work folder; what its read result carries instead is a digest
    of the names and types alone, so the driver reads one split's file per distinct set of types, not
    one per split (40,000 splits of one schema: one file). None when the split has no such column."""
    if not types.seen:
        return None
    work.write_json(EXTRAS.types_file(split), types.to_json())
    return types.digest()


def job_schema(work: WorkDir, results: Iterable[Mapping[str, Any]]) -> pa.Schema:
    """The carried columns of the whole input, in the order the splits first give them, from the read
    stage's results (DedupError naming the column and files on a clash)."""
    types = ColumnTypes()
    seen: set[str] = set()
    for result in results:
        digest = result.get("columns")
        if digest and digest not in seen:
            seen.add(digest)
            types.merge(ColumnTypes(work.read_json(EXTRAS.types_file(result["split"]))))
    return types.schema()


class SplitColumns:
    """The write stage's side of one split: each batch's carried columns in the job's schema."""

    def __init__(self, work: WorkDir, split: int, schema: pa.Schema) -> None:
        self.work, self.split, self.schema = work, split, schema
        folder = work.path(EXTRAS.folder_of(split))
        self.present = ({posixpath.basename(p) for p in work.fs.glob(posixpath.join(folder, "*.parquet"))}
                        if len(schema) else set())

    def batch(self, batch: int, rows: int) -> pa.Table:
        """Batch ``batch``'s columns (``rows`` rows), cast to the job's schema, nulls for what it lacks."""
        relative = EXTRAS.file(self.split, batch)
        table = None
        if posixpath.basename(relative) in self.present:
            with self.work.fs.open(self.work.path(relative), "rb") as handle:
                table = pq.read_table(handle)
        columns = [table[spec.name].cast(spec.type) if table is not None and spec.name in table.column_names
                   else pa.nulls(rows, spec.type) for spec in self.schema]
        return pa.Table.from_arrays(columns, schema=self.schema) if columns else _no_columns(rows)
