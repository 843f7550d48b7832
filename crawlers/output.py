"""The raw crawl's output format: shard rows as an Arrow table, WARC/1.1 records, and which folders a
crawl may write into.

Why apart from committing (:mod:`gristmill.crawlers.commits`): these say what a raw crawl corpus holds; the
commit loop only decides when rows move from the frontier into it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from gristmill.pipeline.format import RAW_CRAWL_SCHEMA, Corpus, CorpusError, has_manifest, open_fs

SHARD_PREFIX = "crawl"
WARC_FOLDER = "warc"


def warc_payload(request_headers: Mapping[str, str], status: int, reason: str,
                 response_headers: list[tuple[str, str]], body: bytes, metadata: Mapping[str, Any]) -> bytes:
    """Pack one exchange for later WARC writing (kept as a blob in the frontier until commit)."""
    header = json.dumps({"request": dict(request_headers), "status": status, "reason": reason,
                         "headers": response_headers, "metadata": dict(metadata)}).encode("utf-8")
    return len(header).to_bytes(4, "big") + header + body


def write_warc(handle: Any, records: list[tuple[dict[str, Any], bytes]]) -> None:
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


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
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
    manifest as it commits, which would silently replace a deduplicated corpus stored there."""
    fs, root = open_fs(output, storage_options)
    if not has_manifest(fs, root):
        return
    try:
        kind = Corpus.open(output, storage_options).manifest.extra.get("kind")
    except CorpusError as exc:
        raise ValueError(f"{output} holds a manifest a crawl cannot resume ({exc}); choose another folder") from None
    if kind != RAW_CRAWL_KIND:
        raise ValueError(f"{output} holds a corpus that is not a crawl's; a crawl would replace its manifest. "
                         "Choose another folder")
