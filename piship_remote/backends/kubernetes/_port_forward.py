"""The sandbox router reached by port-forward through the API server, as kubectl does it.

``kubectl port-forward svc/sandbox-router-svc 8080:8080 -n agent-sandbox-system``
picks one ready pod behind the Service and streams a local port to it through the
pod's ``portforward`` subresource. :class:`RouterTunnel` does the same inside the
process: it listens on a loopback port (its :attr:`~RouterTunnel.url` is the
router's URL) and opens one stream per connection made to it::

    tunnel = RouterTunnel(PortForward(), api, endpoint, credential, tls)
    tunnel.hold(sandbox)      # serving: the pod is found now (PiShipError if none is)
    ...requests to tunnel.url...
    tunnel.release(sandbox)   # the last holder gone: every tunnel thread ends

Threads: ``piship-router-tunnel-accept`` while held, and for each connection
``piship-router-tunnel-N`` (with ``-down``); all daemons, all joined when the
last holder releases it or :meth:`RouterTunnel.close` runs. The listener is bound
once, so the URL never changes.

A connection whose stream cannot be opened is answered ``502`` with the header
:data:`TUNNEL_FAILED`: nothing reached the router, so the request never ran.

``RouterTunnel(..., pod="<name>")`` forwards to that pod's ``forward.port`` instead of a
Service's (sandboxd's listeners, in the pod named; ``forward.service`` is then unused),
its threads named after ``names``.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import select
import socket
import ssl
import threading
from collections.abc import Callable
from urllib.parse import quote, urlsplit, urlunsplit

import attrs
import requests.utils

from piship_remote.backends._credential import Credential
from piship_remote.backends.kubernetes._claims_api import RESOURCE_NAME
from piship_remote.backends.kubernetes._http import ClusterHttp
from piship_remote.backends.kubernetes._port_forward_stream import (
    Dial,
    DialRefused,
    Relay,
    dial,
    require_websocket_client,
)
from piship_remote.model.errors import GATEWAY_UNREACHABLE
from piship_remote.transport import TransportError
from piship_remote.wire.kubernetes_core import Endpoints, Service, read

__all__ = ["TUNNEL_FAILED", "PortForward", "RouterTunnel", "TlsSettings"]

TUNNEL_FAILED = "X-Piship-Tunnel-Failed"
"""The header of the tunnel's own 502: the request never reached the router."""
_DIAL_TIMEOUT = 30.0
_DRAIN_SECONDS = 1.0
_log = logging.getLogger("piship_remote.kubernetes")

TlsSettings = Callable[[], "tuple[bool | str, tuple[str, str] | None]"]
"""The API server's CA (``True``: the default bundle, or a file) and client certificate,
read when a stream opens (a refreshed certificate is used from then on)."""


