"""One threaded loopback HTTP/1.1 server, the base of the local service and the test doubles.

A router turns each :class:`Request` into a :class:`Reply`; a reply with a
``stream`` is sent chunk by chunk as the iterator yields (or, when the reply names
a ``Content-Length``, as raw bytes), so Connect frames reach the client as they
are produced; once a write fails (the client is gone) the server stops and closes the
stream (its ``close()``), so its producer learns so::

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
can hold: the size of the head and of the body, how long a read may stall, a whole
head or body may take, or a connection idle, and how many connections are open at
once. When full, a connection waiting on its client (idle, or still owing its head or
body) is closed to admit a new one, taken from the peer address holding most
connections (the newcomer's own once it holds its ``client_share``), longest waiting
first; else the new one gets an immediate 503. So clients that trickle their requests
cannot starve the others: they hold their connections a bounded time and give them up
first. ``streamed(head)`` names the routes that read their body themselves
(``request.stream``), of any size, instead of getting it whole. ``tunnel(head)``, asked
after ``screen``, may hand the whole connection to an upstream socket it connected
(see :mod:`piship_remote._http_server.tunnel`), or refuse it with a reply.

The values live in :mod:`piship_remote._http_server.messages` and each connection's
handling in :mod:`piship_remote._http_server.connection`; both are re-exported here.

Threads: ``<prefix>http`` accepts, ``<prefix>conn-N`` serves one connection (and
``<prefix>tunnel-N`` carries a tunnel's answers, ``<prefix>tls-N-in``/``-out`` a sniffed
TLS connection's two directions); all
daemons, all joined by :meth:`HttpServer.close`, which also releases every
:meth:`HttpServer.wait` and cuts every open connection.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import socketserver
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

from piship_remote._http_server.connection import ConnectionHandler, cut, reset
from piship_remote._http_server.messages import (
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    BodyReader,
    DropConnection,
    Head,
    Limits,
    Recorded,
    Reply,
    Request,
    ResetConnection,
    Router,
    Screen,
    Tunnel,
)
from piship_remote._http_server.tls_sniff import DRAIN_SECONDS, PlainConnection, TlsRelay, sniffed

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "BodyReader",
    "DropConnection",
    "Head",
    "HttpServer",
    "Limits",
    "Recorded",
    "Reply",
    "Request",
    "ResetConnection",
    "Router",
    "Screen",
    "Tunnel",
]

POLL_INTERVAL = 0.02
ADMIT_WAIT = 0.2
_BUSY = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"

_log = logging.getLogger("piship_remote.http")
_S = TypeVar("_S", bound="HttpServer")
_NO_LIMITS = Limits()


class HttpServer:
    """A bound loopback server; :meth:`start` serves, :meth:`close` stops (or use ``with``).

    ``record`` keeps every request (as :class:`Recorded`, before the router runs);
    ``keep_alive`` False closes each connection after one answer; ``tls`` serves HTTPS
    with that server context (which may require client certificates); ``sniff_tls`` serves
    HTTPS with that context to connections that open with a TLS handshake and plain HTTP
    to the others, on the same port (see :mod:`piship_remote._http_server.tls_sniff`).
    """

    def __init__(
        self,
        router: Router,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        screen: Screen | None = None,
        limits: Limits = _NO_LIMITS,
        streamed: Callable[[Head], bool] | None = None,
        tunnel: Tunnel | None = None,
        record: bool = False,
        keep_alive: bool = True,
        thread_prefix: str = "piship-http-",
        join_timeout: float = 5.0,
        tls: ssl.SSLContext | None = None,
        sniff_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.router = router
        self.screen = screen
        self.limits = limits
        self.streamed = streamed
        self.tunnel = tunnel
        self.keep_alive = keep_alive
        self._record = record
        self._sniff_tls = sniff_tls
        self._prefix = thread_prefix
        self._join_timeout = join_timeout
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._requests: list[Recorded] = []
        self._waiting: set[threading.Event] = set()
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._peers: dict[socket.socket, str] = {}
        self._relays: dict[socket.socket, TlsRelay] = {}
        """The TLS relays of the connections served through one, by the plain end served."""
        self._waiting_since: dict[socket.socket, float] = {}
        """Connections waiting on their client (idle, or owing their head or body): the ones
        a full server may close."""
        self._counter = itertools.count(1)
        self._closing = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._listener = _Listener(self, (host, port))
        if tls is not None:
            # The handshake happens on each connection's own thread, at its first read.
            self._listener.socket = tls.wrap_socket(
                self._listener.socket, server_side=True, do_handshake_on_connect=False
            )
        bracketed = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if tls is not None else 'http'}://{bracketed}:{self.port}"
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
            cut(connection)
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
        peer = str(address[0]) if isinstance(address, tuple) and address else str(address)
        with self._changed:
            admitted = not self._closed and self._make_room(peer)
            if admitted:
                self._connections[connection] = thread
                self._peers[connection] = peer
                # waiting until its first request line arrives, so a full server can make room
                self._waiting_since[connection] = time.monotonic()
        if not admitted:
            _refuse(connection)
            return
        thread.start()

    def _make_room(self, peer: str) -> bool:
        """With the lock held: True once a connection from ``peer`` may open (closing a
        waiting one, see :meth:`_displaced`)."""
        cap = self.limits.connections
        if cap is None or len(self._connections) < cap:
            return True
        victim = self._displaced(peer)
        if victim is not None:
            del self._waiting_since[victim]  # cut: no other newcomer counts on it
            cut(victim)
        deadline = time.monotonic() + ADMIT_WAIT
        while len(self._connections) >= cap and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.wait(remaining)
        return not self._closed

    def _displaced(self, peer: str) -> socket.socket | None:
        """The waiting connection a newcomer from ``peer`` takes the place of, if any: of the
        address holding most (``peer``'s own once it holds its share), longest waiting."""
        held = Counter(self._peers.values())
        share = self.limits.client_share
        candidates = list(self._waiting_since)
        if share is not None and held[peer] >= share:
            candidates = [c for c in candidates if self._peers.get(c) == peer]
        if not candidates:
            return None
        return min(candidates, key=lambda c: (-held[self._peers[c]], self._waiting_since[c]))

    def _serve(self, connection: socket.socket, address: Any) -> None:
        served = self._sniffed(connection)
        if served is None:
            self._forget(connection)
            return
        plain = served.plain
        try:
            self._listener.finish_request(plain, address)
        except Exception:  # one broken connection must not stop the server
            _log.debug("connection from %s failed", address, exc_info=True)
        finally:
            self._forget(plain)
            self._listener.shutdown_request(plain)
            served.close(drain=0 if self.closing else DRAIN_SECONDS)

    def _sniffed(self, connection: socket.socket) -> PlainConnection | TlsRelay | None:
        """What serves ``connection``: itself, or the plain end of its TLS relay (then
        tracked in its place, so a full or closing server cuts that end); ``None`` when its
        handshake failed."""
        if self._sniff_tls is None:
            return PlainConnection(connection)
        name = f"{self._prefix}tls-{next(self._counter)}"
        limits = self.limits
        served = sniffed(
            connection,
            self._sniff_tls,
            timeout=limits.idle_timeout or limits.read_timeout,
            handshake_timeout=limits.head_seconds or limits.read_timeout,
            name=name,
        )
        if not isinstance(served, TlsRelay):
            return served
        with self._changed:
            self._relays[served.plain] = served
            if connection in self._connections:
                self._connections[served.plain] = self._connections.pop(connection)
                self._peers[served.plain] = self._peers.pop(connection)
                since = self._waiting_since.pop(connection, None)
                if since is not None:
                    self._waiting_since[served.plain] = since
            else:  # displaced, or the server closes
                cut(served.plain)
        return served

    def reset(self, connection: socket.socket) -> None:
        """Close the served ``connection`` with a TCP reset (see :class:`ResetConnection`):
        the client's own connection, when a TLS relay carries it."""
        with self._lock:
            relay = self._relays.get(connection)
        if relay is not None:
            relay.reset()
        reset(connection)

    def _forget(self, connection: socket.socket) -> None:
        with self._changed:
            self._relays.pop(connection, None)
            self._connections.pop(connection, None)
            self._peers.pop(connection, None)
            self._waiting_since.pop(connection, None)
            self._changed.notify_all()

    def serve_connection(self, connection: socket.socket) -> None:
        """Serve ``connection``, already connected, as if it had been accepted (plain
        HTTP even on a TLS server): how a double hands a tunnelled stream to itself."""
        self._admit(connection, ("tunnel", 0))

    def tunnel_name(self) -> str:
        """A name for a tunnel's thread."""
        return f"{self._prefix}tunnel-{next(self._counter)}"

    def _set_waiting(self, connection: socket.socket, waiting: bool) -> None:
        """Mark ``connection`` as waiting on its client (idle, or owing its head or body)."""
        with self._lock:
            if not waiting:
                self._waiting_since.pop(connection, None)
            elif connection in self._connections:
                self._waiting_since.setdefault(connection, time.monotonic())

    def _arrived(self, request: Request) -> None:
        if not self._record:
            return
        recorded = Recorded(request.method, request.target, dict(request.headers), request.body)
        with self._changed:
            self._requests.append(recorded)
            self._changed.notify_all()


def _matches(recorded: Recorded, method: str | None, path: str | None) -> bool:
    return (method is None or recorded.method == method) and (path is None or recorded.path == path)


def _refuse(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.setblocking(False)
        connection.send(_BUSY)
    cut(connection)
    connection.close()


class _Listener(socketserver.TCPServer):
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, owner: HttpServer, address: tuple[str, int]) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.owner = owner
        super().__init__(address, ConnectionHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.owner._admit(request, client_address)
