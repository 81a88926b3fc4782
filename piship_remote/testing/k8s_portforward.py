"""The fake cluster's router Service: its Endpoints, and ``pods/<pod>/portforward`` over WebSocket.

What ``kubectl port-forward svc/sandbox-router-svc`` needs of a cluster: the
Service (``GET /api/v1/namespaces/<ns>/services/<name>``, one port ``http`` 8080 →
8080), its Endpoints (the ready router pods, ``cluster.router_pods``), and the pod's
``portforward`` subresource, a WebSocket with subprotocol ``v4.channel.k8s.io``::

    forwards = PortForwards(cluster, server)
    answer = forwards.core(request)        # the Service or Endpoints, or None
    upstream = forwards.tunnel(head)       # HttpServer's tunnel hook

The stream protocol is the kubelet's: channel 2i carries port i's data and 2i+1 its
errors; each message is one channel byte, then the data; each channel's first
message from the server is the port number (2 bytes, little endian). The forwarded
port reaches the router itself: the server serves the stream as a new plain-HTTP
connection (:meth:`~piship_remote._http_server.server.HttpServer.serve_connection`), or,
with ``cluster.router_upstream`` (a loopback ``(host, port)``), a router listening there.
A sandbox pod is reached the same way where the server runs sandboxd (``pods``: a live
sandbox pod's listener for a port, see :mod:`~piship_remote.testing.k8s_sandboxd`).
A port the pod does not listen on gets the kubelet's error on the error
channel, then the stream closes. ``"create pods/portforward"`` in ``cluster.denied``
refuses the upgrade with 403.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import re
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from werkzeug import Request, Response

from piship_remote._http_server.server import Head, Reply
from piship_remote.testing.k8s_access import AccessSettings, refused
from piship_remote.testing.k8s_store import ApiError
from piship_remote.testing.recorder import THREAD_PREFIX, json_response

__all__ = ["PORT_FORWARD_PROTOCOL", "ROUTER_PORT", "PortForwards", "RouterServiceSettings"]

ROUTER_PORT = 8080
PORT_FORWARD_PROTOCOL = "v4.channel.k8s.io"
_CORE = re.compile(
    r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<kind>services|endpoints)/(?P<name>[^/]+)$"
)
_PORT_FORWARD = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/pods/(?P<pod>[^/]+)/portforward$")
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_TEXT, _BINARY, _CLOSE, _PING, _PONG = 0x1, 0x2, 0x8, 0x9, 0xA
_PIECE = 64 * 1024


class RouterServiceSettings(AccessSettings, Protocol):
    """The :class:`~piship_remote.testing.kubernetes_server.Cluster` knobs read here."""

    router_service: str
    router_namespace: str
    router_pods: list[str]
    router_upstream: tuple[str, int] | None


class Serving(Protocol):
    """What a port-forward needs of its server: a new connection served from a socket."""

    def serve_connection(self, connection: socket.socket) -> None: ...


PodListener = Callable[[str, str, int], "tuple[bool, tuple[str, int] | None]"]
"""``(namespace, pod, port)`` → whether such a sandbox pod lives, and where its ``port`` is
served (``None``: nothing listens there)."""


class PortForwards:
    """The router Service's API answers and the port-forwards to its pods (and, with
    ``pods``, to the sandbox pods)."""

    def __init__(
        self, cluster: RouterServiceSettings, server: Serving, pods: PodListener | None = None
    ) -> None:
        self._cluster = cluster
        self._server = server
        self._pods = pods
        self._counter = itertools.count(1)

    def core(self, request: Request) -> Response | None:
        """The router's Service or Endpoints for a ``GET`` of them; ``None`` for other paths."""
        match = _CORE.match(request.path)
        if match is None or request.method != "GET":
            return None
        cluster = self._cluster
        if (match["ns"], match["name"]) != (cluster.router_namespace, cluster.router_service):
            return _not_found(match["kind"], match["name"])
        if match["kind"] == "services":
            return json_response(200, _service(cluster))
        return json_response(200, _endpoints(cluster))

    def tunnel(self, head: Head) -> socket.socket | Reply | None:
        """The HTTP server's tunnel hook: a port-forward's WebSocket, or its refusal."""
        match = _PORT_FORWARD.match(head.path)
        if match is None:
            return None
        refusal = refused(head.headers, self._cluster, router=False, subject=head.client_subject)
        if refusal is not None:
            return _reply(*refusal)
        if "create pods/portforward" in self._cluster.denied:
            return _failure(403, "Forbidden", "pods/portforward is forbidden")
        ports = parse_qs(urlsplit(head.target).query).get("ports", [])
        port = int(ports[0]) if len(ports) == 1 and ports[0].isdigit() else 0
        router = match["ns"] == self._cluster.router_namespace and (
            match["pod"] in self._cluster.router_pods
        )
        upstream = self._cluster.router_upstream
        if not router:
            alive, upstream = (
                self._pods(match["ns"], match["pod"], port)
                if self._pods is not None
                else (False, None)
            )
            if not alive:
                return _failure(404, "NotFound", f'pods "{match["pod"]}" not found')
        problem = _upgrade_problem(head.headers)
        if problem is not None:
            return _failure(400, "BadRequest", problem)
        if not port:
            return _failure(400, "BadRequest", "exactly one port is forwarded here")
        ours, theirs = socket.socketpair()
        name = f"{THREAD_PREFIX}portforward-{next(self._counter)}"
        forward = _Forward(theirs, head.headers["sec-websocket-key"], port, match["pod"])
        listening = port == ROUTER_PORT if router else upstream is not None
        thread = threading.Thread(
            target=forward.run, args=(self._server, name, upstream, listening), name=name
        )
        thread.daemon = True
        thread.start()
        return ours


