"""Raw crawl shards (corpus format) and optional WARC/1.1 files, committed from the frontier.

Why this order: result rows wait in the frontier; a commit writes them to a new uniquely named
shard (and WARC file), records the shard in the frontier while deleting the rows, then publishes a
manifest listing every recorded shard. A crash at any point leaves either rows still pending (they
go into the next shard) or a recorded shard the next manifest lists; a shard written but never
recorded is an orphan nobody lists, and is removed at start-up.
"""

from __future__ import annotations

import io
import json
import posixpath
import uuid
from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from pipeline.format import (
    MANIFEST_NAME,
    RAW_CRAWL_SCHEMA,
    Corpus,
    CorpusError,
    ShardInfo,
    ShardWriter,
    open_fs,
    write_manifest,
)

from .frontier import ResultLog
from .partitions import write_json

SHARD_PREFIX = "crawl"
WARC_FOLDER = "warc"


def warc_payload(request_headers: Mapping[str, str], status: int, reason: str,
                 response_headers: list[tuple[str, str]], body: bytes, metadata: Mapping[str, Any]) -> bytes:
    """Pack one exchange for later WARC writing (kept as a blob in the frontier until commit)."""
    header = json.dumps({"request": dict(request_headers), "status": status, "reason": reason,
                         "headers": response_headers, "metadata": dict(metadata)}).encode("utf-8")
    return len(header).to_bytes(4, "big") + header + body


def _write_warc(handle: Any, records: list[tuple[dict[str, Any], bytes]]) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    writer = WARCWriter(handle, gzip=True, warc_version="WARC/1.1")
    for row, blob in records:
        size = int.from_bytes(blob[:4], "big")
        packed = json.loads(blob[4:4 + size])
        body = blob[4 + size:]
        url = row["final_url"]
        date = row["fetch_time"].strftime("%Y-%m-%dT%H:%M:%SZ")
        path = url.split("/", 3)[3] if url.count("/") >= 3 else ""
        request = writer.create_warc_record(
            url, "request", payload=io.BytesIO(b""), warc_headers_dict={"WARC-Date": date},
            http_headers=StatusAndHeaders(f"GET /{path} HTTP/1.1", list(packed["request"].items()),
                                          is_http_request=True))
        # The body is stored as delivered to the crawler (inflated), so encoding headers are dropped.
        headers = [(k, v) for k, v in packed["headers"]
                   if k.lower() not in ("content-encoding", "transfer-encoding", "content-length")]
        headers.append(("Content-Length", str(len(body))))
        response = writer.create_warc_record(
            url, "response", payload=io.BytesIO(body), warc_headers_dict={"WARC-Date": date},
            http_headers=StatusAndHeaders(f"{packed['status']} {packed['reason']}", headers, protocol="HTTP/1.1"))
        metadata = writer.create_warc_record(
            url, "metadata", payload=io.BytesIO(json.dumps(packed["metadata"]).encode("utf-8")),
            warc_content_type="application/json",
            warc_headers_dict={"WARC-Date": date,
                               "WARC-Concurrent-To": response.rec_headers.get_header("WARC-Record-ID")})
        request.rec_headers.add_header("WARC-Concurrent-To", response.rec_headers.get_header("WARC-Record-ID"))
        for record in (request, response, metadata):
            writer.write_record(record)


def _to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Column by column, with fetch times as epoch milliseconds (no per-row datetime objects)."""
    columns = []
    for field in RAW_CRAWL_SCHEMA:
        values = [row[field.name] for row in rows]
        if field.name == "fetch_time":
            columns.append(pa.array(values, pa.int64()).cast(field.type))
        else:
            columns.append(pa.array(values, field.type))
    return pa.Table.from_arrays(columns, schema=RAW_CRAWL_SCHEMA)  # (pa.table would import pandas)


RAW_CRAWL_KIND = "raw-crawl"  # ``extra.kind`` of a crawl's manifest


def check_output_folder(output: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Refuse (ValueError) an output folder whose manifest is not a crawl's: a crawl publishes its
    manifest at every commit, which would silently replace a deduplicated corpus stored there."""
    fs, root = open_fs(output, storage_options)
    if not fs.exists(posixpath.join(root, MANIFEST_NAME)):
        return
    try:
        kind = Corpus.open(output, storage_options).manifest.extra.get("kind")
    except CorpusError as exc:
        raise ValueError(f"{output} holds a manifest a crawl cannot resume ({exc}); choose another folder") from None
    if kind != RAW_CRAWL_KIND:
        raise ValueError(f"{output} holds a corpus that is not a crawl's; a crawl would replace its manifest. "
                         "Choose another folder")


