"""A fake Kubernetes cluster running agent-sandbox, on one loopback server.

One server plays the Kubernetes API server, the agent-sandbox controller, the
sandbox router and each sandbox's runtime::

    cluster = Cluster(expired=set())
    with KubernetesServer(lambda command: {"stdout": "ok\\n", "exit_code": 0}, cluster) as mock:
        backend = KubernetesAgentSandboxBackend(
            endpoint=mock.url, router=mock.url, template="python-pool", namespace="agents")
        ...
        cluster.expired.add(name)             # the cluster removed that claim
        assert mock.count("POST", CLAIMS) == 1
        assert mock.files(name) == {"a/b.txt": b"hi"}

**API server** (:mod:`~piship_remote.testing.k8s_store`): SandboxClaims
(``/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/<ns>/sandboxclaims``) can be
created (201 with ``uid``, ``resourceVersion``, ``creationTimestamp``; 409
``AlreadyExists``; a body without ``Content-Type`` is JSON), read, listed (with
``labelSelector``), watched, merge-patched (also ``/status``) and deleted (200 with
the last state; a ``preconditions.uid`` body is honoured); Sandboxes
(``/apis/agents.x-k8s.io/v1beta1/namespaces/<ns>/sandboxes``) can be read, listed and
watched. Every error is a ``Status`` object (404 ``NotFound``, 409, 410, 415, 422).
A watch (``?watch=true``) streams one JSON event per line: from ``resourceVersion``
unset or ``0`` the current objects as ``ADDED``, from a version every change after
it, from a compacted one (:meth:`KubernetesServer.compact`) an ``ERROR`` 410 event
(HTTP 410 with ``cluster.gone_as_http``); ``fieldSelector=metadata.name=<n>`` narrows
it, and it stays open until ``timeoutSeconds``.

**Controller** (:mod:`~piship_remote.testing.k8s_controller`): a claim gets a Sandbox
named ``pool-<claim>`` with ``status.podIPs`` and is ``Ready=False`` until a client
has seen it so, then ``Ready=True`` (never with ``cluster.never_ready``). A claim's
``status.sandbox.podIPs`` mirrors the Sandbox's only when ``cluster.pod_ip`` is set.
Claims expire at their ``shutdownTime`` on ``cluster.clock`` (the wall clock unless a
test sets another; ``None`` turns expiry off).

**Router and runtime** (:mod:`~piship_remote.testing.k8s_router`,
:mod:`~piship_remote.testing.k8s_runtime`): ``/execute``, ``/upload``,
``/download/<p>``, ``/list/<p>``, ``/exists/<p>`` and ``/`` reach a live Sandbox's
runtime; ``GET /healthz`` is the router's own.

Fault knobs (:class:`Cluster`, mutable while the server runs):

- ``token``: every request must carry ``Authorization: Bearer <token>``, else 401
  ``{"message":"Unauthorized: <the header, or no token>"}``;
- ``create_status`` (>= 400): a claim POST is refused with an RBAC-style Status that
  echoes the bearer;
- ``delete_status``: >= 400 refuses a claim DELETE with ``{"message":"etcd
  unavailable"}`` (the claim stays); below 400 it deletes and answers ``{}``;
- ``expired``: claim names the cluster removed: they are deleted when next touched, and
  the router answers 404 ``{}`` for ``pool-<name>``;
- ``router_gone``: the claim stays, but the router answers 404 ``{}`` for ``pool-<name>``;
- ``real_router``: those two answer 502 ``{"detail": …}`` instead, and with ``pod_ip``
  set a request without that ``X-Sandbox-Pod-IP`` is 502 too;
- ``patch_gate``: every PATCH waits until this event is set;
- ``warm_pools``: when set, a claim naming another pool is ``WarmPoolNotFound``;
- ``services``: False models warm-pool sandboxes without a Service: the router reaches
  them only by ``X-Sandbox-Pod-IP`` (by name it answers 502);
- ``proxy_timeout`` / ``runtime_timeout``: the router's and the runtime's limits;
- ``router_token``: the router's own bearer (401 ``{"detail": …}`` as the real router
  answers), ``token`` then guards the API server only; ``scoped_router``: the router
  refuses ``X-Sandbox-Pod-IP`` and ``X-Sandbox-UID`` (403);
- ``denied``: ``"<verb> <resource>"`` pairs a ``SelfSubjectAccessReview``
  (``POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews``) answers not allowed;
  ``pool_ready_replicas``: the ready replicas a ``GET …/sandboxwarmpools/<name>`` reports.

**The router's Service** (:mod:`~piship_remote.testing.k8s_portforward`):
``sandbox-router-svc`` in ``agent-sandbox-system`` (``cluster.router_service``,
``router_namespace``), its Endpoints (``router_pods``) and each pod's
``portforward`` subresource (WebSocket, ``v4.channel.k8s.io``), whose port 8080 is
this server's router, as ``kubectl port-forward svc/sandbox-router-svc`` reaches it.

``tls`` (an ``ssl.SSLContext``) serves HTTPS; with ``cluster.client_subject`` the API
server wants a client certificate of that name (or ``token``), and ``client_subjects``
records which certificate each request came with.

``execute(command)`` returns a mapping with any of:

==============  =====================================================================
``stdout``      text (or bytes, decoded as strict UTF-8 like the runtime) in the result
``stderr``      the same for stderr (``""`` when absent)
``exit_code``   in the result only when given
``after``       a ``threading.Event``: answer only once it is set
``hang``        True: never answer (until a router or runtime limit, or close)
``drop``        True: close the connection without any response
``status``      answer with this HTTP status and ``{"message":"forbidden: <bearer or
                anonymous> may not execute in this sandbox"}`` (or ``body``)
``body``        answer with this body verbatim (text, bytes or a JSON value) instead of
                the result object, with ``status`` (default 200)
==============  =====================================================================

``file_tree(claim)`` makes the runtime's file tree of a claim (default: an in-memory
:class:`~piship_remote.testing.k8s_runtime.FileTree` whose base is ``/app``); a test
whose ``execute`` runs commands for real passes a tree over the directory they run in.
With the default tree, a command the in-memory shell understands
(:mod:`piship_remote.testing.sandbox_shell`) runs against the claim's tree — every such
command without ``execute``, beside one only the library's archive transfers (which
name its ``/.piship-`` staging files) and its ``pwd`` question.

``faults`` (:class:`~piship_remote.testing.faults.Faults`) and ``kill(claim)`` make
failures on demand.

``runtime="sandboxd"`` (needs the ``sandboxd`` extra): the sandboxes' template announces
agent-sandbox 1.0's runtime (``SANDBOXD_GRPC_ADDR`` and ``SANDBOXD_REST_ADDR`` on the
workload container, beside a ``sandboxd`` container), and each sandbox pod runs one
(:mod:`~piship_remote.testing.k8s_sandboxd`: real processes in a temporary directory of
its own, the gRPC ``ProcessService`` on port 9090 and the REST files on 8080), reached
through the pod's ``portforward`` subresource; ``sandboxd_address(claim)`` gives its two
loopback listeners directly, ``files(claim)`` what its directory holds.

Every event the server waits on (``after``, ``patch_gate``) is set when it closes.
"""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import ssl
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
from werkzeug import Request, Response
from werkzeug.formparser import parse_form_data

