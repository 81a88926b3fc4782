"""A loopback TCP relay that cuts (or stalls) a long answer at chosen byte counts.

Put in front of a service's envd (``envd_url=proxy.url``), it relays every connection
both ways and, following its plan, resets the one whose answer is running, or stops
relaying it (a stall: the client's idle timeout then gives up on it). A plan's point is
a byte count of one answer (counted from the request it answers, so earlier answers on a
kept-alive connection do not count); the first answer that reaches it uses it up, so
unary answers (a few hundred bytes) pass untouched when the points are larger, and
``path`` limits the plan to answers to requests whose path starts with it::

    with CuttingProxy(service.envd_url) as proxy:
        proxy.plan([200_000, 900_000])          # two resets, in two streams
        proxy.plan([50_000], path="/process.Process/")   # command streams only
        backend = service.backend(envd_url=proxy.url)
        ...
        proxy.cuts                              # how many were made

A connection is closed on both sides as soon as either side closes, so a server never
writes into a connection nobody reads.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import struct
import threading
import urllib.parse
from collections.abc import Iterable
from types import TracebackType

__all__ = ["CuttingProxy"]

_CHUNK = 64 * 1024


class CuttingProxy:
    """Relays ``127.0.0.1:<port>`` to ``upstream`` (an ``http://host:port`` URL)."""

    def __init__(self, upstream: str) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._points: collections.deque[int] = collections.deque()
        self._stall = False
        self._path: bytes | None = None
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self.cuts = 0
        self._spawn(self._accept, "accept")

    def plan(self, points: Iterable[int], *, stall: bool = False, path: str | None = None) -> None:
        """Cut at each of ``points`` (bytes of one answer), in order; ``stall``: stop
        relaying there instead of resetting; ``path``: only answers to requests whose
        path starts with it."""
        with self._lock:
            self._points = collections.deque(sorted(points))
            self._stall = stall
            self._path = None if path is None else path.encode()

    def close(self) -> None:
        """Stop relaying and close every connection; joins its threads."""
        self._closed.set()
        _shut(self._listener)  # a shutdown wakes the blocked accept()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:  # a shutdown wakes its relay, which closes it
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join()

    def __enter__(self) -> CuttingProxy:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _spawn(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(
            target=target,  # type: ignore[arg-type]
            args=args,
            name=f"piship-cutting-proxy-{name}",
            daemon=True,
        )
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._upstream)
            except OSError:
                _shut(client)
                continue
            with self._lock:
                self._sockets |= {client, server}
            self._spawn(self._relay, "relay", client, server)

    def _relay(self, client: socket.socket, server: socket.socket) -> None:
        """Both directions on one thread, so a cut is one close, seen by nobody else."""
        relayed = 0  # bytes of the answer to the latest request
        answering = True  # the server spoke since the client last did: a new request next
        planned = False
        stalled = False
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(client, selectors.EVENT_READ)
                selector.register(server, selectors.EVENT_READ)
                while True:
                    for key, _ in selector.select():
                        source = key.fileobj
                        data = client.recv(_CHUNK) if source is client else server.recv(_CHUNK)
                        if not data:
                            return
                        if source is client:
                            if answering:
                                relayed, answering = 0, False
                                planned = self._applies_to(data)
                            if not stalled:
                                server.sendall(data)
                            continue
                        answering = True
                        point = self._take(relayed, len(data)) if planned else None
                        if point is None:
                            relayed += len(data)
                            client.sendall(data)
                            continue
                        client.sendall(data[: point - relayed])
                        if not self._stall:
                            _reset(client)
                            return
                        stalled = True  # nothing more for the client, until it gives up
                        selector.unregister(server)
        except OSError:
            return
        finally:
            _shut(client)
            _shut(server)
            with self._lock:
                self._sockets -= {client, server}

    def _applies_to(self, request: bytes) -> bool:
        """Whether the plan covers the request starting with ``request``."""
        with self._lock:
            path = self._path
        if path is None:
            return True
        line = request.split(b"\r\n", 1)[0].split(b" ")
        return len(line) > 1 and line[1].startswith(path)

    def _take(self, relayed: int, size: int) -> int | None:
        """The plan's next point if this chunk reaches it (used up)."""
        with self._lock:
            if self._points and relayed + size >= self._points[0]:
                self.cuts += 1
                return max(self._points.popleft(), relayed)
        return None


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset, not an end of stream."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
