"""Fault injection in front of the test doubles: an HTTP fault proxy and a TCP door.

The library talks to a :class:`FaultProxy`, which forwards every request to a
normal double (``E2bServer`` or ``KubernetesServer``) and relays its answer, except
the one request it was armed for::

    proxy = FaultProxy(mock.url, classify=e2b_kind)
    proxy.arm("renew", "503")          # the next renewal gets a 503, once
    backend = E2bCompatibleBackend(endpoint=proxy.url, envd_url=proxy.url)

Faults (:data:`FAULTS`):

- ``"400"`` … ``"504"``: that status with a JSON error body; the request is *not*
  forwarded (the service or a gateway refused it, so nothing happened);
- ``"html"`` / ``"nonjson"``: the request *is* forwarded (it took effect), but the
  answer is replaced by a 200 HTML page, or by a 200 body of the expected content
  type that does not parse (a truncated JSON object; for Connect streams an
  envelope whose payload is not JSON);
- ``"drop-before"``: forwarded, then the connection is closed without an answer;
- ``"drop-mid"``: forwarded, then the status, headers and first half of the answer's
  body are relayed and the connection is closed (a body-less answer becomes a 200
  that promises 64 bytes and sends none);
- ``"stall"``: forwarded, then nothing more is sent until the proxy closes (for a
  Connect stream the first half of the stream is relayed first, so the stream
  goes silent mid-way);
- ``"refused"``: needs a :class:`Door` (an HTTP server cannot refuse a connection
  it has accepted); the proxy itself ignores it.

Every error body and every garbage body echoes the credentials the request
carried (``X-API-Key``, ``Authorization``, ``X-Access-Token``), the way real
services sometimes do, so each cell also checks that errors are redacted.

The doubles answer every request with ``Connection: close``, so each request is
one TCP connection; that makes a :class:`Door` exact: ``door.shut(after=1)``
accepts one more connection (one request) and then refuses every later one until
:meth:`Door.reopen`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import selectors
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from types import TracebackType

from werkzeug import Request, Response

from piship_remote.testing import THREAD_PREFIX, DropConnection, RecordingServer, json_response
from piship_remote.wire.connect import connect_envelope

__all__ = ["FAULTS", "STATUS_FAULTS", "Door", "FaultProxy"]

STATUS_FAULTS = ("400", "401", "403", "404", "409", "429", "500", "502", "503", "504")
FAULTS = (*STATUS_FAULTS, "html", "nonjson", "refused", "drop-before", "drop-mid", "stall")

# Request headers that carry credentials; fault bodies echo them.
ECHOED_HEADERS = ("x-api-key", "authorization", "x-access-token")
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "te", "trailer"}
)
CONNECT_JSON = "application/connect+json"
_RELAY_CHUNK = 64 * 1024
_UPSTREAM_TIMEOUT = 30.0
_PROMISED_BYTES = 64

Classify = Callable[[str, str], "str | None"]


class FaultProxy(RecordingServer):
    """A recording reverse proxy to ``upstream`` that injects one armed fault per kind.

    ``classify(method, path)`` names the kind of a request (``None``: never
    faulted). :attr:`injected` lists ``(kind, fault, path)`` for each fault applied.
    """

    def __init__(self, upstream: str, classify: Classify) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._classify = classify
        self._plan_lock = threading.Lock()
        self._armed: dict[str, str] = {}
        self.injected: list[tuple[str, str, str]] = []
        super().__init__(self._handle)

    def arm(self, kind: str, fault: str) -> None:
        """Apply ``fault`` to the next request of ``kind`` (once)."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}")
        with self._plan_lock:
            self._armed[kind] = fault

    def disarm(self) -> None:
        """Forget every fault not yet applied."""
        with self._plan_lock:
            self._armed.clear()

    # ---- the handler -------------------------------------------------------------

    def _handle(self, request: Request) -> Response:
        kind = self._classify(request.method, request.path)
        fault = self._take(kind, request.path)
        if fault is None or fault == "refused":
            return self._relay(request)
        if fault in STATUS_FAULTS:
            status = int(fault)
            return json_response(
                status, {"code": status, "message": f"injected HTTP {status}", **_echo(request)}
            )
        upstream, connection = self._forward(request)
        if fault == "drop-before":
            connection.close()
            raise DropConnection
        if fault in ("html", "nonjson"):
            upstream.read()
            connection.close()
            return _garbage(request, fault, upstream.getheader("Content-Type") or "")
        body = upstream.read()
        connection.close()
        streaming = (upstream.getheader("Content-Type") or "").startswith(CONNECT_JSON)
        if fault == "stall" and not streaming:
            self.wait()  # until the proxy closes; the client gave up long before
            raise DropConnection
        return self._cut(request, upstream, body, stall=fault == "stall")

    def _take(self, kind: str | None, path: str) -> str | None:
        if kind is None:
            return None
        with self._plan_lock:
            fault = self._armed.pop(kind, None)
            if fault is not None:
                self.injected.append((kind, fault, path))
        return fault

    # ---- forwarding --------------------------------------------------------------

    def _forward(
        self, request: Request
    ) -> tuple[http.client.HTTPResponse, http.client.HTTPConnection]:
        connection = http.client.HTTPConnection(*self._upstream, timeout=_UPSTREAM_TIMEOUT)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        target = request.full_path if request.query_string else request.path
        connection.request(request.method, target, body=request.get_data(), headers=headers)
        return connection.getresponse(), connection

    def _relay(self, request: Request) -> Response:
        upstream, connection = self._forward(request)

        def body() -> Iterator[bytes]:
            try:
                while chunk := upstream.read1(_RELAY_CHUNK):
                    yield chunk
            finally:
                connection.close()

        return self.stream(
            request,
            body(),
            status=upstream.status,
            content_type=upstream.getheader("Content-Type") or "application/octet-stream",
        )

    def _cut(
        self, request: Request, upstream: http.client.HTTPResponse, body: bytes, *, stall: bool
    ) -> Response:
        """The first half of ``body``, then a drop (or silence until close, then a drop)."""
        status = upstream.status
        content_type = upstream.getheader("Content-Type") or "application/octet-stream"
        headers: dict[str, str] = {}
        if not body or status == 204:
            status, headers["Content-Length"] = 200, str(_PROMISED_BYTES)
        server = self

        def chunks() -> Iterator[bytes]:
            if body:
                yield body[: len(body) // 2]
            if stall:
                server.wait()
            raise DropConnection

        response = self.stream(request, chunks(), status=status, content_type=content_type)
        response.headers.update(headers)
        return response


def _echo(request: Request) -> dict[str, str]:
    """The credential headers the request carried, as a real service might echo them."""
    return {name: request.headers[name] for name in ECHOED_HEADERS if name in request.headers}


def _garbage(request: Request, fault: str, content_type: str) -> Response:
    seen = " ".join(f"{k}={v}" for k, v in _echo(request).items())
    if fault == "html":
        page = (
            "<!DOCTYPE html><html><head><title>Sign in</title></head><body>"
            f"<h1>Your session expired</h1><p>{seen}</p></body></html>"
        )
        return Response(page, status=200, content_type="text/html; charset=utf-8")
    if content_type.startswith(CONNECT_JSON):
        payload = f"not json {seen}".encode()
        frame = connect_envelope({})[:1] + len(payload).to_bytes(4, "big") + payload
        return Response(frame, status=200, content_type=CONNECT_JSON)
    truncated = json.dumps({"message": seen, "sandboxID": "sbx1"})[:-7]
    return Response(truncated, status=200, content_type="application/json")


class Door:
    """A loopback port relaying TCP to ``upstream`` that can stop accepting connections.

    While shut, a connect to :attr:`url` is refused by the kernel (``ECONNREFUSED``);
    connections already accepted go on. Use as a context manager.
    """

    def __init__(self, upstream: str) -> None:
        parts = urllib.parse.urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._lock = threading.Lock()
        self._closed = False
        self._budget: int | None = None  # connections still accepted before shutting
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self.port = 0
        self._listen()
        self.url = f"http://127.0.0.1:{self.port}"

    def shut(self, *, after: int = 0) -> None:
        """Refuse connections from now on, or after accepting ``after`` more."""
        with self._lock:
            if after > 0:
                self._budget = after
                return
            listener, self._listener = self._listener, None
        _close_listener(listener)

    def reopen(self) -> None:
        """Accept connections on the same port again."""
        with self._lock:
            self._budget = None
            if self._listener is not None or self._closed:
                return
        self._listen()

    def close(self) -> None:
        """Stop listening and cut every relayed connection."""
        with self._lock:
            self._closed = True
            listener, self._listener = self._listener, None
            sockets = list(self._sockets)
        _close_listener(listener)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in list(self._threads):
            thread.join(1.0)

    def __enter__(self) -> Door:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- internals ---------------------------------------------------------------

    def _listen(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        with self._lock:
            self._listener = listener
        self._spawn(self._accept, listener)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(
            target=target, args=args, name=f"{THREAD_PREFIX}door", daemon=True
        )
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # shut or closed
            shut_now = False
            with self._lock:
                if self._budget is not None:
                    self._budget -= 1
                    if self._budget <= 0:
                        self._budget = None
                        shut_now = self._listener is listener
                        if shut_now:
                            self._listener = None
            if shut_now:
                _close_listener(listener)
            self._spawn(self._pipe, client)
            if shut_now:
                return

    def _pipe(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self._upstream, timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._sockets.update((client, upstream))
        try:
            _splice(client, upstream)
        finally:
            with self._lock:
                self._sockets.difference_update((client, upstream))
            client.close()
            upstream.close()


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side ends (then both are closed by the caller)."""
    peer = {a: b, b: a}
    with selectors.DefaultSelector() as selector:
        selector.register(a, selectors.EVENT_READ)
        selector.register(b, selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                source: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = source.recv(_RELAY_CHUNK)
                    if not data:
                        return
                    peer[source].sendall(data)
                except OSError:
                    return


def _close_listener(listener: socket.socket | None) -> None:
    if listener is None:
        return
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
    listener.close()
