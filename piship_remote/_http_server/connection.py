"""One connection of the HTTP server: read each request's head and body, route it, answer.

:class:`ConnectionHandler` is the ``socketserver`` handler :class:`HttpServer` runs on
each connection's thread. It reads the head within the head budget (its size, and its
time: each read waits at most what is left of ``head_seconds`` from the head's first
byte), asks the server's ``screen`` before any body byte, then either reads the whole body (within
the body limits) or, for a route the server streams, hands the router a
:class:`StreamedBody` that reads ``Content-Length`` or chunked bodies as the router
asks. A streamed body the router left unread closes the connection after the answer.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import logging
import socket
import socketserver
import ssl
import struct
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from piship_remote._http_server.messages import (
    DropConnection,
    Head,
    Reply,
    Request,
    ResetConnection,
    Upstream,
)
from piship_remote._http_server.tunnel import splice

if TYPE_CHECKING:
    from piship_remote._http_server.server import HttpServer, _Listener

__all__ = ["ConnectionHandler", "StreamedBody", "cut", "reset"]

WRITE_TIMEOUT = 30.0
_READ_PIECE = 64 * 1024

_log = logging.getLogger("piship_remote.http")


def cut(connection: socket.socket) -> None:
    """Shut both directions of ``connection`` down (the peer sees the connection end)."""
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


def reset(connection: socket.socket) -> None:
    """Close ``connection`` with a TCP reset: no linger, so the unsent rest is dropped and the
    peer reads "connection reset" instead of an end (its file objects must be closed first,
    or the close waits for them)."""
    with contextlib.suppress(OSError):
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()


def _no_delay(connection: socket.socket) -> None:
    """Send each write at once, as Go's servers (envd's) do: an answer written in two
    pieces (head, then body) must not wait for the client's delayed ACK of the first."""
    try:
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass  # not TCP (a Unix socket): nothing to delay


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _HeadBudget:
    """``rfile`` for header parsing: refuses a head longer than its budget."""

    def __init__(self, rfile: Any, budget: int) -> None:
        self._rfile = rfile
        self._left = budget

    def readline(self, size: int = -1) -> bytes:
        limit = self._left + 1 if size < 0 else min(size, self._left + 1)
        line: bytes = self._rfile.readline(limit)
        self._left -= len(line)
        if self._left < 0:
            raise http.client.LineTooLong("request headers")
        return line


class _PacedReads(socket.SocketIO):
    """A connection's reads; while a head is timed, each read waits at most what is left of
    the head's time, which starts with its first byte (the wait for that byte is the idle
    one)."""

    def __init__(self, connection: socket.socket) -> None:
        super().__init__(connection, "rb")
        self._connection = connection
        self._head_seconds: float | None = None
        self._read_timeout: float | None = None
        self._deadline: float | None = None

    def time_head(self, seconds: float | None, read_timeout: float | None) -> None:
        """Time the next head (``None``: untimed); :meth:`end_head` once it is read."""
        self._head_seconds, self._read_timeout, self._deadline = seconds, read_timeout, None

    def end_head(self) -> None:
        self._head_seconds = self._deadline = None

    def readinto(self, buffer: Any) -> int | None:
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request head took too long")
            step = self._read_timeout
            self._connection.settimeout(left if step is None else min(left, step))
        count = super().readinto(buffer)
        if count and self._head_seconds is not None and self._deadline is None:
            self._deadline = time.monotonic() + self._head_seconds
        return count


class ConnectionHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Listener
    owner: HttpServer
    """The server this connection belongs to."""

    def setup(self) -> None:
        self.owner = self.server.owner
        super().setup()
        self.rfile.close()  # read through _PacedReads instead, buffered the same way
        self._reads = _PacedReads(self.connection)
        self.rfile = io.BufferedReader(self._reads)
        # StreamRequestHandler's class-wide ``timeout``, per server instead.
        self.connection.settimeout(self.owner.limits.read_timeout)
        _no_delay(self.connection)

    def handle_one_request(self) -> None:
        try:
            self._handle_one()
        except TimeoutError:  # a stalled read: drop the connection
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s " + format, self.address_string(), *args)

    def _handle_one(self) -> None:
        limits = self.owner.limits
        limit = limits.header_bytes
        idle = limits.read_timeout if limits.idle_timeout is None else limits.idle_timeout
        self.owner._set_waiting(self.connection, True)
        self.connection.settimeout(idle)
        self._reads.time_head(limits.head_seconds, limits.read_timeout)
        try:
            parsed = self._read_head(limit)
        finally:
            self._reads.end_head()
            self.owner._set_waiting(self.connection, False)
            self.connection.settimeout(limits.read_timeout)
        if parsed:
            self._dispatch()
            self.wfile.flush()

    def _read_head(self, limit: int) -> bool:
        """Read and parse the request line and headers; False when there is no request
        (the connection ended, or the head was refused and answered)."""
        self.raw_requestline = self.rfile.readline(limit + 1)
        if not self.raw_requestline:
            self.close_connection = True
            return False
        # The idle wait is over: the rest of the head comes within read_timeout per read.
        self.connection.settimeout(self.owner.limits.read_timeout)
        if len(self.raw_requestline) > limit:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            self.close_connection = True
            return False
        rfile = self.rfile
        self.rfile = _HeadBudget(rfile, limit - len(self.raw_requestline))  # type: ignore[assignment]
        try:
            return self.parse_request()
        finally:
            self.rfile = rfile

    def _dispatch(self) -> None:
        problem = self._framing_problem()
        if problem is not None:
            self._refuse(_Refused(400, problem))
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        head = Head(
            self.command, self.path, urlsplit(self.path).path, headers, _client_subject(self)
        )
        rejected = self.owner.screen(head) if self.owner.screen is not None else None
        if rejected is not None:
            self.close_connection = True  # its body, if any, is never read
            self._send(rejected)
            return
        upstream = self.owner.tunnel(head) if self.owner.tunnel is not None else None
        if upstream is not None:
            self.close_connection = True
            self.owner._arrived(
                Request(
                    head.method, head.path, headers, b"", head.target, None, head.client_subject
                )
            )
            if isinstance(upstream, Reply):
                self._send(upstream)
            else:
                self._splice(upstream)
            return
        streamed = self.owner.streamed is not None and self.owner.streamed(head)
        try:
            stream = self._streamed_body() if streamed else None
            body = b"" if streamed else self._body()
        except _Refused as e:
            self._refuse(e)
            return
        request = Request(
            head.method, head.path, headers, body, head.target, stream, head.client_subject
        )
        self.owner._arrived(request)
        try:
            reply = self.owner.router(request)
        except DropConnection as e:
            self._drop(e)
            return
        except _Refused as e:  # a streamed body that broke while the router read it
            self._refuse(e)
            return
        except Exception:  # answer 500 rather than drop the connection
            _log.exception("the server failed on %s %s", self.command, request.path)
            reply = Reply(500, b'{"code":500,"message":"internal error"}', "application/json")
        if stream is not None and not stream.exhausted:
            self.close_connection = True  # the unread rest of the body is never read
        self._send(reply)

    def _splice(self, upstream: socket.socket | Upstream) -> None:
        """Hand the connection to ``upstream``, this request's head first (its header
        lines as they arrived, or as an :class:`Upstream` rewrites them)."""
        fields = list(self.headers.items())
        if isinstance(upstream, Upstream):
            fields, upstream = upstream.headers(fields), upstream.socket
        lines = [self.raw_requestline]
        lines += [f"{name}: {value}\r\n".encode("latin-1") for name, value in fields]
        head = b"".join([*lines, b"\r\n"])
        splice(head, self.rfile, self.connection, upstream, name=self.owner.tunnel_name())

    def _refuse(self, refused: _Refused) -> None:
        self.close_connection = True
        self._send(Reply(refused.status, str(refused).encode(), "text/plain; charset=utf-8"))

    # ---- the body ----------------------------------------------------------------

    def _framing_problem(self) -> str | None:
        """Why the body's end is ambiguous (two lengths, or a length beside chunking), if it is:
        a proxy in front could read another request there than this server does."""
        lengths = {value.strip() for value in self.headers.get_all("Content-Length") or ()}
        if len(lengths) > 1:
            return "conflicting Content-Length headers"
        if lengths and self.headers.get_all("Transfer-Encoding"):
            return "Content-Length and Transfer-Encoding together"
        return None

    def _body(self) -> bytes:
        self.owner._set_waiting(self.connection, True)
        try:
            return self._whole_body()
        finally:
            self.owner._set_waiting(self.connection, False)

    def _whole_body(self) -> bytes:
        limits = self.owner.limits
        deadline = None if limits.body_seconds is None else time.monotonic() + limits.body_seconds
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._chunked_body(deadline)
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        if not length.isdigit():
            raise _Refused(400, "bad Content-Length")
        if int(length) > limits.body_bytes:
            raise _Refused(413, "request body too large")
        return self._read(int(length), deadline)

    def _streamed_body(self) -> StreamedBody:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return StreamedBody(self.rfile, None)
        length = self.headers.get("Content-Length", "0")
        if not length.isdigit():
            raise _Refused(400, "bad Content-Length")
        return StreamedBody(self.rfile, int(length))

    def _chunked_body(self, deadline: float | None) -> bytes:
        body = bytearray()
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _Refused(400, "bad chunk size") from None
            if size == 0:
                break
            if len(body) + size > self.owner.limits.body_bytes:
                raise _Refused(413, "request body too large")
            body += self._read(size, deadline)
            self.rfile.readline(16)
        while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return bytes(body)

    def _read(self, size: int, deadline: float | None) -> bytes:
        if deadline is None:
            data: bytes = self.rfile.read(size)
        else:
            data = self._read_by(size, deadline)
        if len(data) != size:
            raise _Refused(400, "the request body ended early")
        return data

    def _read_by(self, size: int, deadline: float) -> bytes:
        data = bytearray()
        read_timeout = self.owner.limits.read_timeout
        while len(data) < size:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request body took too long")
            self.connection.settimeout(left if read_timeout is None else min(left, read_timeout))
            piece = self.rfile.read1(min(size - len(data), _READ_PIECE))
            if not piece:
                break
            data += piece
        self.connection.settimeout(read_timeout)
        return bytes(data)

    # ---- the answer --------------------------------------------------------------

    def _send(self, reply: Reply) -> None:
        if not self.owner.keep_alive:
            self.close_connection = True
        self.send_response(reply.status)
        if reply.content_type is not None:
            self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        if reply.stream is None:
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)
            return
        if reply.send_buffer is not None:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, reply.send_buffer)
        chunked = not any(name.lower() == "content-length" for name, _ in reply.headers)
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        try:
            self.end_headers()
        except OSError:
            self._stream(reply.stream, alive=False, chunked=chunked)
        else:
            self._stream(reply.stream, alive=True, chunked=chunked)

    def _stream(self, chunks: Iterator[bytes], *, alive: bool, chunked: bool) -> None:
        """Send ``chunks``; once the client is gone, stop and close them: their producer
        learns so (a command's output feed stops counting them as received)."""
        # A client that stops reading must not stall the stream's producer forever.
        self.connection.settimeout(WRITE_TIMEOUT)
        try:
            for chunk in chunks if alive else ():
                if chunk:
                    alive = self._write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                if not alive:
                    break
            if alive and chunked:
                alive = self._write(b"0\r\n\r\n")
        except DropConnection as e:
            alive = False
            self._drop(e)
        except Exception:
            alive = False
            _log.exception("the server's stream failed on %s %s", self.command, self.path)
            self._drop(DropConnection())
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if alive:
            self.connection.settimeout(self.owner.limits.read_timeout)
        else:
            self.close_connection = True

    def _write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            return False
        return True

    def _drop(self, how: DropConnection) -> None:
        self.close_connection = True
        if isinstance(how, ResetConnection):
            self.rfile.close()  # the connection's last file object: the close is not deferred
            self.owner.reset(self.connection)
        else:
            cut(self.connection)


