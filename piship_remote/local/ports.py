"""The sandboxes' own ports, reached through the service: E2B's ``<port>-<id>.<domain>`` hosts.

A request whose ``Host`` is ``<port>-<sandbox id>.localhost:<service port>`` (what
the SDKs' ``get_host(port)`` names), or that carries ``E2b-Sandbox-Id`` with an
``E2b-Sandbox-Port`` other than envd's, is handed whole to that port on the
sandbox's own loopback: the sandbox's agent connects from inside its network
namespace (with the network denied or allowed) and passes the socket out, and the
connection is spliced to it, WebSocket upgrades included. The request's head goes on as
E2B's proxy sends it: header names in canonical case, ``Host`` first, and for a sandbox
created with ``network.maskRequestHost`` that host instead (``${PORT}``: the port); later
requests on a kept-alive connection pass unread::

    ports = SandboxPorts(registry)
    server = HttpServer(route, tunnel=ports.tunnel)

A sandbox created with ``network.allowPublicTraffic: false`` answers only requests
carrying its ``E2b-Traffic-Access-Token``; any sandbox refuses a request carrying
another sandbox's token (traffic or envd ``X-Access-Token``). Without either, as on
E2B, a port is public (here: to the host's loopback). A paused sandbox created with
``autoResume`` is resumed by such a request once its tokens are checked; otherwise
it, an unknown sandbox and a port nothing listens on are answered 502 as E2B's edge
does.

Such a host name is resolved by curl and browsers only (``*.localhost``; a stock
``hosts: files dns`` resolver does not know it), so a port can also have a loopback
address of its own: :meth:`SandboxPorts.listen` opens a listener on the service's
host for it (once; the same address after that), and every connection to it is
spliced to the port the same way. The listener is closed when the sandbox ends::

    address = ports.listen(sandbox, 8000)      # "127.0.0.1:41234"
"""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import socket
import threading
from collections.abc import Mapping

import attrs

from piship_remote._http_server.messages import Head, Reply, Upstream
from piship_remote._http_server.tunnel import splice
from piship_remote.local.envd.router import ENVD_PORT
from piship_remote.local.isolation.agent_link import DialFailed
from piship_remote.local.sandbox.network_options import masked_host
from piship_remote.local.sandbox.pause import Paused
from piship_remote.local.sandbox.registry import Registry, Sandbox, SandboxGone

__all__ = ["ENVD_PORT", "SandboxPorts", "port_target"]

TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"


def port_target(headers: Mapping[str, str]) -> tuple[int, str] | None:
    """The (port, sandbox id) a request is for, when it is for a sandbox port but envd's."""
    port_text = headers.get("e2b-sandbox-port", "")
    sandbox_id = headers.get("e2b-sandbox-id", "")
    if not (port_text and sandbox_id):
        label = headers.get("host", "").partition(".")[0]
        port_text, _, sandbox_id = label.partition("-")
    if not (port_text.isdigit() and sandbox_id) or len(port_text) > 5:
        return None
    port = int(port_text)
    return None if port == ENVD_PORT or not 0 < port < 65536 else (port, sandbox_id)


