"""The way to one claim's sandboxd, by one of two routes:

- :class:`PodLink`: a port-forward to each of its pod's two listeners (the library's own,
  through the API server), a gRPC channel on the first, the REST base on the second;
- :class:`ProxyLink`: the router's gRPC proxy for the ``ProcessService`` and the router's
  HTTP for the REST surface, both addressed like the router's other requests
  (``X-Sandbox-ID``, ``X-Sandbox-Namespace``; as gRPC metadata for the proxy) with the
  router's credential.

::

    require_sandboxd()                          # CONFIG_INVALID naming the extra, if missing
    links = SandboxdLinks(lambda claim: PodLink(claim, open_tunnel, errors), errors)
    link = links.to(claim)                      # opened on first use, kept while the claim is
    link.processes.run(...)
    link.send("GET", f"{link.rest}/v1/files/a", headers=link.headers, ...)
    links.close()                               # every tunnel and channel of this sandbox

Threads: each tunnel's ``piship-sandboxd-tunnel-…`` (see :mod:`._port_forward`); all end
with :meth:`SandboxdLinks.close`, or when the claim is replaced.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from piship_remote.backends._common import SandboxErrors
from piship_remote.backends._credential import Credential
from piship_remote.backends.kubernetes._http import ClusterHttp
from piship_remote.backends.kubernetes._port_forward import RouterTunnel
from piship_remote.backends.kubernetes._router import Router
from piship_remote.backends.kubernetes.claims import Claim
from piship_remote.model.errors import ConfigInvalid
from piship_remote.transport import HttpClient, HttpReply

if TYPE_CHECKING:
    from piship_remote.backends.kubernetes._sandboxd_process import SandboxdProcesses

__all__ = [
    "GRPC_PORT",
    "REST_PORT",
    "OpenTunnel",
    "PodLink",
    "ProxyLink",
    "SandboxdLink",
    "SandboxdLinks",
    "proxy_target",
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
        raise ConfigInvalid(
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


Send = Callable[..., HttpReply]
"""How a link sends one REST request: ``send(method, url, **request options)``."""


class SandboxdLink:
    """One claim's open way to its sandboxd: ``processes`` (its ``ProcessService``), and
    ``send`` to ``rest`` (its REST base URL) with ``headers`` for its REST surface."""

    claim: str
    rest: str
    headers: Mapping[str, str]
    send: Send
    processes: SandboxdProcesses

    def close(self) -> None:
        """Close what the link opened (idempotent)."""


class PodLink(SandboxdLink):
    """Through the library's own port-forwards to the pod (sandboxd binds its loopback)."""

    def __init__(
        self, claim: Claim, open_tunnel: OpenTunnel, transport: HttpClient, errors: SandboxErrors
    ) -> None:
        import grpc

        from piship_remote._sandboxd.process_rpc import ProcessStub
        from piship_remote.backends.kubernetes._sandboxd_process import SandboxdProcesses

        pod = claim.pod_name or claim.sandbox
        self.claim = claim.name
        self.headers = {}
        self.send = transport.request  # no credential goes to the pod
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


def proxy_target(address: str) -> tuple[str, bool]:
    """The gRPC target of ``grpc://host:port`` (plaintext: loopback hosts only) or
    ``grpcs://host:port`` (TLS), and whether it is TLS; ``ValueError`` otherwise.

    >>> proxy_target("grpc://127.0.0.1:9090"), proxy_target("grpcs://router.example:443")
    (('127.0.0.1:9090', False), ('router.example:443', True))
    """
    scheme, _, target = address.partition("://")
    host = target.rsplit(":", 1)[0].strip("[]")
    if scheme not in ("grpc", "grpcs") or not target or ":" not in target or "/" in target:
        raise ValueError('sandboxd_proxy must be "grpcs://host:port" (or "grpc://" on loopback)')
    if scheme == "grpc" and host not in ("localhost", "::1") and not host.startswith("127."):
        raise ValueError("a plaintext sandboxd_proxy (grpc://) must be a loopback address")
    return target, scheme == "grpcs"


class ProxyLink(SandboxdLink):
    """Through the router: its gRPC proxy and its HTTP, addressed as its other requests."""

    def __init__(
        self,
        claim: Claim,
        proxy: str,
        router: Router,
        router_url: str,
        router_http: ClusterHttp,
        credential: Credential,
        errors: SandboxErrors,
    ) -> None:
        import grpc

        from piship_remote._sandboxd.process_rpc import ProcessStub
        from piship_remote.backends.kubernetes._sandboxd_process import SandboxdProcesses

        self.claim = claim.name
        routing = router.headers(claim)
        self.headers = {**routing, "X-Sandbox-Port": str(port_of(claim.sandboxd_rest, REST_PORT))}
        self.rest = router_url.rstrip("/")
        self.send = router_http.call  # with the router's credential
        grpc_routing = {**routing, "X-Sandbox-Port": str(port_of(claim.sandboxd_grpc, GRPC_PORT))}

        def metadata() -> list[tuple[str, str]]:
            pairs = [(name.lower(), value) for name, value in grpc_routing.items()]
            bearer = credential.current()
            return [*pairs, ("authorization", f"Bearer {bearer}")] if bearer else pairs

        target, secure = proxy_target(proxy)
        self._channel: Any = (
            grpc.secure_channel(target, grpc.ssl_channel_credentials())
            if secure
            else grpc.insecure_channel(target)
        )
        self.processes = SandboxdProcesses(ProcessStub(self._channel), errors, metadata)

    def close(self) -> None:
        self._channel.close()


class SandboxdLinks:
    """The link of whichever claim a sandbox uses now; an earlier claim's is closed."""

    def __init__(self, open_link: Callable[[Claim], SandboxdLink], errors: SandboxErrors) -> None:
        self._open_link = open_link
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
            self._current = self._open_link(claim)
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