from piship_remote._http_server.server import Head
from piship_remote._http_server.server import Reply as RawReply
from piship_remote.model.errors import ConfigInvalid
from piship_remote.testing.faults import Faults, hold_if_stalled
from piship_remote.testing.k8s_access import access_review, refused, warm_pool
from piship_remote.testing.k8s_api import RESOURCE_PATH, ResourceApi
from piship_remote.testing.k8s_controller import WALL_CLOCK, Controller
from piship_remote.testing.k8s_portforward import PortForwards
from piship_remote.testing.k8s_router import (
    SANDBOX_PREFIX,
    Execute,
    ExecuteAnswer,
    Router,
    RouterRequest,
)
from piship_remote.testing.k8s_runtime import FileTree, Reply
from piship_remote.testing.k8s_schema import json_object
from piship_remote.testing.k8s_store import ApiError, Store
from piship_remote.testing.recorder import (
    CLIENT_SUBJECT,
    THREAD_PREFIX,
    RecordingServer,
    json_response,
)
from piship_remote.wire.agent_sandbox import CLAIMS as CLAIM_RESOURCE
from piship_remote.wire.agent_sandbox import SANDBOXES as SANDBOX_RESOURCE

if TYPE_CHECKING:
    from piship_remote.testing.k8s_sandboxd import SandboxdPods
    from piship_remote.testing.k8s_sandboxd_proxy import SandboxdProxy