class SandboxPorts:
    """Connects requests for a sandbox port to it (the HTTP server's ``tunnel``), and
    connections to a port's own loopback listener (:meth:`listen`)."""

    def __init__(self, registry: Registry, host: str = "127.0.0.1") -> None:
        self._registry = registry
        self._host = host
        self._lock = threading.Lock()
        self._listeners: dict[tuple[str, int], _Listener] = {}

    def listen(self, sandbox: Sandbox, port: int) -> str:
        """``host:port`` of the listener spliced to ``port`` in ``sandbox`` (opened once).

        ``PermissionError`` for a sandbox whose ports want its traffic access token (a
        plain address cannot carry it); ``SandboxGone`` once it ended."""
        if sandbox.traffic_access_token is not None:
            raise PermissionError("the sandbox's ports want its traffic access token")
        key = (sandbox.id, port)
        with self._lock:
            listener = self._listeners.get(key)
            if listener is None:
                listener = _Listener(sandbox, port, self._host)
                self._listeners[key] = listener
                fresh = True
            else:
                fresh = False
        if fresh:
            sandbox.on_end(lambda: self._close(key))
        return listener.address

    def _close(self, key: tuple[str, int]) -> None:
        with self._lock:
            listener = self._listeners.pop(key, None)
        if listener is not None:
            listener.close()

    def tunnel(self, head: Head) -> Upstream | Reply | None:
        """A socket connected to the port the request names, the refusal, or ``None``."""
        target = port_target(head.headers)
        if target is None:
            return None
        port, sandbox_id = target
        known = self._registry.lookup(sandbox_id)
        if known is None:
            return _answer(502, sandbox_id, port, "The sandbox was not found")
        if not _admitted(known, head.headers):  # before an autoResume sandbox is resumed
            return _answer(403, sandbox_id, port, "Invalid or missing traffic access token")
        sandbox = self._registry.get(sandbox_id)
        if sandbox is None:
            return _answer(502, sandbox_id, port, "The sandbox was not found")
        try:
            return Upstream(sandbox.dial(port), _AsE2bProxySends(sandbox, port))
        except DialFailed:
            return _answer(502, sandbox_id, port, "The sandbox is running but port is not open")
        except (SandboxGone, Paused, OSError):
            return _answer(502, sandbox_id, port, "The sandbox was not found")


@attrs.frozen
class _AsE2bProxySends:
    """A port request's header lines as E2B's proxy (Go's HTTP client) sends them on:
    names in canonical case (``Host``, ``Content-Type``), ``Host`` first, and under
    ``network.maskRequestHost`` the masked host (``${PORT}`` filled in) in its place."""

    sandbox: Sandbox
    port: int

    def __call__(self, fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
        host = next((value for name, value in fields if name.lower() == "host"), None)
        mask = self.sandbox.options.mask_request_host
        if mask is not None:
            host = masked_host(mask, self.port)
        rest = [(_canonical(name), value) for name, value in fields if name.lower() != "host"]
        return rest if host is None else [("Host", host), *rest]


def _canonical(name: str) -> str:
    """``content-type`` → ``Content-Type``, as Go's ``CanonicalMIMEHeaderKey`` writes it."""
    if not all(c.isalnum() or c == "-" for c in name):
        return name
    return "-".join(part[:1].upper() + part[1:].lower() for part in name.split("-"))


def _admitted(sandbox: Sandbox, headers: Mapping[str, str]) -> bool:
    """Whether the request carries this sandbox's tokens only (its traffic one if it has one)."""
    traffic = headers.get(TRAFFIC_TOKEN_HEADER)
    envd = headers.get("x-access-token")
    expected = sandbox.traffic_access_token
    if traffic is None:
        traffic_ok = expected is None
    else:
        traffic_ok = expected is not None and _same(traffic, expected)
    return traffic_ok and (envd is None or _same(envd, sandbox.access_token))


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


def _answer(status: int, sandbox_id: str, port: int, message: str) -> Reply:
    body = {"code": status, "message": message, "sandboxId": sandbox_id, "port": port}
    return Reply(status, json.dumps(body).encode(), "application/json")


class _Listener:
    """A loopback listener whose connections are spliced to one port of one sandbox."""

    _numbers = itertools.count(1)

    def __init__(self, sandbox: Sandbox, port: int, host: str) -> None:
        self._sandbox = sandbox
        self._port = port
        self._socket = socket.create_server((host, 0))
        bound = self._socket.getsockname()
        self.address = f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}"
        self._name = f"piship-local-port-{port}"
        threading.Thread(target=self._accept, name=self._name, daemon=True).start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)
        self._socket.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._socket.accept()
            except OSError:  # closed: the sandbox ended
                return
            name = f"{self._name}-{next(self._numbers)}"
            relay = threading.Thread(target=self._relay, args=(client, name), name=name)
            relay.daemon = True
            relay.start()

    def _relay(self, client: socket.socket, name: str) -> None:
        with client, client.makefile("rb") as reader:
            try:
                upstream = self._sandbox.dial(self._port)
            except (DialFailed, SandboxGone, Paused, OSError):
                return  # nothing listens there (or the sandbox ended): the connection is cut
            splice(b"", reader, client, upstream, name=f"{name}-back")