class _Forward:
    """One port-forward stream: the WebSocket on one side, the router on the other."""

    def __init__(self, connection: socket.socket, key: str, port: int, pod: str) -> None:
        self._ws = connection
        self._key = key
        self._port = port
        self._pod = pod
        self._lock = threading.Lock()

    def run(
        self, server: Serving, name: str, upstream: tuple[str, int] | None, listening: bool
    ) -> None:
        with contextlib.closing(self._ws):
            reader = self._ws.makefile("rb")
            if not _skip_head(reader):
                return
            accept = base64.b64encode(hashlib.sha1(self._key.encode() + _GUID).digest())
            self._send_raw(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n"
                b"Sec-WebSocket-Protocol: " + PORT_FORWARD_PROTOCOL.encode() + b"\r\n\r\n"
            )
            prefix = struct.pack("<H", self._port)
            self._send(_BINARY, b"\x00" + prefix)
            self._send(_BINARY, b"\x01" + prefix)
            if not listening:
                self._refuse_port(reader)
                return
            router = self._router(server, upstream)
            if router is None:
                return
            back = threading.Thread(target=self._answers, args=(router,), name=f"{name}-back")
            back.daemon = True
            back.start()
            try:
                self._requests(reader, router)
            finally:
                _cut(router)
                back.join()
                router.close()

    def _router(self, server: Serving, upstream: tuple[str, int] | None) -> socket.socket | None:
        """This server's own router, or a loopback ``upstream`` one (its port: the pod's)."""
        if upstream is None:
            router, ours = socket.socketpair()
            server.serve_connection(ours)
            return router
        if upstream[0] not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("a port-forward's upstream must be a loopback address")
        try:
            connection = socket.create_connection(upstream, timeout=5.0)
        except OSError as error:
            with contextlib.suppress(OSError):
                self._send(_BINARY, b"\x01" + f"error forwarding port: {error}".encode())
                self._send(_CLOSE, struct.pack("!H", 1000))
            return None
        connection.settimeout(None)  # a stream may stay quiet for as long as it likes
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    def _requests(self, reader: Any, router: socket.socket) -> None:
        """The client's frames to the router, until the client closes."""
        while (frame := _read_frame(reader)) is not None:
            opcode, payload = frame
            if opcode == _CLOSE:
                return
            if opcode == _PING:
                self._send(_PONG, payload)
            elif opcode == _BINARY and payload[:1] == b"\x00" and len(payload) > 1:
                router.sendall(payload[1:])

    def _answers(self, router: socket.socket) -> None:
        """The router's bytes to the client; its end closes the stream."""
        with contextlib.suppress(OSError):
            while piece := router.recv(_PIECE):
                self._send(_BINARY, b"\x00" + piece)
            self._send(_CLOSE, struct.pack("!H", 1000))
        _cut(self._ws)

    def _refuse_port(self, reader: Any) -> None:
        _read_frame(reader)  # the kubelet dials when the first data arrives
        message = (
            f"an error occurred forwarding {self._port} -> {self._port}: error forwarding "
            f"port {self._port} to pod {self._pod}: connect: connection refused"
        )
        with contextlib.suppress(OSError):
            self._send(_BINARY, b"\x01" + message.encode())
            self._send(_CLOSE, struct.pack("!H", 1000))

    def _send(self, opcode: int, payload: bytes) -> None:
        self._send_raw(_frame(opcode, payload))

    def _send_raw(self, data: bytes) -> None:
        with self._lock:
            self._ws.sendall(data)