def _resource_name(_: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not RESOURCE_NAME.match(value):
        raise ValueError(f"the port-forward's {attribute.name} must be a Kubernetes resource name")


def _port(_: object, __: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ValueError("the port-forward's port must be 1..65535")


@attrs.frozen
class PortForward:
    """The router's Service, as the official client's local tunnel names it by default."""

    service: str = attrs.field(default="sandbox-router-svc", validator=_resource_name)
    namespace: str = attrs.field(default="agent-sandbox-system", validator=_resource_name)
    port: int = attrs.field(default=8080, validator=_port)
    """The Service's port (mapped to the pod's as the Endpoints say)."""


@attrs.frozen
class _Target:
    pod: str
    port: int


class RouterTunnel:
    """A loopback port whose connections reach the router's pod by port-forward."""

    def __init__(
        self,
        forward: PortForward,
        api: ClusterHttp,
        endpoint: str,
        credential: Credential,
        tls: TlsSettings,
        *,
        pod: str | None = None,
        names: str = "piship-router-tunnel",
    ) -> None:
        require_websocket_client()
        self._pod = pod
        self._names = names
        self._forward = forward
        self._api = api
        self._endpoint = endpoint
        self._credential = credential
        self._tls = tls
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._holders: set[object] = set()
        self._closed = False
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._accepting: threading.Thread | None = None
        self._relays: dict[threading.Thread, Relay | None] = {}
        self._target: _Target | None = None
        self._counter = itertools.count(1)

    @property
    def forward(self) -> PortForward:
        """The Service this tunnel reaches."""
        return self._forward

    def hold(self, holder: object) -> None:
        """Serve until ``holder`` is released; finds the router's pod first."""
        with self._lock:
            if self._closed:
                raise self._api.errors("the sandbox router's port-forward was closed")
            self._holders.add(holder)
            if self._accepting is None:
                self._wake = socket.socketpair()
                self._accepting = threading.Thread(
                    target=self._accept, name=f"{self._names}-accept", daemon=True
                )
                self._accepting.start()
        try:
            self._resolved(fresh=False)
        except BaseException:
            self.release(holder)
            raise

    def release(self, holder: object) -> None:
        """``holder`` is done (again: nothing); the last one stops every tunnel thread."""
        with self._lock:
            if holder not in self._holders:
                return
            self._holders.discard(holder)
            if self._holders:
                return
        self._stop()

    def close(self) -> None:
        """Stop serving and free the port. Idempotent."""
        with self._lock:
            self._closed = True
            self._holders.clear()
        self._stop()
        self._listener.close()

    # ---- finding the pod -------------------------------------------------------------

    def _resolved(self, *, fresh: bool) -> _Target:
        with self._lock:
            target = None if fresh else self._target
        if target is None:
            target = self._find_target()
            with self._lock:
                self._target = target
        return target

    def _find_target(self) -> _Target:
        forward = self._forward
        if self._pod is not None:
            return _Target(self._pod, forward.port)
        service = read(self._get(f"services/{forward.service}"), Service)
        wanted = next((p for p in service.spec.ports if p.port == forward.port), None)
        if wanted is None:
            raise self._api.errors(
                f"the sandbox router's Service {forward.namespace}/{forward.service} has no "
                f"port {forward.port}"
            )
        endpoints = read(self._get(f"endpoints/{forward.service}"), Endpoints)
        for subset in endpoints.subsets:
            ports = [p for p in subset.ports if p.name == wanted.name] or list(subset.ports)
            pods = [
                a.target_ref.name
                for a in subset.addresses
                if a.target_ref is not None and a.target_ref.kind == "Pod" and a.target_ref.name
            ]
            if pods and len(ports) == 1:
                return _Target(pods[0], ports[0].port)
        raise self._api.errors(
            f"the sandbox router's Service {forward.namespace}/{forward.service} has no ready "
            "pod to port-forward to",
            retryable=True,
            user_action="Check the router: kubectl get endpoints "
            f"{forward.service} -n {forward.namespace}",
        )

    def _get(self, path: str) -> object:
        url = f"{self._endpoint}/api/v1/namespaces/{self._forward.namespace}/{path}"
        try:
            response = self._api.call("GET", url)
        except TransportError as error:
            raise self._api.errors(
                f"the Kubernetes API at {self._endpoint} is unreachable, so the sandbox router "
                f"cannot be port-forwarded: {error}",
                code=GATEWAY_UNREACHABLE,
                retryable=True,
            ) from None
        with response:
            if response.status != 200:
                raise self._api.errors(
                    f"reading the sandbox router's {path} in namespace "
                    f"{self._forward.namespace} for its port-forward failed: "
                    f"{self._api.failure(response)}"
                )
            try:
                return response.json_object()
            except (TransportError, ValueError) as error:
                raise self._api.errors(f"the {path} answer could not be read ({error})") from None

    # ---- serving ---------------------------------------------------------------------

    def _accept(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            ready, _, _ = select.select([self._listener, wake[0]], [], [])
            if wake[0] in ready:
                return
            try:
                local, _ = self._listener.accept()
                local.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small frames go now
            except OSError:
                return
            name = f"{self._names}-{next(self._counter)}"
            thread = threading.Thread(target=self._serve, args=(local,), name=name, daemon=True)
            with self._lock:
                self._relays[thread] = None
            thread.start()

    def _serve(self, local: socket.socket) -> None:
        me = threading.current_thread()
        with local:
            try:
                stream = self._open()
            except Exception as error:  # refused, a PiShipError finding the pod, a broken TLS
                _answer_failure(local, str(error))
                return
            relay = Relay(stream, local, name=me.name, refused=_answer_failure)
            with self._lock:
                stopping = me not in self._relays
                self._relays[me] = relay
            if stopping:
                relay.stop()
            relay.run()
        with self._lock:
            self._relays.pop(me, None)

    def _open(self) -> object:
        """A stream to the router's pod: once more after a 401 (renewed credential) or a
        404 (the pod is gone: find another)."""
        fresh = False
        for attempt in (1, 2):
            target = self._resolved(fresh=fresh)
            try:
                return dial(self._dial(target), timeout=_DIAL_TIMEOUT)
            except DialRefused as refused:
                if attempt == 2:
                    raise
                if refused.status == 401 and self._credential.reject():
                    continue
                if refused.status != 404:
                    raise
                fresh = True
        raise AssertionError("unreachable")

    def _dial(self, target: _Target) -> Dial:
        bearer = self._credential.current()
        parts = urlsplit(self._endpoint)
        scheme = "wss" if parts.scheme == "https" else "ws"
        path = (
            f"{parts.path}/api/v1/namespaces/{self._forward.namespace}/pods/"
            f"{quote(target.pod)}/portforward"
        )
        url = urlunsplit((scheme, parts.netloc, path, f"ports={target.port}", ""))
        return Dial(url, bearer, self._ssl_context() if scheme == "wss" else None)

    def _ssl_context(self) -> ssl.SSLContext:
        verify, cert = self._tls()
        context = ssl.create_default_context(
            cafile=verify if isinstance(verify, str) else requests.utils.DEFAULT_CA_BUNDLE_PATH
        )
        if cert is not None:
            context.load_cert_chain(*cert)
        return context

    def _stop(self) -> None:
        with self._lock:
            if self._holders and not self._closed:
                return
            accepting, self._accepting = self._accepting, None
            wake, self._wake = self._wake, None
            relays = dict(self._relays)
            self._relays.clear()
        if wake is not None:
            with contextlib.suppress(OSError):
                wake[1].send(b"x")
        if accepting is not None:
            accepting.join()
        for relay in relays.values():
            if relay is not None:
                relay.stop()
        for thread in relays:
            thread.join()
        if wake is not None:
            for end in wake:
                end.close()


def _answer_failure(local: socket.socket, reason: str, *, drain: bool = True) -> None:
    """The tunnel's own 502 (see :data:`TUNNEL_FAILED`), then the request is drained."""
    _log.warning("the port-forward to the sandbox router failed: %s", reason[:200])
    body = json.dumps({"detail": f"the port-forward to the sandbox router failed: {reason}"})
    data = body.encode()
    head = (
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\n"
        f"{TUNNEL_FAILED}: 1\r\nContent-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        local.sendall(head.encode() + data)
        local.shutdown(socket.SHUT_WR)
        if not drain:
            return
        local.settimeout(_DRAIN_SECONDS)
        while local.recv(64 * 1024):
            pass
