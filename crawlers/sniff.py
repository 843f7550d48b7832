"""Text or binary? A body's own bytes decide when its Content-Type cannot be trusted.

Why: servers send PDFs, images and archives with no Content-Type, an empty one, a generic one
(``application/octet-stream``) or even ``text/html``; decoded as text, such a body becomes a page of
mojibake in the corpus. The rules follow the WHATWG MIME Sniffing Standard in spirit: a byte-order
mark means text, a signature of a common binary format means that format, and "binary data bytes"
(control bytes no text uses) mean binary. A declared text type is overruled only by clear evidence
(a signature or a NUL byte), so a real page with one stray control character is still kept.
"""

from __future__ import annotations

import codecs
import re

SNIFF_BYTES = 4096  # how much of the body the byte rules look at
OCTET_STREAM = "application/octet-stream"
GENERIC_TYPES = frozenset({
    "", OCTET_STREAM, "binary/octet-stream", "application/unknown", "unknown/unknown", "*/*",
    "application/x-unknown", "application/x-unknown-content-type", "application/binary",
    "application/force-download", "application/download",
})
_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)  # the UTF-32 BOMs start with these
_WIDE_CHARSETS = ("utf-16", "utf-32")  # legitimately full of NUL bytes, with or without a BOM
# Signatures of the binary formats a crawler meets most, each with the type it reports.
_SIGNATURES = tuple((mime, re.compile(pattern, re.DOTALL)) for mime, pattern in (
    ("application/pdf", rb"%PDF-"),
    ("application/postscript", rb"%!PS-Adobe-"),
    ("image/png", rb"\x89PNG\r\n\x1a\n"),
    ("image/jpeg", rb"\xff\xd8\xff"),
    ("image/gif", rb"GIF8[79]a"),
    ("image/tiff", rb"II\*\x00|MM\x00\*"),
    ("image/webp", rb"RIFF.{4}WEBP"),
    ("audio/wav", rb"RIFF.{4}WAVE"),
    ("video/x-msvideo", rb"RIFF.{4}AVI "),
    ("video/mp4", rb".{4}ftyp"),  # ISO media: MP4, QuickTime, HEIF, AVIF
    ("video/webm", rb"\x1a\x45\xdf\xa3"),  # Matroska and WebM
    ("audio/mpeg", rb"ID3[\x02-\x04]|\xff[\xe2-\xe3\xf2-\xf3\xfa-\xfb]"),
    ("audio/ogg", rb"OggS\x00"),
    ("audio/flac", rb"fLaC"),
    ("audio/midi", rb"MThd\x00\x00\x00\x06"),
    ("font/woff", rb"wOFF"),
    ("font/woff2", rb"wOF2"),
    ("application/zip", rb"PK\x03\x04|PK\x05\x06|PK\x07\x08"),  # also docx, xlsx, pptx, odt, epub, jar
    ("application/gzip", rb"\x1f\x8b"),
    ("application/zstd", rb"\x28\xb5\x2f\xfd"),
    ("application/x-bzip2", rb"BZh[1-9]1AY&SY"),
    ("application/x-xz", rb"\xfd7zXZ\x00"),
    ("application/x-7z-compressed", rb"7z\xbc\xaf\x27\x1c"),
    ("application/vnd.rar", rb"Rar!\x1a\x07"),
    ("application/x-ole-storage", rb"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"),  # doc, xls, ppt, msi
    ("application/x-executable", rb"\x7fELF"),
    ("application/x-mach-binary", rb"\xfe\xed\xfa[\xce\xcf]|[\xce\xcf]\xfa\xed\xfe|\xca\xfe\xba\xbe"),
    ("application/wasm", rb"\x00asm"),
    ("application/vnd.sqlite3", rb"SQLite format 3\x00"),
))
# WHATWG "binary data bytes": control bytes other than tab, newlines, form feed and escape.
_BINARY_BYTE = re.compile(rb"[\x00-\x08\x0b\x0e-\x1a\x1c-\x1f]")
# WHATWG's HTML and XML signatures: a page that starts like markup is text despite stray control bytes.
_MARKUP = re.compile(rb"[\t\n\x0c\r ]*(?:<\?xml|(?:<!doctype html|<html|<head|<script|<iframe|<h1|<div|"
                     rb"<font|<table|<a|<style|<title|<b|<body|<br|<p|<!--)[ >])", re.IGNORECASE)


def is_generic(content_type: str) -> bool:
    """True for a media type that says nothing about the body: missing, malformed or generic."""
    return content_type in GENERIC_TYPES or "/" not in content_type


def binary_type(body: bytes, content_type: str = "", charset: str | None = None) -> str | None:
    """The binary type ``body`` evidently has, or None if it may be stored as text.

    ``content_type`` (the declared media type, lower case, without parameters) and ``charset``
    say how much the bytes must prove: a generic or missing type is judged by every rule, a
    declared one only by signatures and NUL bytes, and a UTF-16/32 charset excuses NUL bytes.
    """
    if body.startswith(_BOMS):
        return None
    for mime, signature in _SIGNATURES:
        if signature.match(body):
            return mime
    if _is_wide(charset):
        return None
    head = body[:SNIFF_BYTES]
    if b"\x00" in head:
        return OCTET_STREAM
    if is_generic(content_type) and not _MARKUP.match(head) and _BINARY_BYTE.search(head):
        return OCTET_STREAM
    return None


def _is_wide(charset: str | None) -> bool:
    if not charset:
        return False
    try:
        return codecs.lookup(charset).name.startswith(_WIDE_CHARSETS)
    except LookupError:
        return False
