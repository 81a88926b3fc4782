"""A streaming ``multipart/form-data`` reader: parts one after another, each read in pieces.

Memory stays bounded by the piece size whatever the parts' sizes::

    reader = MultipartReader(request.stream, boundary_of(content_type))
    while (part := reader.next_part()) is not None:
        while piece := reader.read(65536):
            sink.write(piece)

A part not read to its end is skipped by :meth:`MultipartReader.next_part`.
:class:`MultipartError` names what is malformed.
"""

from __future__ import annotations

import re

import attrs

from piship_remote._http_server.messages import BodyReader

__all__ = ["MultipartError", "MultipartReader", "Part", "boundary_of"]

MAX_PART_HEAD = 16 * 1024
_PIECE = 64 * 1024
_BOUNDARY = re.compile(r'boundary=(?:"([^"]{1,200})"|([^;\s]{1,200}))', re.IGNORECASE)
_PARAM = re.compile(r';\s*([A-Za-z*]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^;\s]*))')


class MultipartError(ValueError):
    """The body is not well-formed multipart."""


@attrs.frozen
class Part:
    """A part's form ``name`` and ``filename`` (``None`` when its header has none)."""

    name: str | None
    filename: str | None


def boundary_of(content_type: str) -> bytes:
    """The boundary a ``multipart/…`` Content-Type names; :class:`MultipartError` without one."""
    match = _BOUNDARY.search(content_type)
    if match is None:
        raise MultipartError("no multipart boundary in the Content-Type")
    return (match.group(1) or match.group(2)).encode("latin-1")


class MultipartReader:
    """Reads the parts of a multipart body from ``body`` as they arrive."""

    def __init__(self, body: BodyReader, boundary: bytes) -> None:
        self._body = body
        self._delimiter = b"\r\n--" + boundary
        self._buffer = bytearray(b"\r\n")  # so the first boundary matches the delimiter
        self._in_part = False
        self._done = False
        self._eof = False

    def next_part(self) -> Part | None:
        """The next part's head (skipping what is left of the current one), ``None`` at the end."""
        while self._in_part:
            self.read(_PIECE)
        if self._done:
            return None
        self._expect_delimiter()
        if self._done:
            return None
        head = self._head()
        self._in_part = True
        return _part(head)

    def read(self, size: int) -> bytes:
        """Up to ``size`` bytes of the current part; ``b""`` at its end."""
        if not self._in_part:
            return b""
        while True:
            at = self._buffer.find(self._delimiter)
            if at >= 0:
                if at == 0:
                    self._in_part = False
                    return b""
                take = min(at, size)
            else:
                # Keep a tail that may be the start of the delimiter.
                take = min(len(self._buffer) - len(self._delimiter) + 1, size)
            if take > 0:
                piece = bytes(self._buffer[:take])
                del self._buffer[:take]
                return piece
            self._fill()

    def _expect_delimiter(self) -> None:
        while len(self._buffer) < len(self._delimiter) + 2:
            self._fill()
        at = self._buffer.find(self._delimiter)
        if at != 0:
            raise MultipartError("the multipart body does not start with its boundary")
        del self._buffer[: len(self._delimiter)]
        ending = bytes(self._buffer[:2])
        del self._buffer[:2]
        if ending == b"--":
            self._done = True
        elif ending != b"\r\n":
            raise MultipartError("a multipart boundary is not followed by a line end")

    def _head(self) -> bytes:
        while (end := self._buffer.find(b"\r\n\r\n")) < 0:
            if len(self._buffer) > MAX_PART_HEAD:
                raise MultipartError("a multipart part's headers are too long")
            self._fill()
        head = bytes(self._buffer[:end])
        # The part's data starts after the blank line; the delimiter search needs the CRLF kept.
        del self._buffer[: end + 4]
        return head

    def _fill(self) -> None:
        if self._eof:
            raise MultipartError("the multipart body ended before its closing boundary")
        piece = self._body.read(_PIECE)
        if not piece:
            self._eof = True
            raise MultipartError("the multipart body ended before its closing boundary")
        self._buffer += piece


def _part(head: bytes) -> Part:
    name = filename = None
    for line in head.decode("utf-8", errors="replace").split("\r\n"):
        field, _, value = line.partition(":")
        if field.strip().lower() != "content-disposition":
            continue
        for match in _PARAM.finditer(";" + value.split(";", 1)[-1] if ";" in value else ""):
            key = match.group(1).lower()
            text = match.group(2) if match.group(2) is not None else match.group(3)
            text = re.sub(r"\\(.)", r"\1", text)
            if key == "name":
                name = text
            elif key == "filename":
                filename = text
    return Part(name, filename)