__all__ = ["CLAIMS", "RUNTIMES", "Cluster", "ExecuteAnswer", "KubernetesServer", "claims_path"]

RUNTIMES = ("python-runtime", "sandboxd")
_SANDBOXD_CONTAINERS = [
    {"name": "sandboxd", "ports": [{"containerPort": 8080}, {"containerPort": 9090}]},
    {
        "name": "workload",
        "env": [
            {"name": "SANDBOXD_GRPC_ADDR", "value": "localhost:9090"},
            {"name": "SANDBOXD_REST_ADDR", "value": "localhost:8080"},
        ],
    },
]

_LOG = logging.getLogger("piship_remote.testing")


def claims_path(namespace: str) -> str:
    """The SandboxClaim collection path of ``namespace``."""
    return CLAIM_RESOURCE.collection(namespace)


CLAIMS = claims_path("agents")
"""The claims collection for namespace ``agents``."""

_WARM_POOL = re.compile(
    r"^/apis/extensions\.agents\.x-k8s\.io/v1beta1/namespaces/(?P<ns>[^/]+)/"
    r"sandboxwarmpools/(?P<name>[^/]+)$"
)
_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
_ROUTER_PATHS = re.compile(r"^/(execute|upload|download/.*|list/.*|exists/.*)?$")
_RECONCILE_INTERVAL = 0.05
_POD_NAME = "agents.x-k8s.io/pod-name"


@attrs.define
class Cluster:
    """The fake cluster's knobs; tests may change any field while the server runs."""

    token: str | None = None
    create_status: int | None = None
    delete_status: int | None = None
    expired: set[str] = attrs.field(factory=set)
    router_gone: set[str] = attrs.field(factory=set)
    patch_gate: threading.Event | None = None
    never_ready: bool = False
    pod_ip: str | None = None
    """Every sandbox pod's address; when set, claims also mirror it in ``status.sandbox``."""
    real_router: bool = False
    """``expired``/``router_gone`` answer the real router's 502, and ``pod_ip`` is required."""
    warm_pools: set[str] | None = None
    """The warm pools that exist (None: any pool a claim names)."""
    clock: Callable[[], float] | None = WALL_CLOCK
    """The controller's clock (epoch seconds) for ``shutdownTime``; None: never expire.
    The default is the wall clock (see :func:`~piship_remote.testing.k8s_controller.WALL_CLOCK`
    for a claim created already past its end)."""
    proxy_timeout: float = 180.0
    """The router's own limit on one proxied request (``X-Sandbox-Timeout`` may lower it)."""
    runtime_timeout: float = 300.0
    """The runtime's limit on one command."""
    services: bool = True
    """Sandboxes have a Service, so the router reaches them by name; False: only by pod IP."""
    gone_as_http: bool = False
    """A watch from a compacted resourceVersion is refused with HTTP 410, not an ERROR event."""
    router_token: str | None = None
    """The router's own token (its ``ROUTER_AUTH_TOKEN``); ``token`` then guards the API only."""
    scoped_router: bool = False
    """The router checks scoped tokens: it refuses ``X-Sandbox-Pod-IP`` and ``X-Sandbox-UID``."""
    denied: set[str] = attrs.field(factory=set)
    """``"<verb> <resource>"`` pairs access reviews deny (e.g. ``"delete sandboxclaims"``)."""
    pool_ready_replicas: int = 1
    """How many of each warm pool's one replica are ready."""
    client_subject: str | None = None
    """The API server accepts only clients whose verified certificate has this common name
    (with ``tls`` whose context asks for client certificates), or a bearer ``token``."""
    router_service: str = "sandbox-router-svc"
    """The router's Service, in ``router_namespace`` (a port-forward's target)."""
    router_namespace: str = "agent-sandbox-system"
    router_pods: list[str] = attrs.field(factory=lambda: ["sandbox-router-6d8f9-x7k2p"])
    """The router Service's ready pods (its Endpoints); empty: none ready."""
    router_upstream: tuple[str, int] | None = None
    """A loopback router a port-forward reaches instead of this server's (e.g. the real one)."""


