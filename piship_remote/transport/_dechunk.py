"""De-chunking: a chunked HTTP body (RFC 9112 section 7.1) decoded from reads of any size.

A stream's body is read straight from the connection's buffered reader, taking every
chunk that has arrived in one read, and decoded here::

    body = Dechunker(inner, fp)
    for piece in body.feed(fp.read1(1 << 20)):   # views into what was read, no copy
        consume(piece)
"""

from __future__ import annotations

import http.client
import io

import urllib3.exceptions

__all__ = ["Dechunker"]

# The longest chunk-size or trailer line of a chunked body.
_MAX_CHUNK_LINE = 4096


class Dechunker:
    """A chunked HTTP body (RFC 9112 §7.1) decoded from reads of any size.

    :meth:`feed` returns views of the chunk data in what was read (no copy);
    ``done`` once the last chunk and its trailer section were read. Malformed
    framing or an early end raises ``urllib3.exceptions.ProtocolError``.
    """

    __slots__ = ("_extra", "_inner", "_left", "_line", "_state", "done", "fp")

    _SIZE, _DATA, _CRLF, _TRAILER = range(4)

    def __init__(self, inner: http.client.HTTPResponse, fp: io.BufferedReader) -> None:
        self.fp = fp
        self.done = False
        self._inner = inner
        self._state = self._SIZE
        self._left = 0
        self._line = bytearray()
        self._extra = False

    def feed(self, data: bytes) -> list[memoryview]:
        if not data:
            raise urllib3.exceptions.ProtocolError("the chunked body ended early")
        view = memoryview(data)
        pieces: list[memoryview] = []
        position, size = 0, len(data)
        while position < size and not self.done:
            if self._state == self._DATA:
                end = min(position + self._left, size)
                pieces.append(view[position:end])
                self._left -= end - position
                position = end
                if not self._left:
                    self._state = self._CRLF
                continue
            newline = data.find(b"\n", position)
            if newline < 0:
                self._line += view[position:]
                if len(self._line) > _MAX_CHUNK_LINE:
                    raise urllib3.exceptions.ProtocolError("a chunk line is too long")
                break
            line = bytes(self._line) + data[position : newline + 1]
            self._line.clear()
            position = newline + 1
            self._on_line(line)
        self._extra = self.done and position < size
        return pieces

    def finish(self) -> bool:
        """Mark http.client's response closed (its connection is free); ``True`` if
        the connection must not be reused (bytes followed the body, or the server
        said it closes the connection)."""
        self._inner.close()
        return self._extra or bool(self._inner.will_close)

    def _on_line(self, line: bytes) -> None:
        text = line.rstrip(b"\r\n")
        if self._state == self._CRLF:
            if text:
                raise urllib3.exceptions.ProtocolError("a chunk did not end with CRLF")
            self._state = self._SIZE
        elif self._state == self._TRAILER:
            self.done = not text
        else:
            try:
                size = int(text.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise urllib3.exceptions.ProtocolError("a chunk size is not valid") from None
            if size < 0:
                raise urllib3.exceptions.ProtocolError("a chunk size is not valid")
            self._left = size
            self._state = self._DATA if size else self._TRAILER