def _frame(opcode: int, payload: bytes) -> bytes:
    """A final, unmasked frame (a server's)."""
    size = len(payload)
    if size < 126:
        header = struct.pack("!BB", 0x80 | opcode, size)
    elif size < 1 << 16:
        header = struct.pack("!BBH", 0x80 | opcode, 126, size)
    else:
        header = struct.pack("!BBQ", 0x80 | opcode, 127, size)
    return header + payload


def _read_frame(reader: Any) -> tuple[int, bytes] | None:
    """One whole message (fragments joined, masks removed), or ``None`` at the end."""
    opcode, parts = 0, []
    while True:
        try:
            head = reader.read(2)
            if len(head) < 2:
                return None
            first, second = head
            size = second & 0x7F
            if size == 126:
                (size,) = struct.unpack("!H", reader.read(2))
            elif size == 127:
                (size,) = struct.unpack("!Q", reader.read(8))
            mask = reader.read(4) if second & 0x80 else b""
            payload = reader.read(size)
        except (OSError, struct.error, ValueError):
            return None
        if mask:
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        opcode = opcode or first & 0x0F
        parts.append(payload)
        if first & 0x80:
            return opcode, b"".join(parts)


def _skip_head(reader: Any) -> bool:
    """Read the upgrade request's head (the tunnel sends it on first)."""
    with contextlib.suppress(OSError, ValueError):
        while line := reader.readline(65536):
            if line in (b"\r\n", b"\n"):
                return True
    return False


def _upgrade_problem(headers: Mapping[str, str]) -> str | None:
    if headers.get("upgrade", "").lower() != "websocket" or "sec-websocket-key" not in headers:
        return "the portforward subresource is a WebSocket upgrade here"
    offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
    if PORT_FORWARD_PROTOCOL not in offered:
        return f"no supported subprotocol offered (this server speaks {PORT_FORWARD_PROTOCOL})"
    return None


def _service(cluster: RouterServiceSettings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": cluster.router_service, "namespace": cluster.router_namespace},
        "spec": {
            "type": "ClusterIP",
            "selector": {"app": "sandbox-router"},
            "ports": [
                {"name": "http", "protocol": "TCP", "port": ROUTER_PORT, "targetPort": ROUTER_PORT}
            ],
        },
    }


def _endpoints(cluster: RouterServiceSettings) -> dict[str, Any]:
    addresses = [
        {"ip": f"10.244.0.{index}", "targetRef": {"kind": "Pod", "name": pod}}
        for index, pod in enumerate(cluster.router_pods, start=10)
    ]
    subsets = (
        [{"addresses": addresses, "ports": [{"name": "http", "port": ROUTER_PORT}]}]
        if addresses
        else []
    )
    return {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": cluster.router_service, "namespace": cluster.router_namespace},
        "subsets": subsets,
    }


def _failure(code: int, reason: str, message: str) -> Reply:
    """The API server's ``Status`` answer refusing the upgrade."""
    return _reply(code, ApiError(code, reason, message).status())


def _not_found(kind: str, name: str) -> Response:
    return json_response(404, ApiError(404, "NotFound", f'{kind} "{name}" not found').status())


def _reply(status: int, body: Mapping[str, Any]) -> Reply:
    return Reply(status, json_response(status, body).get_data(), "application/json")


def _cut(connection: socket.socket) -> None:
    with contextlib.suppress(OSError):
        connection.shutdown(socket.SHUT_RDWR)
