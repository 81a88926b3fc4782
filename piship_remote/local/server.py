"""One threaded loopback HTTP/1.1 server, the base of the local service and the test doubles.

A router turns each :class:`Request` into a :class:`Reply`; a reply with a
``stream`` is sent chunk by chunk as the iterator yields (or, when the reply names
a ``Content-Length``, as raw bytes), so Connect frames reach the client as they
are produced::

    def route(request: Request) -> Reply:
        if request.path == "/hang":
            server.wait()                    # until close() releases it
            raise DropConnection             # the client sees the connection cut
        return Reply(200, b"{}", "application/json")

    with HttpServer(route, record=True) as server:   # bound and serving on 127.0.0.1
        ...                                  # server.url; server.requests in arrival order

``screen(head)`` runs on the request line and headers alone, before any body byte
is read: a reply it returns is sent and the connection closed (how the local
service refuses a request without its key). :class:`Limits` bounds what a client
can hold: the size of the head and of the body, how long a read may stall or a
connection idle, and how many connections are open at once (when full, the
longest-idle connection is closed to admit a new one, else the new one gets an
immediate 503).

Threads: ``<prefix>http`` accepts, ``<prefix>conn-N`` serves one connection; all
daemons, all joined by :meth:`HttpServer.close`, which also releases every
:meth:`HttpServer.wait` and cuts every open connection.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import logging
import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import urlsplit

import attrs

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "DropConnection",
    "Head",
    "HttpServer",
    "Limits",
    "Recorded",
    "Reply",
    "Request",
    "Router",
    "Screen",
]

MAX_BODY_BYTES = 16 * 1024 * 1024 + 5
MAX_HEADER_BYTES = 64 * 1024
WRITE_TIMEOUT = 30.0
POLL_INTERVAL = 0.02
ADMIT_WAIT = 0.2
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_READ_PIECE = 64 * 1024

_log = logging.getLogger("piship_remote.http")
_S = TypeVar("_S", bound="HttpServer")


@attrs.frozen
class Head:
    """A request before its body: ``target`` as sent (query included), ``path`` without it."""

    method: str
    target: str
    path: str
    headers: Mapping[str, str]
    """Header names lower-cased."""


@attrs.frozen
class Request:
    """A whole request: ``path`` without the query, ``headers`` with lower-case names."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    target: str = ""
    """The request target as sent, query included."""


@attrs.frozen
class Reply:
    """An answer: a whole ``body``, or a ``stream`` of chunks sent as they come."""

    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    stream: Iterator[bytes] | None = None