class Committer:
    """Moves pending results from the frontier into shards and publishes the manifest.

    Uses only its :class:`ResultLog`, so :meth:`flush` may run in a thread while the crawl goes on.
    """

    def __init__(self, output: str, results: ResultLog, *, shard_bytes: int, row_group_bytes: int,
                 warc: bool, storage_options: Mapping[str, Any] | None = None, prefix: str = SHARD_PREFIX,
                 segment: str | None = None) -> None:
        self.output = output
        self.prefix = prefix
        self.segment = segment
        self.results = results
        self.shard_bytes = shard_bytes
        self.row_group_bytes = row_group_bytes
        self.warc = warc
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = open_fs(output, storage_options)
        self.fs.makedirs(self.root, exist_ok=True)

    def remove_orphans(self) -> list[str]:
        """Delete shard and WARC files that no recorded shard names (left by a crash mid-commit)."""
        recorded = set()
        for name, _info, warc in self.results.shards():
            recorded.add(name)
            if warc:
                recorded.add(warc)
        removed = []
        for path in self.fs.glob(posixpath.join(self.root, f"{self.prefix}-*.parquet")) + self.fs.glob(
                posixpath.join(self.root, WARC_FOLDER, f"{self.prefix}-*.warc.gz")):
            relative = posixpath.relpath(path, self.root)
            if relative not in recorded:
                self.fs.rm(path)
                removed.append(relative)
        return removed

    def flush(self, stats: Mapping[str, Any], batch_rows: int = 5000) -> int:
        """Write every pending result into new shards, then publish; returns rows written."""
        written = 0
        while True:
            pending = self.results.unsharded(batch_rows)
            if not pending:
                break
            run_id = uuid.uuid4().hex[:12]
            writer = ShardWriter(self.output, RAW_CRAWL_SCHEMA, shard_bytes=self.shard_bytes,
                                 row_group_bytes=self.row_group_bytes, name_prefix=self.prefix, run_id=run_id,
                                 storage_options=self.storage_options)
            rows = [row for _rowid, row, _blob in pending]
            writer.write(_to_table(rows))
            for row in rows:
                row["fetch_time"] = datetime.fromtimestamp(row["fetch_time"] / 1000, timezone.utc)
            infos = [info.to_dict() for info in writer.close()]
            warc_name = None
            if self.warc:
                warc_name = posixpath.join(WARC_FOLDER, f"{self.prefix}-{run_id}.warc.gz")
                self.fs.makedirs(posixpath.join(self.root, WARC_FOLDER), exist_ok=True)
                records = [(row, blob) for (_r, row, blob) in pending if blob is not None]
                with self.fs.open(posixpath.join(self.root, warc_name), "wb") as handle:
                    _write_warc(handle, records)
            self.results.record_shards(infos, [rowid for rowid, _row, _blob in pending], warc_name)
            written += len(pending)
        self.publish(stats)
        return written

    def publish(self, stats: Mapping[str, Any]) -> None:
        """Write the manifest listing every recorded shard (and WARC file); a partition writes its
        segment instead, and the coordinator publishes one manifest from all of them."""
        recorded = self.results.shards()
        segment = {"shards": [info for _name, info, _warc in recorded], "stats": dict(stats),
                   "warc_files": sorted({warc for _n, _i, warc in recorded if warc})}
        if self.segment is not None:
            write_json(self.segment, segment)
        else:
            publish_segments(self.output, [segment], self.storage_options)


def publish_segments(output: str, segments: list[Mapping[str, Any]],
                     storage_options: Mapping[str, Any] | None = None) -> None:
    """One manifest listing the shards of every segment, with their crawl statistics added up."""
    shards = [ShardInfo.from_dict(info) for segment in segments for info in segment["shards"]]
    warcs = sorted({warc for segment in segments for warc in segment["warc_files"]})
    documents, outcomes, parked = 0, Counter[str](), {}
    for segment in segments:
        crawl = segment["stats"]["crawl"]
        documents += crawl["documents"]
        outcomes.update(crawl["outcomes"])
        parked.update(crawl["parked_hosts"])
    stats = {"crawl": {"documents": documents, "outcomes": dict(outcomes), "parked_hosts": parked}}
    write_manifest(output, shards, RAW_CRAWL_SCHEMA, stats=stats,
                   extra={"kind": RAW_CRAWL_KIND, "warc_files": warcs}, storage_options=storage_options)