class StreamedBody:
    """A request body read on demand: ``length`` bytes, or chunked when ``length`` is None."""

    def __init__(self, rfile: Any, length: int | None) -> None:
        self._rfile = rfile
        self._chunked = length is None
        self._left = 0 if length is None else length
        self._ended = length == 0

    @property
    def exhausted(self) -> bool:
        return self._ended

    def read(self, size: int) -> bytes:
        if self._ended:
            return b""
        if self._left == 0 and self._chunked and not self._next_chunk():
            return b""
        piece: bytes = self._rfile.read1(min(size, self._left, _READ_PIECE))
        if not piece:
            raise _Refused(400, "the request body ended early")
        self._left -= len(piece)
        if self._left == 0:
            if self._chunked:
                self._rfile.readline(16)
            else:
                self._ended = True
        return piece

    def _next_chunk(self) -> bool:
        line = self._rfile.readline(1024)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _Refused(400, "bad chunk size") from None
        if size == 0:
            while self._rfile.readline(8192) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            self._ended = True
            return False
        self._left = size
        return True


def _client_subject(handler: socketserver.StreamRequestHandler) -> str | None:
    """The common name of the client certificate a TLS connection presented and the
    server verified; ``None`` over plain HTTP or without one."""
    connection = handler.connection
    if not isinstance(connection, ssl.SSLSocket):
        return None
    certificate = connection.getpeercert() or {}
    for entry in certificate.get("subject", ()):
        for pair in entry:
            if pair[0] == "commonName":
                return str(pair[1])
    return None
