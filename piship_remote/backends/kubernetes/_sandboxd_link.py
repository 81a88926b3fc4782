"""The way to one claim's sandboxd: a port-forward to each of its pod's two listeners (the
library's own, through the API server), a gRPC channel on the first, the REST base on the
second. sandboxd binds the pod's loopback, so the router cannot reach it::

    require_sandboxd()                          # CONFIG_INVALID naming the extra, if missing
    links = SandboxdLinks(open_tunnel)
    link = links.to(claim)                      # opened on first use, kept while the claim is
    link.processes.run(...); link.rest          # "http://127.0.0.1:<port>"
    links.close()                               # every tunnel and channel of this sandbox

Threads: each tunnel's ``piship-sandboxd-tunnel-…`` (see :mod:`._port_forward`); all end
with :meth:`SandboxdLinks.close`, or when the claim is replaced.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from piship_remote.backends._common import SandboxErrors
from piship_remote.backends.kubernetes._port_forward import RouterTunnel
from piship_remote.backends.kubernetes.claims import Claim
from piship_remote.model.errors import CONFIG_INVALID, PiShipError

__all__ = [
    "GRPC_PORT",
    "REST_PORT",
    "OpenTunnel",
    "SandboxdLink",
    "SandboxdLinks",
    "require_sandboxd",
]

GRPC_PORT = 9090
REST_PORT = 8080

OpenTunnel = Callable[[str, int], RouterTunnel]
"""``(pod, port)`` → a tunnel (not yet held) to that port of that pod."""


def require_sandboxd() -> None:
    """``CONFIG_INVALID`` naming the extra when grpcio or protobuf is missing."""
    try:
        import grpc  # noqa: F401

        from piship_remote._sandboxd import process_pb2  # noqa: F401
    except ImportError as error:
        raise PiShipError(
            CONFIG_INVALID,
            f"this claim's sandbox runs sandboxd, which needs grpcio and protobuf ({error})",
            user_action="pip install 'piship-remote[sandboxd]', or choose"
            ' runtime="python-runtime" if its template still serves the router',
        ) from None


def port_of(address: str | None, default: int) -> int:
    """The port of a ``host:port`` address (``SANDBOXD_GRPC_ADDR``), else ``default``.

    >>> port_of("localhost:9091", 9090), port_of(None, 8080), port_of("[::1]:7", 1)
    (9091, 8080, 7)
    """
    _, _, port = (address or "").rpartition(":")
    return int(port) if port.isdigit() and 0 < int(port) < 65536 else default


class SandboxdLink:
    """One claim's open way to its sandboxd."""

    def __init__(self, claim: Claim, open_tunnel: OpenTunnel, errors: SandboxErrors) -> None:
        import grpc

        from piship_remote._sandboxd.process_rpc import ProcessStub
        from piship_remote.backends.kubernetes._sandboxd_process import SandboxdProcesses

        pod = claim.pod_name or claim.sandbox
        self.claim = claim.name
        self._tunnels: list[RouterTunnel] = []
        try:
            grpc_tunnel = self._held(open_tunnel(pod, port_of(claim.sandboxd_grpc, GRPC_PORT)))
            rest_tunnel = self._held(open_tunnel(pod, port_of(claim.sandboxd_rest, REST_PORT)))
        except BaseException:
            self.close()
            raise
        self.rest = rest_tunnel.url
        target = grpc_tunnel.url.removeprefix("http://")
        self._channel: Any = grpc.insecure_channel(target)
        self.processes = SandboxdProcesses(ProcessStub(self._channel), errors)

    def _held(self, tunnel: RouterTunnel) -> RouterTunnel:
        self._tunnels.append(tunnel)
        tunnel.hold(self)
        return tunnel

    def close(self) -> None:
        channel = getattr(self, "_channel", None)
        if channel is not None:
            channel.close()
        for tunnel in self._tunnels:
            with contextlib.suppress(Exception):
                tunnel.close()
        self._tunnels.clear()


class SandboxdLinks:
    """The link of whichever claim a sandbox uses now; an earlier claim's is closed."""

    def __init__(self, open_tunnel: OpenTunnel, errors: SandboxErrors) -> None:
        self._open_tunnel = open_tunnel
        self._errors = errors
        self._lock = threading.Lock()
        self._current: SandboxdLink | None = None
        self._closed = False

    def to(self, claim: Claim) -> SandboxdLink:
        with self._lock:
            if self._closed:
                raise self._errors("the sandbox was disposed")
            current = self._current
            if current is not None and current.claim == claim.name:
                return current
            self._current = SandboxdLink(claim, self._open_tunnel, self._errors)
            fresh = self._current
        if current is not None:
            current.close()
        return fresh

    def close(self) -> None:
        with self._lock:
            self._closed = True
            current, self._current = self._current, None
        if current is not None:
            current.close()
