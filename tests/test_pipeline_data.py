"""Inputs for the pipeline tests: real licence texts from /usr/share/doc in every input format, with
planted near and exact duplicates and every kind of bad record. Holds helpers only, no tests."""

from __future__ import annotations

import glob
import gzip
import html
import io
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

MAX_DOC_BYTES = 200_000


def real_texts(count: int, min_words: int = 60) -> list[str]:
    """Distinct real texts: Debian copyright files (many share licence text with small changes)."""
    seen: set[str] = set()
    texts = []
    for path in sorted(glob.glob("/usr/share/doc/*/copyright")):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if len(text.split()) >= min_words and text not in seen and len(text.encode()) < MAX_DOC_BYTES:
            seen.add(text)
            texts.append(text)
        if len(texts) == count:
            break
    assert len(texts) == count, f"only {len(texts)} usable copyright files"
    return texts


def near_copy(text: str, rng: random.Random) -> str:
    """The text with one word replaced: Jaccard well above 0.8 for texts of 60+ words."""
    words = text.split(" ")
    words[rng.randrange(len(words))] = "CHANGED"
    return " ".join(words)


def documents(count: int, seed: int = 7) -> list[str]:
    """Real texts plus planted near copies (every 4th) and exact copies up to case/spacing (every 6th)."""
    rng = random.Random(seed)
    texts = []
    for i, text in enumerate(real_texts(count)):
        texts.append(text)
        if i % 4 == 0:
            texts.append(near_copy(text, rng))
        if i % 6 == 0:
            texts.append("  " + text.upper() + "\n")
    return texts


def write_jsonl(path: Path, texts: list[str], with_ids: bool = True, prefix: str = "") -> None:
    lines = [json.dumps({"id": f"{prefix}{i}", "text": t} if with_ids else {"text": t}) for i, t in enumerate(texts)]
    data = ("\n".join(lines) + "\n").encode()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".zst":
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


def write_parquet(path: Path, texts: list[str], prefix: str) -> None:
    table = pa.table({
        "id": [f"{prefix}{i}" for i in range(len(texts))],
        "text": texts,
        "url": [f"https://site{i % 3}.example/page{i}" for i in range(len(texts))],
        "language": ["en"] * len(texts),
    })
    pq.write_table(table, path, row_group_size=max(1, len(texts) // 3))


def write_warc(path: Path, pages: list[tuple[str, bytes, str]]) -> None:
    """A gzipped WARC of HTTP responses: (url, body, content type)."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    with open(path, "wb") as handle:
        writer = WARCWriter(handle, gzip=True)
        for url, body, content_type in pages:
            headers = StatusAndHeaders("200 OK", [("Content-Type", content_type)], protocol="HTTP/1.1")
            record = writer.create_warc_record(url, "response", payload=io.BytesIO(body), length=len(body),
                                                http_headers=headers)
            writer.write_record(record)


def html_page(text: str) -> bytes:
    """A plain article page around the text (escaped, so e-mail addresses in <...> survive)."""
    paragraphs = "".join(f"<p>{html.escape(p)}</p>" for p in text.split("\n\n") if p.strip())
    return f"<html><head><title>t</title></head><body><article>{paragraphs}</article></body></html>".encode()


def mixed_input(root: Path) -> dict[str, Any]:
    """Every input format, good and bad; returns what the test knows about it.

    ``records`` counts every record written that the job can see (so kept + removed + rejected must
    equal it), ``bad`` the rejects by kind that the files were built to cause.
    """
    root.mkdir(parents=True, exist_ok=True)
    texts = documents(72)
    chunks = [texts[i::5] for i in range(5)]
    write_jsonl(root / "a.jsonl", chunks[0], prefix="a")
    with open(root / "a.jsonl", "ab") as handle:
        handle.write(b'{"id": "broken", "text": "no closing brace"\n')  # unparseable
        handle.write(b'{"id": "bad-utf8", "text": "caf\xe9"}\n')  # invalid UTF-8
        handle.write(b'{"id": "empty", "text": "   "}\n')  # empty
        handle.write(b'{"id": "surrogate", "text": "half a pair \\ud800 here"}\n')  # invalid Unicode
        handle.write(b'{"id": "number", "text": 12}\n')  # unparseable: text is not a string
        handle.write(json.dumps({"id": "huge", "text": "x " * MAX_DOC_BYTES}).encode() + b"\n")  # size cap
    write_jsonl(root / "b.jsonl.gz", chunks[1], with_ids=False)
    write_jsonl(root / "c.jsonl.zst", chunks[2], prefix="c")
    write_parquet(root / "d.parquet", chunks[3], prefix="d")
    pages = [(f"https://warc.example/{i}", html_page(t), "text/html; charset=utf-8") for i, t in enumerate(chunks[4])]
    pages.append(("https://warc.example/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png"))  # unsupported
    write_warc(root / "e.warc.gz", pages)
    # A gzip stream cut in half: the lines before the cut are read, the rest is one "corrupt" reject.
    whole = gzip.compress(("\n".join(json.dumps({"id": f"t{i}", "text": f"truncated doc {i} " * 30})
                                     for i in range(400)) + "\n").encode())
    (root / "f.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (root / "g.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 4 + b"PAR1")  # corrupt Parquet
    write_warc(root / "h.warc.gz", pages[:2])
    with open(root / "h.warc.gz", "ab") as handle:
        handle.write(gzip.compress(b"this is not a WARC header block\r\n\r\n" + bytes(100)))  # corrupt record
    return {
        "texts": texts,
        "good_jsonl_like": sum(len(c) for c in chunks[:4]),
        "bad": {"unparseable": 2, "invalid_utf8": 2, "empty": 1, "over_size_cap": 1, "unsupported": 1,
                "corrupt": 3},
    }
