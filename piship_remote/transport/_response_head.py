"""Reading a plain response head without ``email.parser``.

http.client parses every response's header lines with the email package's
feed parser, which costs more than the rest of reading a short answer. Almost
every head a service sends is plain: ``HTTP/1.1 <2xx-5xx> <reason>`` and
``Name: value`` lines of printable ASCII. :func:`read_plain_head` recognises such
a head in the bytes already buffered, takes it off the reader and returns what
``http.client.HTTPResponse.begin`` would have set; for anything else (an
informational answer, folded or non-ASCII lines, HTTP/1.0, a head longer than the
buffer, a ``HEAD`` request) it takes nothing and returns ``None``, and the
standard library reads the head as usual::

    head = read_plain_head(response.fp, "POST")
    if head is None:
        ...  # http.client.HTTPResponse.begin(response)

:func:`peek_plain_head` parses the head without taking it off the reader, so a
caller can choose how to read the response before anything is consumed.

The header object is the standard library's own ``http.client.HTTPMessage``,
filled as its parser fills it, so everything downstream sees the same thing.
"""

from __future__ import annotations

import http.client
import io
import re

import attrs

__all__ = ["PlainHead", "peek_plain_head", "read_plain_head"]

# The status line of a final answer; the reason is what http.client keeps after strip().
_STATUS_LINE = re.compile(rb"HTTP/1\.1 ([2-5][0-9][0-9])(?: ([\t\x20-\x7e]*))?\r\n")
# Header lines as RFC 9110 tokens and printable ASCII values, then the blank line.
_PLAIN_LINES = re.compile(rb"(?:[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e]*\r\n)*\r\n")
_MAX_HEADERS = 100  # http.client refuses more; it then reads (and refuses) the head itself
_NO_BODY = (204, 304)


@attrs.frozen
class PlainHead:
    """What ``HTTPResponse.begin`` sets for a plain head (HTTP/1.1, so ``version`` 11),
    the header fields in order, and the head's size in bytes."""

    status: int
    reason: str
    headers: http.client.HTTPMessage
    chunked: bool
    length: int | None
    will_close: bool
    fields: tuple[tuple[str, str], ...]
    size: int
    bare_stream: bool
    """A chunked body without a content coding, and no cookie to store."""


def read_plain_head(fp: object, method: str | None) -> PlainHead | None:
    """The plain head at the start of ``fp``'s buffer, taken off ``fp``; else ``None``.

    Only an ``io.BufferedReader`` is looked at; ``None`` leaves it untouched (at
    most one read filled its buffer, which the standard library then reads from).
    """
    head = peek_plain_head(fp, method)
    if head is not None:
        assert isinstance(fp, io.BufferedReader)
        fp.read(head.size)  # served from the buffer: the head, nothing after it
    return head


def peek_plain_head(fp: object, method: str | None) -> PlainHead | None:
    """The plain head at the start of ``fp``'s buffer, left on ``fp``; else ``None``.

    Waits for the first bytes (one read, if nothing is buffered yet).
    """
    if not isinstance(fp, io.BufferedReader) or method is None or method == "HEAD":
        return None
    buffered = fp.peek(1)
    end = buffered.find(b"\r\n\r\n")
    if end < 0:
        return None
    status_line = _STATUS_LINE.match(buffered)
    if status_line is None:
        return None
    lines_start = status_line.end()  # the blank line's start when there are no headers
    if not _PLAIN_LINES.fullmatch(buffered, lines_start, end + 4):
        return None
    lines = buffered[lines_start : end + 2].split(b"\r\n")[:-1]
    if len(lines) > _MAX_HEADERS:
        return None
    return _head(status_line, lines, end + 4)


def _head(status_line: re.Match[bytes], lines: list[bytes], size: int) -> PlainHead:
    message = http.client.HTTPMessage()
    first: dict[str, str] = {}  # what message.get() returns, by lower-case name
    fields: list[tuple[str, str]] = []
    for line in lines:
        name, _, value = line.decode("ascii").partition(":")
        value = value.lstrip(" \t")
        message.set_raw(name, value)  # what the compat32 parser stores, unchanged
        fields.append((name, value))
        first.setdefault(name.lower(), value)
    message.set_payload("")  # what the parser leaves after the blank line
    status = int(status_line.group(1))
    reason = (status_line.group(2) or b"").decode("ascii").strip()
    encoding = first.get("transfer-encoding")
    chunked = encoding is not None and encoding.lower() == "chunked"
    connection = first.get("connection")
    will_close = connection is not None and "close" in connection.lower()
    length = None if chunked else _length(first.get("content-length"))
    if status in _NO_BODY:
        length = 0
    if not will_close and not chunked and length is None:
        will_close = True
    coding = first.get("content-encoding", "").strip().lower()
    bare = chunked and coding in ("", "identity") and "set-cookie" not in first
    return PlainHead(
        status, reason, message, chunked, length, will_close, tuple(fields), size, bare
    )


def _length(value: str | None) -> int | None:
    """``Content-Length`` as http.client reads it: a non-negative int, else unknown."""
    if not value:
        return None
    try:
        length = int(value)
    except ValueError:
        return None
    return length if length >= 0 else None
