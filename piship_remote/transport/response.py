"""Response reading: an HTTP response whose body is read on demand, under the call's rules.

Every read checks the call's cancel and deadline, maps a failure to
:class:`~piship_remote.transport.failures.TransportError` and ends the call (the
connection goes back to the pool) once the body is complete. Bodies are read in
windows: :meth:`HttpResponse.json_object` up to its size limit, and
:meth:`HttpResponse.failure` a short redacted start of an error body.
"""

from __future__ import annotations

import contextlib
import json as jsonlib
import re
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.model.redact import Redactor
from piship_remote.transport._connection import Call
from piship_remote.transport._dechunk import Dechunker
from piship_remote.transport._streamed_response import Raw, StreamedResponse
from piship_remote.transport._urllib3_internals import chunked_source
from piship_remote.transport.failures import TransportError

__all__ = [
    "FAILURE_WINDOW",
    "HttpResponse",
    "failure_line",
    "json_object_of",
    "json_of",
    "window_text",
]

# The largest single read of a body: big enough that streaming hundreds of MiB costs
# few Python-level iterations, while read1() still returns whatever has arrived.
CHUNK = 1024 * 1024
# What a non-streamed request reads before returning; a small body (the usual control-
# plane answer) is then complete and its connection already back in the pool.
EAGER_BYTES = 64 * 1024
# How long finish() waits for the rest of a body (a stream's chunked terminator).
_FINISH_WAIT = 0.25
# How much of an error body failure() looks at before cutting it to 300 characters.
FAILURE_WINDOW = 4096
_FAILURE_CHARS = 300
_WHITESPACE = re.compile(r"\s+")
Read = TypeVar("Read")


def window_text(body: bytes, limit: int) -> str:
    """``body`` decoded; when it fills a ``limit``-byte read window, without its last word.

    The window may cut a secret in two, and a cut secret no longer matches the
    redactor: the word the cut runs through is dropped before redaction.
    """
    text = body.decode("utf-8", "replace")
    if len(body) < limit or text[-1:].isspace():
        return text
    words = text.rsplit(None, 1)
    return words[0] if len(words) == 2 else ""


def json_of(body: bytes, max_bytes: int) -> Any:
    """``body`` parsed as JSON; ``ValueError`` when it is over ``max_bytes`` or not JSON."""
    if len(body) > max_bytes:
        raise ValueError("the response is too large")
    try:
        return jsonlib.loads(body)
    except (ValueError, RecursionError):
        pass
    # Raised outside the handler and without the body, so neither this frame nor a
    # chained context (the parser's frames) holds what the server sent.
    del body
    raise ValueError("the response is not JSON")


