"""A small threaded HTTP/1.1 server: keep-alive, chunked streaming, no dependencies.

It turns each request into a :class:`Request` and writes back the :class:`Reply`
a router returns; a reply with a ``stream`` is sent chunk by chunk as the
iterator yields, so Connect frames reach the client as they are produced::

    def route(request: Request) -> Reply:
        return Reply(200, b"{}", "application/json")

    server = HttpServer(("127.0.0.1", 0), route)
    server.start()          # piship-local-http accepts; piship-local-conn-N serve
    ...
    server.stop()           # closes every connection and joins every thread

If the client goes away mid-stream, the rest of the stream is still consumed
(and discarded), so what produces it runs to its own end.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any
from urllib.parse import urlsplit

import attrs

__all__ = ["MAX_BODY_BYTES", "HttpServer", "Reply", "Request"]

MAX_BODY_BYTES = 16 * 1024 * 1024 + 5
WRITE_TIMEOUT = 30.0
JOIN_TIMEOUT = 5.0

_log = logging.getLogger("piship_remote.local")


@attrs.frozen
class Request:
    """A request: ``path`` without the query, ``headers`` with lower-case names."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


@attrs.frozen
class Reply:
    """An answer: a whole ``body``, or a ``stream`` of chunks sent as they come."""

    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    stream: Iterator[bytes] | None = None


Router = Callable[[Request], Reply]


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpServer(HTTPServer):
    """The listening socket and one ``piship-local-conn-N`` thread per connection."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], router: Router) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.router = router
        self._lock = threading.Lock()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._counter = itertools.count(1)
        self._thread: threading.Thread | None = None
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would look up the host's FQDN, which can stall on DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def start(self) -> None:
        """Accept connections on a ``piship-local-http`` thread."""
        self._thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="piship-local-http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, close every connection, and join the threads."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join(JOIN_TIMEOUT)
        self.server_close()
        with self._lock:
            connections = dict(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for thread in connections.values():
            thread.join(JOIN_TIMEOUT)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve,
            args=(request, client_address),
            name=f"piship-local-conn-{next(self._counter)}",
            daemon=True,
        )
        with self._lock:
            self._connections[request] = thread
        thread.start()

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # one broken connection must not stop the server
            _log.debug("connection from %s failed", client_address, exc_info=True)
        finally:
            with self._lock:
                self._connections.pop(request, None)
            self.shutdown_request(request)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HttpServer

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s " + format, self.address_string(), *args)

    def _dispatch(self) -> None:
        try:
            body = self._body()
        except _BadRequest as e:
            self.close_connection = True
            self._send(Reply(e.status, str(e).encode(), "text/plain; charset=utf-8"))
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        request = Request(self.command, urlsplit(self.path).path, headers, body)
        try:
            reply = self.server.router(request)
        except Exception:  # answer 500 rather than drop the connection
            _log.exception("the local service failed on %s %s", self.command, request.path)
            reply = Reply(500, b'{"code":500,"message":"internal error"}', "application/json")
        self._send(reply)

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._chunked_body()
        length = self.headers.get("Content-Length")
        if length is None:
            return b""
        if not length.isdigit():
            raise _BadRequest(400, "bad Content-Length")
        if int(length) > MAX_BODY_BYTES:
            raise _BadRequest(413, "request body too large")
        return self._read(int(length))

    def _chunked_body(self) -> bytes:
        body = bytearray()
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _BadRequest(400, "bad chunk size") from None
            if size == 0:
                break
            if len(body) + size > MAX_BODY_BYTES:
                raise _BadRequest(413, "request body too large")
            body += self._read(size)
            self.rfile.readline(16)
        while self.rfile.readline(8192) not in (b"\r\n", b"\n", b""):
            pass  # trailers
        return bytes(body)

    def _read(self, size: int) -> bytes:
        data = self.rfile.read(size)
        if len(data) != size:
            raise _BadRequest(400, "the request body ended early")
        return data

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        if reply.content_type is not None:
            self.send_header("Content-Type", reply.content_type)
        for name, value in reply.headers:
            self.send_header(name, value)
        if reply.stream is None:
            self.send_header("Content-Length", str(len(reply.body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(reply.body)
            return
        self.send_header("Transfer-Encoding", "chunked")
        try:
            self.end_headers()
        except OSError:
            self._stream(reply.stream, alive=False)
        else:
            self._stream(reply.stream, alive=True)

    def _stream(self, chunks: Iterator[bytes], *, alive: bool) -> None:
        """Send ``chunks``; once the client is gone, keep consuming them unsent."""
        # A client that stops reading must not stall the stream's producer forever.
        self.connection.settimeout(WRITE_TIMEOUT)
        try:
            for chunk in chunks:
                if alive and chunk:
                    alive = self._write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            if alive:
                alive = self._write(b"0\r\n\r\n")
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if alive:
            self.connection.settimeout(None)
        else:
            self.close_connection = True

    def _write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            return False
        return True
