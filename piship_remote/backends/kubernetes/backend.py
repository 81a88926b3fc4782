"""The ``kubernetes-agent-sandbox`` backend: SandboxClaims and the sandbox router.

``prepare()`` claims a sandbox from a warm pool (a ``SandboxClaim`` with a bounded
``lifecycle.shutdownTime`` and ``shutdownPolicy: Delete``) and waits until it is
ready; each command is one ``POST {router}/execute``. The claim is renewed while it
is in use, replaced when it expired or got lost, and deleted at the end
(:mod:`piship_remote.backends.kubernetes.claims`)::

    backend = KubernetesAgentSandboxBackend(
        endpoint="https://k8s.example.com", router="https://router.example.com",
        template="python-pool", namespace="agents", credential=lambda: token())
    sandbox = activate_sandbox({"required": True, "network": {"mode": "allow"}},
                               backend=backend, workspace=".")

The router runs commands without a shell and returns their whole output at once,
so :func:`runtime_command` wraps each one in ``env … /bin/sh -c``. With
``execution="detached"`` a command instead runs as a background job in the sandbox
whose output is polled (:mod:`piship_remote.backends.kubernetes._jobs`): it outlives
the router's proxy limit, streams its output, and a cancel kills it and keeps the claim.
A command whose outcome the router cannot tell (dropped connection, 504) is never re-sent:
its claim is retired and deleted, and the error says to check its effects first.

A direct command is one request: a claim the API saw alive less than
``existence_window`` seconds ago is not checked first. When the router then cannot
reach the sandbox (404, or 502 "Could not connect"), the command never started and
one GET of the claim decides: gone, and the command runs once in a new claim;
still there, or the API cannot say, and the claim is retired without running the
command again. The price: a claim removed within the window whose pod still
answers runs that command and returns its real result.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

import requests

from piship_remote.backends._common import (
    DETAIL_LIMIT,
    OpenInstances,
    SandboxErrors,
    is_success,
)
from piship_remote.backends._credential import Credential
from piship_remote.backends._owned import OwnedSandbox, check_labels
from piship_remote.backends.base import (
    Availability,
)
from piship_remote.backends.kubernetes._attach import KeptClaims
from piship_remote.backends.kubernetes._claims_api import RESOURCE_NAME, ClaimOptions, ClaimsApi
from piship_remote.backends.kubernetes._cluster_config import (
    SERVICE_ACCOUNT,
    ClusterAccess,
    cluster_options,
    from_kubeconfig,
    in_cluster,
)
from piship_remote.backends.kubernetes._files import RuntimeFiles
from piship_remote.backends.kubernetes._http import ROUTER_TOKEN_ACTION, ClusterHttp
from piship_remote.backends.kubernetes._instance import KubernetesInstance
from piship_remote.backends.kubernetes._jobs import DetachedJobs
from piship_remote.backends.kubernetes._port_forward import PortForward, RouterTunnel, TlsSettings
from piship_remote.backends.kubernetes._preflight import Check, Preflight
from piship_remote.backends.kubernetes._router import Router, runtime_command
from piship_remote.backends.kubernetes._sandboxd_link import (
    PodLink,
    ProxyLink,
    SandboxdLink,
    SandboxdLinks,
    proxy_target,
    require_sandboxd,
)
from piship_remote.backends.kubernetes.claims import (
    DEFAULT_EXISTENCE_WINDOW,
    Claim,
    ClaimManager,
    ExistenceWindow,
    existence_window_seconds,
)
from piship_remote.backends.lifetime import ClaimClock, keepalive_interval
from piship_remote.backends.lifetime import lifetime_seconds as lifetime_seconds_or_default
from piship_remote.model.errors import (
    GATEWAY_UNREACHABLE,
    PiShipError,
)
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.model.report import Capabilities
from piship_remote.telemetry import Telemetry
from piship_remote.transport import HttpClient, Transport, check_endpoint

__all__ = [
    "PORT_FORWARD",
    "PROVIDER",
    "KubernetesAgentSandboxBackend",
    "KubernetesInstance",
    "PortForward",
    "runtime_command",
]

PROVIDER = "kubernetes-agent-sandbox"
EXECUTION_MODES = ("direct", "detached")
RUNTIMES = ("auto", "python-runtime", "sandboxd")
PORT_FORWARD = "port-forward"
"""``router=`` this: reach the router by port-forward (:class:`PortForward`'s defaults)."""
ROUTER_AUTH_MODES = ("bearer", "scoped-token")
# What a user sets for the bearer token, named when it is missing.
_CREDENTIAL_NAME = "the Kubernetes bearer token (the credential option)"
_ROUTER_CREDENTIAL_NAME = "the sandbox router's token (the router_credential option)"


class KubernetesAgentSandboxBackend:
    """Runs commands in sandboxes claimed from a kubernetes-sigs/agent-sandbox warm pool.

    All durations are seconds; ``now`` and ``monotonic`` are the wall and monotonic
    clocks (injectable for tests). ``credential()`` is read for every request and sent
    as a bearer to the API and the router; ``credential_rejected()`` is called on a
    401 and returns ``True`` when a renewed credential is ready. ``client`` replaces
    the HTTP client (any :class:`~piship_remote.transport.HttpClient`).
    ``existence_window``: how long a claim the API saw alive goes unchecked before a
    direct command (0: checked before every one; negative: ``CONFIG_INVALID``).

    The router: ``router_credential()`` is its own bearer (its ``ROUTER_AUTH_TOKEN``),
    sent instead of ``credential()``; ``router_session`` its own session (default:
    ``session``); ``router_auth="scoped-token"`` for a router checking tokens scoped
    to one sandbox, which refuses the pod-IP and UID routing headers.
    ``router="port-forward"`` (or a :class:`PortForward` naming another Service)
    reaches the router as ``kubectl port-forward svc/sandbox-router-svc`` does,
    through the API server with the cluster's credentials, while a sandbox is open
    (needs the ``kubernetes`` extra).
    The claim: ``env`` (through the policy's environment filter), ``pod_labels`` and
    ``pod_annotations`` (``additionalPodMetadata``), ``volume_claim_templates``,
    ``ttl_seconds_after_finished``; ``foreground_deletion=True`` deletes each claim with
    ``propagationPolicy: Foreground``, so the claim stays (with a ``deletionTimestamp``)
    until its Sandbox and pod are gone. ``KubernetesInstance.claim()`` gives the current
    claim with its Sandbox's ``service_fqdn`` and ``node_name``.
    :meth:`from_kubeconfig` and :meth:`in_cluster` take the cluster's own credentials.

    Raises (on construction):
        NetworkDenied: plain HTTP to an endpoint that is not on loopback.
        TlsPolicyViolation: a ``session`` with TLS verification turned off.
        ConfigInvalid: an option or the endpoint is wrong; the message names it.
    """

    id = PROVIDER
    provider = PROVIDER

    def __init__(
        self,
        *,
        endpoint: str,
        router: str | PortForward,
        template: str,
        namespace: str = "default",
        port: int = 8888,
        workdir: str | None = None,
        lifetime_seconds: float = 3600,
        poll_interval: float = 1.0,
        ready_timeout: float = 120.0,
        now: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        credential: Callable[[], str | None] | None = None,
        credential_rejected: Callable[[], bool] | None = None,
        session: requests.Session | None = None,
        client: HttpClient | None = None,
        execution: Literal["direct", "detached"] = "direct",
        existence_window: float = DEFAULT_EXISTENCE_WINDOW,
        router_credential: Callable[[], str | None] | None = None,
        router_session: requests.Session | None = None,
        router_auth: Literal["bearer", "scoped-token"] = "bearer",
        env: Mapping[str, str] | None = None,
        pod_labels: Mapping[str, str] | None = None,
        pod_annotations: Mapping[str, str] | None = None,
        volume_claim_templates: Sequence[Mapping[str, Any]] | None = None,
        ttl_seconds_after_finished: int | None = None,
        foreground_deletion: bool = False,
        runtime: Literal["auto", "python-runtime", "sandboxd"] = "auto",
        sandboxd_proxy: str | None = None,
    ) -> None:
        if execution not in EXECUTION_MODES:
            raise ValueError('execution must be "direct" or "detached"')
        if runtime not in RUNTIMES:
            raise ValueError('runtime must be "auto", "python-runtime" or "sandboxd"')
        if runtime == "sandboxd" and execution == "detached":
            raise ValueError('execution="detached" is for the router\'s runtime, not sandboxd')
        self.runtime = runtime
        if sandboxd_proxy is not None:
            proxy_target(sandboxd_proxy)  # ValueError now, not at the first command
        self._sandboxd_proxy = sandboxd_proxy
        self._existence_window = existence_window_seconds(existence_window)
        if not all(
            isinstance(name, str) and RESOURCE_NAME.match(name) for name in (namespace, template)
        ):
            raise ValueError("the namespace and warm pool must be Kubernetes resource names")
        if router_auth not in ROUTER_AUTH_MODES:
            raise ValueError('router_auth must be "bearer" or "scoped-token"')
        self._claim_options = ClaimOptions(
            env, pod_labels, pod_annotations, volume_claim_templates, ttl_seconds_after_finished
        )
        self.redactor = Redactor()
        self._telemetry = Telemetry.load(PROVIDER, self.redactor)
        credentials = Credential(
            credential, credential_rejected, self.redactor, name=_CREDENTIAL_NAME
        )
        router_credentials = (
            credentials
            if router_credential is None
            else Credential(router_credential, None, self.redactor, name=_ROUTER_CREDENTIAL_NAME)
        )
        endpoint = check_endpoint(endpoint)
        self._transport: HttpClient = client or Transport(
            redactor=self.redactor, component="sandbox", session=session
        )
        self._router_transport: HttpClient = (
            Transport(redactor=self.redactor, component="sandbox", session=router_session)
            if client is None and router_session is not None
            else self._transport
        )
        self._lifetime = lifetime_seconds_or_default(lifetime_seconds)
        self._clock = ClaimClock.for_lifetime(self._lifetime, now=now, monotonic=monotonic)
        self._workdir = workdir
        http = ClusterHttp(self._transport, credentials, self.redactor)
        self._tunnel = _tunnel(router, http, endpoint, credentials, session)
        self._pod_tunnels = (http, endpoint, credentials, session)
        self._router_credentials = router_credentials
        router = self._tunnel.url if self._tunnel is not None else check_endpoint(str(router))
        self._claims = ClaimsApi(
            http,
            endpoint=endpoint,
            namespace=namespace,
            template=template,
            poll_interval=poll_interval,
            ready_timeout=ready_timeout,
            monotonic=monotonic,
            sight=ExistenceWindow.of(self._existence_window, self._clock).now,
            foreground_deletion=foreground_deletion,
        )
        router_http = ClusterHttp(
            self._router_transport, router_credentials, self.redactor, on_401=ROUTER_TOKEN_ACTION
        )
        self._router = Router(
            router_http,
            router,
            namespace=namespace,
            port=port,
            scoped=router_auth == "scoped-token",
        )
        self._preflight = Preflight(
            http,
            router_http,
            endpoint=endpoint,
            router_url=router,
            namespace=namespace,
            template=template,
            tunnel=self._tunnel,
        )
        self._http, self._router_url = router_http, router
        self._namespace = namespace
        self.execution = execution
        self._jobs = DetachedJobs(self._router, http.errors) if execution == "detached" else None
        self._open = OpenInstances()

    @classmethod
    def from_kubeconfig(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        context: str | None = None,
        router: str | PortForward,
        template: str,
        **options: Any,
    ) -> KubernetesAgentSandboxBackend:
        """A backend for the API server, CA and user of a kubeconfig context.

        ``path``, else ``$KUBECONFIG``, else ``~/.kube/config``; the current context
        unless ``context``; its namespace unless ``namespace=`` is given. The user's
        client certificate and key, token, token file or exec plugin (re-run when its
        credential expires, or on a 401) authenticate to the API server only: the
        router gets ``router_credential`` (nothing without it) through ``session``, or
        a plain session. Needs ``pip install 'piship-remote[kubernetes]'``.

        Raises:
            ConfigUnavailable: no kubeconfig, or no such context.
            ConfigInvalid: the kubeconfig or an option is wrong; the message names it.
            TlsPolicyViolation: the API server's address breaks the transport rules.
        """
        return cls._for_cluster(from_kubeconfig(path, context), router, template, options)

    @classmethod
    def in_cluster(
        cls,
        *,
        router: str | PortForward,
        template: str,
        service_account: str = SERVICE_ACCOUNT,
        **options: Any,
    ) -> KubernetesAgentSandboxBackend:
        """A backend for the cluster this process runs in, as its pod's service account:
        the API server from ``KUBERNETES_SERVICE_HOST``/``_PORT``, the mounted CA, the
        token (re-read as the kubelet rotates it) and the pod's namespace.
        ``service_account`` is the directory they are mounted in. Otherwise as
        :meth:`from_kubeconfig`.

        Raises:
            ConfigUnavailable: this process does not run in a pod with a service account.
            ConfigInvalid: an option or the endpoint is wrong; the message names it.
        """
        return cls._for_cluster(in_cluster(service_account), router, template, options)

    @classmethod
    def _for_cluster(
        cls,
        access: ClusterAccess,
        router: str | PortForward,
        template: str,
        options: dict[str, Any],
    ) -> KubernetesAgentSandboxBackend:
        return cls(router=router, template=template, **cluster_options(access, options))

    def __enter__(self) -> KubernetesAgentSandboxBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def capabilities(self) -> Capabilities:
        """Remote isolation and the environment filter; network ``allow`` only.

        A claim selects a preconfigured warm pool whose NetworkPolicy this backend
        cannot prove, so it never offers network deny. In detached mode it says so
        (``execution``), and the containment report repeats it.
        """
        return Capabilities(
            isolation="remote",
            planes=("host-filesystem-isolation", "environment-filter"),
            network=("allow",),
            local_processes=False,
            workspace_mode="snapshot",
            execution="detached" if self.execution == "detached" else None,
        )

    def available(self) -> Availability:
        """One ``GET …/sandboxclaims?limit=1``; never raises for an unreachable API."""
        try:
            response = self._claims.list()
        except PiShipError as error:
            code = GATEWAY_UNREACHABLE if error.code == GATEWAY_UNREACHABLE else None
            return Availability(
                False, f"the Kubernetes API is unreachable: {str(error)[:DETAIL_LIMIT]}", code
            )
        response.close()
        if is_success(response.status):
            return Availability(True)
        return Availability(False, f"listing SandboxClaims returned HTTP {response.status}")

    def preflight(self) -> list[Check]:
        """What the credentials may do, before any claim exists: one access review per
        verb on claims, the warm pool's existence and readiness, the router's answer."""
        return self._preflight.run()

    def prepare(
        self, profile: SandboxProfile, *, labels: Mapping[str, str] | None = None
    ) -> KubernetesInstance:
        """Claim a sandbox and wait until it is ready (``PiShipError`` when it cannot).

        The profile needs nothing from this backend: the pool's pod is the
        sandbox, and the activation layer filters the environment. ``labels`` go on
        every claim this sandbox makes, beside the library's own.
        """
        if self._open.closed.is_set():
            raise self._closed_error()
        return self._instance(None, profile, check_labels(labels))

    def attach(self, claim_name: str) -> KubernetesInstance:
        """An instance for the existing claim ``claim_name``, which must carry this library's
        label (``agents.x-k8s.io/created-by: piship``) and still be within its lifetime.

        Raises:
            ConfigInvalid: the claim was not created by this library, or its name is not a claim's.
            SandboxUnavailable: the cluster no longer has the claim.
        """
        return self._instance(claim_name)

    def list_owned(self) -> list[OwnedSandbox]:
        """The claims in the namespace labelled as created by this library."""
        return self._claims.list_owned()

    def delete_owned(self, claim_name: str) -> None:
        """Delete one claim this library created (best effort)."""
        self._claims.delete_owned(claim_name)

    def _instance(
        self,
        adopt: str | None,
        profile: SandboxProfile | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> KubernetesInstance:
        if self._open.closed.is_set():
            raise self._closed_error()
        options = self._claim_options.screened(profile, self.redactor)
        claims = KeptClaims(self._claims.with_options(options), adopt=adopt, labels=labels)
        manager = ClaimManager(
            claims,
            self._clock,
            keepalive_every=keepalive_interval(self._lifetime),
            existence_window=self._existence_window,
            telemetry=self._telemetry,
        )
        if self.runtime == "sandboxd":
            require_sandboxd()
        if self._tunnel is not None:
            self._tunnel.hold(manager)  # the router is reached through it while this lives
        try:
            manager.prepare()
        except BaseException:
            if self._tunnel is not None:
                self._tunnel.release(manager)
            raise
        try:
            sandboxd = self._runs_sandboxd(manager)
        except BaseException:
            if self._tunnel is not None:
                self._tunnel.release(manager)
            manager.dispose()  # the claim it made is deleted
            raise
        instance: KubernetesInstance
        if sandboxd:
            instance = self._sandboxd_instance(manager, claims)
        else:
            instance = KubernetesInstance(
                self._router,
                manager,
                self._workdir,
                lambda disposed: self._disposed(disposed, manager),
                self._runtime_files,
                self._jobs,
                claims,
            )
        if self._open.admit(instance):
            return instance
        instance.dispose()
        raise self._closed_error()

    def _runs_sandboxd(self, manager: ClaimManager) -> bool:
        """Whether the prepared claim runs sandboxd (as told, or as its template says);
        ``CONFIG_INVALID`` naming the extra when it does and the extra is missing."""
        if self.runtime != "auto":
            return self.runtime == "sandboxd"
        claim = manager.current_claim()
        announced = claim is not None and claim.sandboxd_grpc is not None
        if announced:
            require_sandboxd()
        return announced

    def _sandboxd_instance(self, manager: ClaimManager, claims: KeptClaims) -> KubernetesInstance:
        from piship_remote.backends.kubernetes._sandboxd_instance import SandboxdInstance

        http, endpoint, credentials, session = self._pod_tunnels
        errors = SandboxErrors(self.redactor)
        proxy = self._sandboxd_proxy

        def open_tunnel(pod: str, port: int) -> RouterTunnel:
            forward = PortForward(service=pod, namespace=self._namespace, port=port)
            return RouterTunnel(
                forward,
                http,
                endpoint,
                credentials,
                _tls_of(session),
                pod=pod,
                names="piship-sandboxd-tunnel",
            )

        def open_link(claim: Claim) -> SandboxdLink:
            if proxy is None:
                return PodLink(claim, open_tunnel, self._transport, errors)
            return ProxyLink(
                claim,
                proxy,
                self._router,
                self._router_url,
                self._http,
                self._router_credentials,
                errors,
            )

        return SandboxdInstance(
            self._router,
            manager,
            self._workdir,
            lambda disposed: self._disposed(disposed, manager),
            SandboxdLinks(open_link, errors),
            errors,
            claims,
        )

    def _disposed(self, instance: KubernetesInstance, manager: ClaimManager) -> None:
        self._open.forget(instance)
        if self._tunnel is not None:
            self._tunnel.release(manager)

    def close(self) -> None:
        """Dispose every claim this backend still holds and release its connections.

        Idempotent; ``prepare`` raises afterwards. ``with backend:`` calls it on exit.
        """
        self._open.close()
        if self._tunnel is not None:
            self._tunnel.close()
        self._transport.close()
        if self._router_transport is not self._transport:
            self._router_transport.close()

    def _runtime_files(self, instance: KubernetesInstance) -> RuntimeFiles:
        return RuntimeFiles(
            self._http,
            self._router,
            self._router_url,
            workdir=self._workdir,
            claimed=instance.claimed,
        )

    def _closed_error(self) -> PiShipError:
        return SandboxErrors(self.redactor)(f"the {PROVIDER} backend was closed; create a new one")


def _tunnel(
    router: str | PortForward,
    api: ClusterHttp,
    endpoint: str,
    credential: Credential,
    session: requests.Session | None,
) -> RouterTunnel | None:
    """The port-forward ``router`` asks for (``"port-forward"``: the defaults), or None."""
    if router == PORT_FORWARD:
        router = PortForward()
    if not isinstance(router, PortForward):
        return None
    return RouterTunnel(router, api, endpoint, credential, _tls_of(session))


def _tls_of(session: requests.Session | None) -> TlsSettings:
    """The API server's CA and client certificate as ``session`` has them, read when asked."""

    def tls() -> tuple[bool | str, tuple[str, str] | None]:
        verify = session.verify if session is not None else True
        cert = session.cert if session is not None else None
        pair = (str(cert[0]), str(cert[1])) if isinstance(cert, tuple) and len(cert) == 2 else None
        return verify if isinstance(verify, str) else True, pair

    return tls