@attrs.frozen
class Recorded:
    """One request as it arrived: ``path`` includes the query string, header names are lower-case.

    >>> Recorded("GET", "/a?b=1", {"accept": "*/*"}, b"").path
    '/a?b=1'
    """

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (``ValueError`` when it is not JSON)."""
        return json.loads(self.body)


@attrs.frozen
class Limits:
    """What one client may hold; ``None`` means unbounded."""

    header_bytes: int = MAX_HEADER_BYTES
    """The request line and headers together."""
    body_bytes: int = MAX_BODY_BYTES
    read_timeout: float | None = None
    """A read that stalls this long, or a connection idle this long, is dropped."""
    body_seconds: float | None = None
    """The whole body must arrive within this (a trickling client is dropped)."""
    connections: int | None = None
    """Open connections at most (one thread each)."""


class DropConnection(Exception):
    """Raise in a router (or a reply's stream) to cut the connection without answering."""


Router = Callable[[Request], Reply]
Screen = Callable[[Head], "Reply | None"]


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpServer:
    """A bound loopback server; :meth:`start` serves, :meth:`close` stops (or use ``with``).

    ``record`` keeps every request (as :class:`Recorded`, before the router runs);
    ``keep_alive`` False closes each connection after one answer.
    """

    def __init__(
        self,
        router: Router,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        screen: Screen | None = None,
        limits: Limits = Limits(),
        record: bool = False,
        keep_alive: bool = True,
        thread_prefix: str = "piship-http-",
        join_timeout: float = 5.0,
    ) -> None:
        self.router = router
        self.screen = screen
        self.limits = limits
        self.keep_alive = keep_alive
        self._record = record
        self._prefix = thread_prefix
        self._join_timeout = join_timeout
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._requests: list[Recorded] = []
        self._waiting: set[threading.Event] = set()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._idle_since: dict[socket.socket, float] = {}
        self._counter = itertools.count(1)
        self._closing = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._listener = _Listener(self, (host, port))
        bracketed = f"[{host}]" if ":" in host else host
        self.url = f"http://{bracketed}:{self.port}"
        """Base URL without a trailing slash, e.g. ``http://127.0.0.1:40123``."""

    @property
    def port(self) -> int:
        return int(self._listener.server_address[1])

    def start(self) -> None:
        """Accept connections on a ``<prefix>http`` thread."""
        self._thread = threading.Thread(
            target=self._listener.serve_forever,
            kwargs={"poll_interval": POLL_INTERVAL},
            name=f"{self._prefix}http",
            daemon=True,
        )
        self._thread.start()

    # ---- what tests read -------------------------------------------------------------

    @property
    def requests(self) -> list[Recorded]:
        """A snapshot of every request so far (with ``record``), in arrival order."""
        with self._lock:
            return list(self._requests)

    def find(self, method: str | None = None, path: str | None = None) -> list[Recorded]:
        """Recorded requests with this method and/or exact path (query included)."""
        return [r for r in self.requests if _matches(r, method, path)]

    def count(self, method: str | None = None, path: str | None = None) -> int:
        """How many requests :meth:`find` would return."""
        return len(self.find(method, path))

    def wait_for(
        self, method: str | None = None, path: str | None = None, *, timeout: float = 5.0
    ) -> Recorded:
        """Block until a matching request has arrived; return the first (``TimeoutError`` else)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for recorded in self._requests:
                    if _matches(recorded, method, path):
                        return recorded
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no {method or 'request'} {path or ''} arrived".strip())
                self._changed.wait(remaining)

    # ---- what routers use ------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """True once :meth:`close` has started."""
        return self._closing.is_set()

    def wait(self, event: threading.Event | None = None, timeout: float | None = None) -> bool:
        """Hold a request until ``event`` is set or the server closes (``None``: until close).

        True when the event ended the wait, False on close or timeout; :meth:`close`
        sets every event waited on, so no held request outlives its server.
        """
        gate = event if event is not None else threading.Event()
        with self._lock:
            if self._closed:
                return False
            self._waiting.add(gate)
        try:
            gate.wait(timeout)
        finally:
            with self._lock:
                self._waiting.discard(gate)
        return gate.is_set() and not self.closing

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Release every held request, stop listening, cut every connection. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closing.set()
            gates = list(self._waiting)
            connections = dict(self._connections)
        for gate in gates:
            gate.set()
        if self._thread is not None:
            self._listener.shutdown()
            self._thread.join(self._join_timeout)
        self._listener.server_close()
        for connection in connections:
            _cut(connection)
        deadline = time.monotonic() + self._join_timeout
        for thread in connections.values():
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self: _S) -> _S:
        if self._thread is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- connections -----------------------------------------------------------------

    def _admit(self, connection: socket.socket, address: Any) -> None:
        thread = threading.Thread(
            target=self._serve,
            args=(connection, address),
            name=f"{self._prefix}conn-{next(self._counter)}",
            daemon=True,
        )
        with self._changed:
            admitted = not self._closed and self._make_room()
            if admitted:
                self._connections[connection] = thread
        if not admitted:
            _refuse(connection)
            return
        thread.start()

    def _make_room(self) -> bool:
        """With the lock held: True once a connection may open (closing the longest idle)."""
        cap = self.limits.connections
        if cap is None or len(self._connections) < cap:
            return True
        if self._idle_since:
            _cut(min(self._idle_since, key=self._idle_since.__getitem__))
        deadline = time.monotonic() + ADMIT_WAIT
        while len(self._connections) >= cap and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.wait(remaining)
        return not self._closed

    def _serve(self, connection: socket.socket, address: Any) -> None:
        try:
            self._listener.finish_request(connection, address)
        except Exception:  # one broken connection must not stop the server
            _log.debug("connection from %s failed", address, exc_info=True)
        finally:
            with self._changed:
                self._connections.pop(connection, None)
                self._idle_since.pop(connection, None)
                self._changed.notify_all()
            self._listener.shutdown_request(connection)

    def _set_idle(self, connection: socket.socket, idle: bool) -> None:
        with self._lock:
            if idle:
                self._idle_since[connection] = time.monotonic()
            else:
                self._idle_since.pop(connection, None)

    def _arrived(self, request: Request) -> None:
        if not self._record:
            return
        recorded = Recorded(request.method, request.target, dict(request.headers), request.body)
        with self._changed:
            self._requests.append(recorded)
            self._changed.notify_all()


def _matches(recorded: Recorded, method: str | None, path: str | None) -> bool:
    return (method is None or recorded.method == method) and (path is None or recorded.path == path)


def _cut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


def _refuse(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.setblocking(False)
        connection.send(_BUSY)
    _cut(connection)
    connection.close()


class _Listener(socketserver.TCPServer):
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, owner: HttpServer, address: tuple[str, int]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.owner = owner
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.owner._admit(request, client_address)


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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Listener
    owner: HttpServer

    def setup(self) -> None:
        self.owner = self.server.owner
        super().setup()
        # StreamRequestHandler's class-wide ``timeout``, per server instead.
        self.connection.settimeout(self.owner.limits.read_timeout)

    def handle_one_request(self) -> None:
        try:
            self._handle_one()
        except TimeoutError:  # a stalled read: drop the connection
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        _log.debug("%s " + format, self.address_string(), *args)

    def _handle_one(self) -> None:
        limit = self.owner.limits.header_bytes
        self.owner._set_idle(self.connection, True)
        try:
            self.raw_requestline = self.rfile.readline(limit + 1)
        finally:
            self.owner._set_idle(self.connection, False)
        if not self.raw_requestline:
            self.close_connection = True
            return
        if len(self.raw_requestline) > limit:
            self.requestline, self.request_version, self.command = "", "", ""
            self.send_error(414)
            self.close_connection = True
            return
        rfile = self.rfile
        self.rfile = _HeadBudget(rfile, limit - len(self.raw_requestline))  # type: ignore[assignment]
        try:
            parsed = self.parse_request()
        finally:
            self.rfile = rfile
        if parsed:
            self._dispatch()
            self.wfile.flush()

    def _dispatch(self) -> None:
        headers = {name.lower(): value for name, value in self.headers.items()}
        head = Head(self.command, self.path, urlsplit(self.path).path, headers)
        rejected = self.owner.screen(head) if self.owner.screen is not None else None
        if rejected is not None:
            self.close_connection = True  # its body, if any, is never read
            self._send(rejected)
            return
        try:
            body = self._body()
        except _Refused as e:
            self.close_connection = True
            self._send(Reply(e.status, str(e).encode(), "text/plain; charset=utf-8"))
            return
        request = Request(head.method, head.path, headers, body, head.target)
        self.owner._arrived(request)
        try:
            reply = self.owner.router(request)
        except DropConnection:
            self._drop()
            return
        except Exception:  # answer 500 rather than drop the connection
            _log.exception("the server failed on %s %s", self.command, request.path)
            reply = Reply(500, b'{"code":500,"message":"internal error"}', "application/json")
        self._send(reply)

    # ---- the body ----------------------------------------------------------------

    def _body(self) -> bytes:
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
        """Send ``chunks``; once the client is gone, keep consuming them unsent."""
        # A client that stops reading must not stall the stream's producer forever.
        self.connection.settimeout(WRITE_TIMEOUT)
        try:
            for chunk in chunks:
                if alive and chunk:
                    alive = self._write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
            if alive and chunked:
                alive = self._write(b"0\r\n\r\n")
        except DropConnection:
            alive = False
            self._drop()
        except Exception:
            alive = False
            _log.exception("the server's stream failed on %s %s", self.command, self.path)
            self._drop()
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

    def _drop(self) -> None:
        self.close_connection = True
        _cut(self.connection)
