"""Storage faults while reading input, told apart from damaged data: a transient fault is retried, a missing
or unreadable input fails the job naming the file, and only bytes that were read and are malformed become
a "corrupt" reject.

Why it matters: every exception used to become a reject, so a 503 from a throttled bucket, or a file
that only the head node's disk holds, cost its documents with exit 0. Three classes:

- transient: throttling (S3's 503 SlowDown, which s3fs raises as ``OSError(EBUSY)``), connection resets,
  timeouts. The S3 client retries them itself (:func:`with_client_retries` sets botocore's retry mode
  unless the user chose one); :func:`retrying` then retries the whole read with backoff.
- missing or refused: ``FileNotFoundError`` (S3's NoSuchKey), ``PermissionError``. Retrying cannot help.
- anything else is the data's fault, and the reader that met it makes it a reject.
"""

from __future__ import annotations

import errno
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from gristmill.pipeline.job.inputs.records import InputError, describe, printable

Result = TypeVar("Result")

# A whole read is tried this many times; each try is itself several requests the client retries.
READ_ATTEMPTS = 4
BACKOFF_SECONDS = 0.5  # before the second try; doubled for each further one, with jitter
# botocore's retry settings for an s3:// job whose storage options name none ("adaptive" also slows
# the client down while the store throttles).
CLIENT_RETRIES = {"mode": "adaptive", "max_attempts": 6}

_TRANSIENT_ERRNOS = {errno.EBUSY, errno.EAGAIN, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
                     errno.ECONNREFUSED, errno.EPIPE, errno.ENETUNREACH, errno.EHOSTUNREACH}
# S3 error codes, as botocore's ClientError carries them, that a later try can get past
_TRANSIENT_CODES = {"SlowDown", "ServiceUnavailable", "Throttling", "ThrottlingException", "RequestTimeout",
                    "RequestTimeTooSkewed", "InternalError", "500", "502", "503", "504"}
# Exceptions of the HTTP stacks under fsspec that mean the connection, not the data, failed.
_TRANSIENT_NAMES = {"EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError", "ConnectTimeoutError",
                    "ResponseStreamingError", "IncompleteReadError", "HTTPClientError", "ClientConnectionError",
                    "ClientOSError", "ServerDisconnectedError", "ClientPayloadError", "ServerTimeoutError",
                    "FSTimeoutError", "IncompleteRead", "ProtocolError"}


class InputUnreadable(InputError):
    """An input file that is missing, refused, or still failing after the retries: the job stops (exit 2)
    rather than count its documents as lost. The message is one line naming the file."""


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__  # explicit causes only: an unrelated error handled earlier is no cause


def fault_class(exc: BaseException) -> str | None:
    """"missing", "refused", "transient", or None when the exception is not the storage's (the data's)."""
    for link in _chain(exc):
        if isinstance(link, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            return "missing"
        if isinstance(link, PermissionError):
            return "refused"
        if isinstance(link, (ConnectionError, TimeoutError)) or type(link).__name__ in _TRANSIENT_NAMES:
            return "transient"
        code = getattr(link, "response", None)
        if isinstance(code, Mapping) and str(code.get("Error", {}).get("Code")) in _TRANSIENT_CODES:
            return "transient"
        if type(link) is OSError and link.errno in _TRANSIENT_ERRNOS:  # s3fs's translation (not gzip's)
            return "transient"
    return None


def raise_storage_fault(exc: BaseException) -> None:
    """Re-raise ``exc`` when it is the storage's fault, so a reader's "corrupt" handler never swallows it."""
    if fault_class(exc) is not None:
        raise exc


def unreadable(url: str, exc: BaseException, attempts: int = 1) -> InputUnreadable:
    """The one-line error for an input that cannot be read."""
    what = {"missing": "is missing", "refused": "cannot be read (access refused)"}.get(
        fault_class(exc) or "", f"could not be read after {attempts} attempts")
    detail = describe(exc).replace("\n", " ")
    return InputUnreadable(f"input {printable(url)} {what} ({detail}); no document of it was counted")


def after_failure(url: str, exc: Exception, number: int, attempts: int = READ_ATTEMPTS) -> None:
    """What try ``number`` (from 0) of reading ``url`` failing with ``exc`` leads to: back off and return
    for a transient fault with tries left; :class:`InputUnreadable` for a missing or refused input, or
    one still failing after ``attempts`` tries; ``exc`` itself when it is not the storage's fault."""
    kind = fault_class(exc)
    if kind is None or isinstance(exc, InputUnreadable):
        raise exc
    if kind != "transient" or number + 1 >= attempts:
        raise unreadable(url, exc, number + 1) from None
    time.sleep(BACKOFF_SECONDS * 2 ** number * (0.5 + random.random()))


def retrying(url: str, attempt: Callable[[], Result], attempts: int = READ_ATTEMPTS) -> Result:
    """``attempt()`` until it returns, as :func:`after_failure` says."""
    for number in range(attempts):
        try:
            return attempt()
        except Exception as exc:  # noqa: BLE001 - after_failure re-raises what is not a storage fault
            after_failure(url, exc, number, attempts)
    raise AssertionError("unreachable")  # pragma: no cover - the last failure raises


def with_client_retries(storage_options: Mapping[str, Any], urls: Iterable[str]) -> dict[str, Any]:
    """``storage_options`` with botocore's retry mode (:data:`CLIENT_RETRIES`) when a URL is on S3 and the
    user set none: the client then retries throttles and resets itself, request by request."""
    options = dict(storage_options)
    if not any(url.startswith(("s3://", "s3a://")) for url in urls):
        return options
    config = dict(options.get("config_kwargs") or {})
    if "retries" not in config:
        config["retries"] = dict(CLIENT_RETRIES)
        options["config_kwargs"] = config
    return options
