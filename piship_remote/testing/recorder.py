"""A threaded loopback HTTP server that records every request on arrival.

The base of the test doubles. One handler function answers every request; the
server records ``Recorded(method, path, headers, body)`` under a lock *before*
the handler runs, so a request that hangs, is gated or is dropped is already
visible::

    def handler(request: Request) -> Response:
        if request.path == "/hang":
            server.wait()                      # until close(); then the client sees a drop
        return json_response(200, {"ok": True})

    with RecordingServer(handler) as server:
        requests.get(server.url + "/ping?x=1", timeout=5)
        assert server.requests[0].path == "/ping?x=1"

Handlers may stream (:meth:`RecordingServer.stream`, one flushed HTTP chunk per
item), wait on events that :meth:`RecordingServer.close` releases
(:meth:`RecordingServer.wait`), and drop the connection without answering
(raise :class:`DropConnection`). ``close()`` releases every waiting handler,
force-closes every open connection and returns within a few tens of milliseconds.

Built on ``pytest_httpserver.HTTPServer(threaded=True)`` with werkzeug; the server
thread and every connection thread are daemons named ``piship-double-…``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

import attrs
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response
from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

__all__ = [
    "THREAD_PREFIX",
    "DropConnection",
    "Handler",
    "Recorded",
    "RecordingServer",
    "json_response",
]

THREAD_PREFIX = "piship-double-"
"""Name prefix of every thread the doubles start (exclude it from leak checks)."""

Handler = Callable[[Request], Response]

_LOG = logging.getLogger("piship_remote.testing")
_POLL_INTERVAL = 0.01
_CLOSE_JOIN_BUDGET = 0.05
_S = TypeVar("_S", bound="RecordingServer")


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


class DropConnection(Exception):
    """Raise in a handler (or a streamed body) to close the connection without answering."""


def json_response(status: int, body: Any, *, content_type: str = "application/json") -> Response:
    """A response with ``body`` as compact JSON (``bytes``/``str`` bodies are sent as they are)."""
    if isinstance(body, bytes | str):
        data = body.encode() if isinstance(body, str) else body
    else:
        data = json.dumps(body, separators=(",", ":")).encode()
    return Response(data, status=status, content_type=content_type)


class RecordingServer:
    """A started recording server on ``127.0.0.1``; a context manager that closes it on exit.

    ``handler`` answers every request. Requests are recorded before it runs; an
    exception it raises is logged, kept in :attr:`errors` and answered with an
    empty 500.
    """

    def __init__(self, handler: Handler, *, host: str = "127.0.0.1") -> None:
        self._handler = handler
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._requests: list[Recorded] = []
        self._errors: list[BaseException] = []
        self._waiting: set[threading.Event] = set()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._closing = threading.Event()
        self._closed = False
        self._http = _HttpServer(self, host)
        self._http.start()
        self.url = f"http://{host}:{self._http.port}"
        """Base URL without a trailing slash, e.g. ``http://127.0.0.1:40123``."""

    # ---- what tests read -------------------------------------------------------------

    @property
    def requests(self) -> list[Recorded]:
        """A snapshot of every request so far, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def errors(self) -> list[BaseException]:
        """Exceptions raised by handler code (each was answered with a 500 or a drop)."""
        with self._lock:
            return list(self._errors)

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
        with self._arrived:
            while True:
                for recorded in self._requests:
                    if _matches(recorded, method, path):
                        return recorded
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no {method or 'request'} {path or ''} arrived".strip())
                self._arrived.wait(remaining)

    # ---- what handlers use -----------------------------------------------------------

    @property
    def closing(self) -> bool:
        """True once :meth:`close` has started."""
        return self._closing.is_set()

    def wait(self, event: threading.Event | None = None, timeout: float | None = None) -> bool:
        """Block a handler until ``event`` is set or the server closes (``None``: until close).

        Returns True when the event ended the wait, False on close or timeout. The
        event is set by :meth:`close`, so a test's gate never outlives its server.
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

    def stream(
        self,
        request: Request,
        chunks: Iterable[bytes],
        *,
        status: int = 200,
        content_type: str = "application/octet-stream",
    ) -> Response:
        """A chunked response sending each item as it is produced (flushed per item).

        ``chunks`` may block (e.g. on :meth:`wait`) and may raise :class:`DropConnection`
        to cut the connection mid-body; other exceptions are recorded, then dropped.
        """
        return Response(
            self._guarded(request, iter(chunks)), status=status, content_type=content_type
        )

    # ---- lifecycle -------------------------------------------------------------------

    def close(self) -> None:
        """Release every waiting handler, stop listening, close every connection. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._closing.set()
            gates = list(self._waiting)
            connections = dict(self._connections)
        for gate in gates:
            gate.set()
        self._http.stop()
        for connection in connections:
            _shutdown(connection)
        deadline = time.monotonic() + _CLOSE_JOIN_BUDGET
        for thread in connections.values():
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- internals -------------------------------------------------------------------

    def _dispatch(self, request: Request) -> Response:
        recorded = Recorded(
            method=request.method,
            path=_request_target(request),
            headers={name.lower(): value for name, value in request.headers.items()},
            body=request.get_data(),
        )
        with self._arrived:
            self._requests.append(recorded)
            self._arrived.notify_all()
        try:
            return self._handler(request)
        except DropConnection:
            return _drop(request)
        except Exception as error:
            self._record_error(error)
            return Response(b"", status=500)

    def _guarded(self, request: Request, chunks: Iterator[bytes]) -> Iterator[bytes]:
        try:
            yield from chunks
        except DropConnection:
            _drop(request)
        except Exception as error:
            self._record_error(error)
            _drop(request)

    def _record_error(self, error: BaseException) -> None:
        _LOG.error("test double handler failed", exc_info=error)
        with self._lock:
            self._errors.append(error)

    def _connection_started(self, connection: socket.socket, thread: threading.Thread) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._connections[connection] = thread
            return True

    def _connection_ended(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.pop(connection, None)


def _matches(recorded: Recorded, method: str | None, path: str | None) -> bool:
    return (method is None or recorded.method == method) and (path is None or recorded.path == path)


def _request_target(request: Request) -> str:
    raw = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI")
    if isinstance(raw, str) and raw.startswith("/"):
        return raw
    query = request.query_string.decode("latin-1")
    return request.path + (f"?{query}" if query else "")


def _drop(request: Request) -> Response:
    connection = request.environ.get("werkzeug.socket")
    if isinstance(connection, socket.socket):
        _shutdown(connection)
    # werkzeug's write of this response fails quietly (EPIPE): the client sees no answer.
    return Response(b"")


def _shutdown(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)


class _RequestHandler(WSGIRequestHandler):
    # Set on this class so werkzeug does not switch every handler in the process to HTTP/1.1.
    protocol_version = "HTTP/1.1"

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass


class _WsgiServer(ThreadedWSGIServer):
    def __init__(self, host: str, app: Any, owner: RecordingServer) -> None:
        super().__init__(host, 0, app, handler=_RequestHandler)
        self._owner = owner

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve_connection,
            args=(request, client_address),
            name=f"{THREAD_PREFIX}http",
            daemon=True,
        )
        if not self._owner._connection_started(request, thread):
            self.shutdown_request(request)
            return
        thread.start()

    def _serve_connection(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            self._owner._connection_ended(request)


class _HttpServer(HTTPServer):
    """pytest-httpserver's server with one dispatch, a fast stop and named threads."""

    def __init__(self, owner: RecordingServer, host: str) -> None:
        super().__init__(host=host, port=0, threaded=True)
        self._owner = owner

    def start(self) -> None:
        self.server = _WsgiServer(self.host, Request.application(self.application), self._owner)
        self.port = self.server.port
        self.server_thread = threading.Thread(
            target=self.thread_target, name=f"{THREAD_PREFIX}serve", daemon=True
        )
        self.server_thread.start()

    def thread_target(self) -> None:
        assert self.server is not None
        # The default 0.5 s poll interval would make every stop() take half a second.
        self.server.serve_forever(poll_interval=_POLL_INTERVAL)

    def application(self, request: Request) -> Response:
        request.get_data()
        return self.dispatch(request)  # no self.log: the owner records on arrival

    def dispatch(self, request: Request) -> Response:
        return self._owner._dispatch(request)

    def stop(self) -> None:
        server, thread = self.server, self.server_thread
        if server is None or thread is None:
            return
        server.shutdown()
        server.server_close()
        thread.join()
        self.server = None
        self.server_thread = None