def json_object_of(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else ``ValueError``."""
    if isinstance(value, dict):
        return value
    del value  # what a hostile server sent (an echoed credential) stays out of the traceback
    raise ValueError("the response is not a JSON object")


def failure_line(status: int, body: bytes, redactor: Redactor) -> str:
    """``HTTP <status>``, plus ``: <start of the body>`` (one line, redacted) if any."""
    text = _WHITESPACE.sub(" ", window_text(body[:FAILURE_WINDOW], FAILURE_WINDOW)).strip()
    # Redacted before cutting, so a secret across the cut cannot leak its start.
    detail = redactor.redact(text)[:_FAILURE_CHARS].strip()
    return f"HTTP {status}: {detail}" if detail else f"HTTP {status}"


class HttpResponse:
    """A response whose body is read on demand, under the call's cancel and limits.

    Use it as a context manager, or call :meth:`close`; :meth:`json_object`,
    :meth:`failure` and a finished :meth:`iter_raw` close it themselves::

        response = transport.request("POST", url, json=body, stream=True, cancel=token)
        if response.status != 200:
            raise RuntimeError(response.failure())
        for chunk in response.iter_raw():
            reader.push(chunk)
    """

    status: int
    headers: Mapping[str, str]

    def __init__(self, raw: Raw, call: Call) -> None:
        self.status = raw.status
        self.headers = raw.headers
        self._raw = raw
        self._call = call
        self._buffer = bytearray()
        self._done = False
        self._body: Dechunker | None = None
        encoding = self.headers.get("content-encoding", "").strip().lower()
        self._decode = encoding not in ("", "identity")
        if call.stream:
            self._set_socket_timeout(call.idle_timeout)

    def __enter__(self) -> HttpResponse:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def json_object(self, max_bytes: int = 1 << 20) -> dict[str, Any]:
        """Read and parse the body as a JSON object of at most ``max_bytes`` bytes.

        Raises ``ValueError`` (``the response is too large``, ``... is not JSON``,
        ``... is not a JSON object``), :class:`TransportError` or ``CommandCancelled``.
        """
        return json_object_of(self.json_value(max_bytes))

    def json_value(self, max_bytes: int = 1 << 20) -> Any:
        """Read and parse the body as any JSON value of at most ``max_bytes`` bytes."""
        try:
            return json_of(self._read_upto(max_bytes + 1), max_bytes)
        finally:
            self.close()

    def failure(self) -> str:
        """``HTTP <status>``, plus ``: <start of the body>`` (one line, redacted) if any."""
        try:
            body = self._read_upto(FAILURE_WINDOW)
        except TransportError:
            body = bytes(self._buffer)
        finally:
            self.close()
        return failure_line(self.status, body, self._call.redactor)

    def iter_raw(self) -> Iterator[bytes | memoryview]:
        """The body's bytes as they arrive (each chunk at most 1 MiB).

        Raises ``CommandCancelled`` when the call's cancel fires and
        :class:`TransportError` on a drop, a passed deadline or ``idle_timeout``.
        """
        if self._buffer:
            chunk = bytes(self._buffer)
            self._buffer.clear()
            yield chunk
        body = self._chunked_body()
        if body is not None:
            yield from self._iter_chunked(body)
            return
        while not self._done:
            chunk = self._read(CHUNK)
            if chunk:
                yield chunk

    def finish(self, limit: int = EAGER_BYTES, wait: float = _FINISH_WAIT) -> None:
        """Read what is left of the body (the chunked terminator after a stream's last
        frame) so the connection goes back to the pool, then close.

        Only up to ``limit`` bytes arriving within ``wait`` seconds are read; a body
        that does not end by then costs its connection, nothing more.
        """
        try:
            if not self._done and not self._call.scope.cancelled:
                self._set_socket_timeout(wait)
                read = 0
                for chunk in self.iter_raw():
                    read += len(chunk)
                    if read > limit:
                        break
        except (PiShipError, CommandCancelled):
            pass  # the connection is spent; close() below releases it
        finally:
            self.close()

    def _chunked_body(self) -> Dechunker | None:
        """A de-chunker reading a stream's body directly, if the response allows it.

        http.client reads one chunk per call and at most one chunk's rest per read1;
        reading the connection's buffered reader directly takes everything that has
        arrived (many 32 KiB frames) in one read.
        """
        if self._body is not None:
            return self._body
        if not self._call.stream or self._decode or self._done:
            return None
        raw = self._raw
        source = chunked_source(raw.inner if isinstance(raw, StreamedResponse) else raw)
        if source is None:
            return None  # not chunked, or reading already began through http.client
        self._body = Dechunker(*source)
        return self._body

    def _iter_chunked(self, body: Dechunker) -> Iterator[bytes | memoryview]:
        call = self._call
        while not self._done:
            self._check_cancelled()
            pieces = self._guarded_read(lambda n: body.feed(body.fp.read1(n)), CHUNK)
            if body.done:
                self._done = True
                if body.finish():
                    self._raw.close()  # bytes after the body: the connection is unusable
                self._raw.release_conn()
                call.finish()
            yield from pieces

    def close(self) -> None:
        """Release the connection (back to the pool only if the body was fully read)."""
        if not self._done:
            self._done = True
            self._raw.close()  # the body was not read to the end: the connection is spent
            self._raw.release_conn()
        self._call.finish()

    def _read_upto(self, size: int) -> bytes:
        while len(self._buffer) < size and not self._done:
            self._buffer += self._read(min(CHUNK, size - len(self._buffer)))
        return bytes(self._buffer[:size])

    def _read(self, size: int) -> bytes:
        """One read of up to ``size`` bytes: whatever has arrived, ``b""`` at the end."""
        call = self._call
        self._check_cancelled()
        if not call.stream and call.scope.deadline.bounded:
            remaining = call.scope.remaining()
            if remaining is None or remaining <= 0:
                self.close()
                raise call.failed("timed out")
            self._set_socket_timeout(remaining)
        data = self._guarded_read(lambda n: self._raw.read1(n, decode_content=self._decode), size)
        if not data:
            self._done = True
            self._raw.release_conn()
            call.finish()
        return data

    def _check_cancelled(self) -> None:
        if self._call.scope.cancelled:
            self.close()
            raise CommandCancelled()

    def _guarded_read(self, read: Callable[[int], Read], size: int) -> Read:
        """``read(size)``, its failure mapped to our errors, then the cancel checked."""
        try:
            data = read(size)
        except BaseException as exc:
            self.close()
            mapped = self._call.error(exc)
            if mapped is exc:
                raise
            raise mapped from None
        self._check_cancelled()  # a shut-down socket can look like a clean end
        return data

    def _set_socket_timeout(self, timeout: float | None) -> None:
        sock = self._call.scope.socket
        if sock is not None:
            with contextlib.suppress(OSError):  # already closed: the next read reports it
                sock.settimeout(timeout)