class KubernetesServer(RecordingServer):
    """The started fake cluster; see the module docstring for what it serves."""

    def __init__(
        self,
        execute: Execute | None = None,
        cluster: Cluster | None = None,
        *,
        file_tree: Callable[[str], FileTree] | None = None,
        tls: ssl.SSLContext | None = None,
        runtime: str = "python-runtime",
    ) -> None:
        if runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, not {runtime!r}")
        self.runtime = runtime
        self.cluster = cluster if cluster is not None else Cluster()
        self.store = Store()
        """The API server's objects (read them, or change them as a cluster would)."""
        self.controller = Controller(
            self.store,
            self.cluster,
            lambda c: SANDBOX_PREFIX + c,
            _SANDBOXD_CONTAINERS if runtime == "sandboxd" else None,
        )
        self.faults = Faults()
        """Faults on demand (:class:`~piship_remote.testing.faults.Faults`)."""
        self._sandboxd = _sandboxd_pods(self.faults) if runtime == "sandboxd" else None
        self._proxy = (
            _sandboxd_proxy(self._sandboxd, self._reaches, self._router_token)
            if self._sandboxd is not None
            else None
        )
        self._router = Router(
            self.store,
            self.cluster,
            execute,
            self.wait,
            lambda: self.closing,
            file_tree,
            self.faults.take_dropped_stream,
        )
        self._api = ResourceApi(
            self.store, self.cluster, self.controller, self.faults, self, self._apply_expired
        )
        self._stop = threading.Event()
        self.client_subjects: list[tuple[str, str | None]] = []
        """Each request's path and its verified client certificate's common name, if any."""
        self._port_forwards = PortForwards(
            self.cluster, self, self._sandboxd_listener if self._sandboxd is not None else None
        )
        super().__init__(self._handle, tls=tls, tunnel=self._tunnel)
        self._ticker = threading.Thread(
            target=self._tick, name=f"{THREAD_PREFIX}controller", daemon=True
        )
        self._ticker.start()

    @property
    def live_claims(self) -> list[str]:
        """Claims that exist and are not in ``cluster.expired``, in creation order."""
        expired = set(self.cluster.expired)
        names = [c["metadata"]["name"] for c in self.store.objects(CLAIM_RESOURCE)]
        return [name for name in names if name not in expired]

    def kill(self, claim_name: str, namespace: str = "agents") -> None:
        """Delete the claim now, as the cluster would at its ``shutdownTime``: its sandbox
        goes with it and the router no longer reaches it."""
        deleted = self.store.delete(CLAIM_RESOURCE, namespace, claim_name)
        self.controller.claim_deleted(namespace, deleted)
        self._router.forget(claim_name)

    def files(self, claim_name: str) -> dict[str, bytes]:
        """The files in ``claim_name``'s sandbox runtime, by path relative to its base."""
        if self._sandboxd is not None:
            return _tree_of(self._sandboxd.pod(SANDBOX_PREFIX + claim_name).root)
        return self._router.files(claim_name)

    @property
    def sandboxd_proxy(self) -> str:
        """``runtime="sandboxd"``: the router's gRPC proxy (``127.0.0.1:<port>``), which
        routes each call by its ``x-sandbox-id`` and ``x-sandbox-namespace`` metadata (the
        router's HTTP forwards sandboxd's REST surface the same way, ``X-Sandbox-Port``
        8080)."""
        if self._proxy is None:
            raise ValueError('the server runs no sandboxd (KubernetesServer(runtime="sandboxd"))')
        return str(self._proxy.address)

    def sandboxd_address(self, claim_name: str) -> tuple[str, int, int]:
        """``runtime="sandboxd"``: the host, REST port and gRPC port of ``claim_name``'s
        sandboxd on loopback, as a port-forward to its pod reaches them."""
        if self._sandboxd is None:
            raise ValueError('the server runs no sandboxd (KubernetesServer(runtime="sandboxd"))')
        pod = self._sandboxd.pod(SANDBOX_PREFIX + claim_name)
        return "127.0.0.1", pod.rest_port, pod.grpc_port

    def reconcile(self) -> None:
        """Run one controller pass now (it also runs every 50 ms on its own)."""
        self._apply_expired()
        self.controller.reconcile()

    def compact(self) -> None:
        """Drop the watch history: a watch from an older resourceVersion gets 410 Gone."""
        self.store.compact()

    def close(self) -> None:
        self._stop.set()
        super().close()
        if self._ticker is not threading.current_thread():
            self._ticker.join()
        if self._proxy is not None:
            self._proxy.close()
        if self._sandboxd is not None:
            self._sandboxd.close()

    # ---- the HTTP layer --------------------------------------------------------------

    def _tunnel(self, head: Head) -> socket.socket | RawReply | None:
        upstream = self._port_forwards.tunnel(head)
        if upstream is not None:
            self.client_subjects.append((head.path, head.client_subject))
        return upstream

    def _handle(self, request: Request) -> Response:
        hold_if_stalled(self.faults, request.path, self.wait, lambda: self.closing)
        router = not request.path.startswith(("/apis/", "/api/"))
        subject = request.environ.get(CLIENT_SUBJECT)
        self.client_subjects.append((request.path, subject))
        refusal = refused(_lower(request), self.cluster, router=router, subject=subject)
        if refusal is not None:
            return json_response(*refusal)
        self._apply_expired()
        if request.path == _ACCESS_REVIEWS and request.method == "POST":
            try:
                review = access_review(json_object(request.get_data()), self.cluster)
            except ApiError as error:
                return json_response(error.code, error.status())
            return json_response(201, review)
        core = self._port_forwards.core(request)
        if core is not None:
            return core
        pool = _WARM_POOL.match(request.path)
        if pool is not None and request.method == "GET":
            found = warm_pool(pool["ns"], pool["name"], self.cluster)
            if found is None:
                missing = ApiError(404, "NotFound", f'sandboxwarmpools "{pool["name"]}" not found')
                return json_response(404, missing.status())
            return json_response(200, found)
        match = RESOURCE_PATH.match(request.path)
        if match is not None:
            return self._api.handle(request, match)
        if request.path == "/healthz" and request.method == "GET":
            return json_response(200, {"status": "ok"})
        if self._sandboxd is not None:
            forwarded = _sandboxd_rest(request, self._sandboxd, self._reaches, _lower(request))
            if forwarded is not None:
                return forwarded
        if _ROUTER_PATHS.match(request.path):
            return _response(self._router.handle(_router_request(request)))
        return json_response(404, {})

    # ---- the cluster's own work ------------------------------------------------------

    def _apply_expired(self) -> None:
        expired = set(self.cluster.expired)
        if not expired:
            return
        for claim in self.store.objects(CLAIM_RESOURCE):
            metadata = claim["metadata"]
            if metadata["name"] in expired:
                try:
                    deleted = self.store.delete(
                        CLAIM_RESOURCE, metadata["namespace"], metadata["name"]
                    )
                except ApiError:
                    continue
                self.controller.claim_deleted(metadata["namespace"], deleted)

    def _tick(self) -> None:
        while not self._stop.wait(_RECONCILE_INTERVAL):
            try:
                self.reconcile()
                if self._sandboxd is not None:
                    self._sandboxd.sweep(self._live_pods())
            except Exception:
                _LOG.exception("the fake controller's pass failed")

    def _live_pods(self, namespace: str | None = None) -> set[str]:
        return {
            str(s["metadata"].get("annotations", {}).get(_POD_NAME, s["metadata"]["name"]))
            for s in self.store.objects(SANDBOX_RESOURCE, namespace)
        }

    def _reaches(self, namespace: str, sandbox: str) -> bool:
        claim = sandbox.removeprefix(SANDBOX_PREFIX)
        if claim in self.cluster.expired | self.cluster.router_gone:
            return False
        return sandbox in self._live_pods(namespace)

    def _router_token(self) -> str | None:
        return self.cluster.router_token or self.cluster.token

    def _sandboxd_listener(
        self, namespace: str, pod: str, port: int
    ) -> tuple[bool, tuple[str, int] | None]:
        if self._sandboxd is None or pod not in self._live_pods(namespace):
            return False, None
        return True, self._sandboxd.pod(pod).address(port)


def _sandboxd_pods(faults: Faults) -> SandboxdPods:
    try:
        from piship_remote.testing.k8s_sandboxd import SandboxdPods as Pods
    except ImportError:
        raise ConfigInvalid(
            'KubernetesServer(runtime="sandboxd") needs grpcio and protobuf',
            user_action="pip install 'piship-remote[sandboxd]'",
        ) from None
    return Pods(faults)


def _sandboxd_proxy(
    pods: SandboxdPods, reaches: Callable[[str, str], bool], token: Callable[[], str | None]
) -> SandboxdProxy:
    from piship_remote.testing.k8s_sandboxd_proxy import SandboxdProxy as Proxy

    return Proxy(pods, reaches, token)


def _sandboxd_rest(
    request: Request,
    pods: SandboxdPods,
    reaches: Callable[[str, str], bool],
    headers: dict[str, str],
) -> Response | None:
    from piship_remote.testing.k8s_sandboxd_proxy import rest

    return rest(request, pods, reaches, headers)


def _tree_of(root: str) -> dict[str, bytes]:
    found = {}
    for directory, _, names in os.walk(root):
        for name in names:
            full = os.path.join(directory, name)
            if os.path.isfile(full) and not os.path.islink(full):
                with open(full, "rb") as opened:
                    found[os.path.relpath(full, root)] = opened.read()
    return found


def _lower(request: Request) -> dict[str, str]:
    return {name.lower(): value for name, value in request.headers.items()}


def _router_request(request: Request) -> RouterRequest:
    headers = _lower(request)
    upload: tuple[str | None, bytes | None] = (None, None)
    if request.path == "/upload" and request.mimetype == "multipart/form-data":
        environ = {**request.environ, "wsgi.input": io.BytesIO(request.get_data())}
        _, _, files = parse_form_data(environ)
        part = files.get("file")
        if part is not None:
            upload = (part.filename, part.read())
    return RouterRequest(request.method, request.path, headers, request.get_data(), upload)


def _response(reply: Reply) -> Response:
    if isinstance(reply.body, bytes) and reply.headers:
        return Response(reply.body, status=reply.status, headers=dict(reply.headers))
    return json_response(reply.status, reply.body)
