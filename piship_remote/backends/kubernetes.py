"""The ``kubernetes-agent-sandbox`` backend: SandboxClaims and the sandbox router.

``prepare()`` claims a sandbox from a warm pool (a ``SandboxClaim`` with a bounded
``lifecycle.shutdownTime`` and ``shutdownPolicy: Delete``) and waits until it is
ready; each command is one ``POST {router}/execute``. The claim is renewed while it
is in use, replaced when it expired or got lost, and deleted at the end
(:mod:`piship_remote.backends.claims`)::

    backend = KubernetesAgentSandboxBackend(
        endpoint="https://k8s.example.com", router="https://router.example.com",
        template="python-pool", namespace="agents", credential=lambda: token())
    sandbox = activate_sandbox({"required": True, "network": {"mode": "allow"}},
                               backend=backend, workspace=".")

The router runs commands without a shell and returns their whole output at once,
so :func:`runtime_command` wraps each one in ``env … /bin/sh -c``. A command whose
outcome the router cannot tell (dropped connection, 502, 504) is never re-sent:
its claim is retired and deleted, and the error says to check its effects first.
"""

from __future__ import annotations

import ipaddress
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import requests

from piship_remote.backends.base import (
    Availability,
    BackendResult,
    ExecRequest,
    OutputCallback,
)
from piship_remote.backends.claims import (
    Claim,
    ClaimGone,
    ClaimManager,
    disposed_error,
)
from piship_remote.backends.lifetime import (
    Anchor,
    ClaimClock,
    keepalive_interval,
    rfc3339,
)
from piship_remote.backends.lifetime import lifetime_seconds as lifetime_seconds_or_default
from piship_remote.cancel import CancelToken, EventWatcher, bridge
from piship_remote.errors import CONFIG_INVALID, SANDBOX_UNAVAILABLE, CommandCancelled, PiShipError
from piship_remote.policy import SandboxProfile
from piship_remote.redact import Redactor
from piship_remote.report import Capabilities
from piship_remote.transport import (
    Credential,
    HttpResponse,
    Transport,
    TransportError,
    window_text,
)

__all__ = ["PROVIDER", "KubernetesAgentSandboxBackend", "KubernetesInstance", "runtime_command"]

PROVIDER = "kubernetes-agent-sandbox"
API_VERSION = "extensions.agents.x-k8s.io/v1beta1"
_RESOURCE_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_API_TIMEOUT = 30.0
_AVAILABLE_TIMEOUT = 10.0
_ROUTER_LIMIT = 16 * 1024 * 1024
_FAILURE_WINDOW = 4096
_FAILURE_CHARS = 300
_CREATE_ATTEMPTS = 3  # names taken (HTTP 409) before creation gives up
# Ready=False reasons after which a claim never becomes ready (the official SDK's list).
_TERMINAL_REASONS = frozenset(
    {
        "InvalidMetadata",
        "EnvVarsInjectionRejected",
        "VolumeClaimTemplatesError",
        "ClaimExpired",
        "SandboxExpired",
        "InvalidConfiguration",
        "PodFailed",
        "PodSucceeded",
    }
)
# The runtime reports every failure to start (and its own timeout) as exit 1 with this.
_START_FAILURE = "Failed to execute command:"
_OUTCOME_UNKNOWN = (
    "The command's outcome is unknown: {reason} before its result arrived. It may have run "
    "in part or in full, or still be running; PiShip retired its sandbox, which is deleted "
    "once no other command runs in it, and runs the next command in a new one. Check the "
    "command's effects before running it again"
)


def runtime_command(request: ExecRequest, workdir: str | None) -> str:
    """The router command for ``request``: ``env 'K=V' … /bin/sh -c '<cd && command>'``.

    The runtime splits the string like a POSIX shell but runs no shell, hence the
    explicit ``/bin/sh -c``. Environment names that are not shell names are dropped.

    >>> print(runtime_command(ExecRequest("ls", "/ws", "a/b", {"A": "x y"}), "/workspace"))
    env 'A=x y' /bin/sh -c 'cd -- '"'"'/workspace/a/b'"'"' && ls'
    """
    directory = _remote_directory(request.workspace_path, workdir)
    script = (
        request.command if directory is None else f"cd -- {_quote(directory)} && {request.command}"
    )
    assignments = [
        _quote(f"{name}={value}")
        for name, value in request.env.items()
        if _ENV_NAME.fullmatch(name)
    ]
    return " ".join(["env", *assignments, "/bin/sh", "-c", _quote(script)])


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def _remote_directory(workspace_path: str, workdir: str | None) -> str | None:
    """Where the command runs: under ``workdir``, or relative to the runtime's own directory."""
    relative = workspace_path not in ("", ".")
    if relative and (workspace_path.startswith("/") or ".." in workspace_path.split("/")):
        raise PiShipError(
            CONFIG_INVALID, "the working directory is outside the workspace", component="sandbox"
        )
    if workdir is None:
        return workspace_path if relative else None
    if not relative:
        return workdir
    base = "" if workdir == "/" else workdir.rstrip("/")
    return f"{base}/{workspace_path}"


class _Retire(Exception):
    """A router outcome after which the claim must not run another command."""

    def __init__(self, error: PiShipError, *, gone: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.gone = gone


@attrs.frozen
class _Answer:
    stdout: str
    stderr: str
    exit_code: int | None


class _Cluster:
    """The HTTP calls: the claims API (a :class:`~piship_remote.backends.claims.ClaimApi`)
    and the router."""

    def __init__(
        self,
        transport: Transport,
        credential: Credential,
        *,
        endpoint: str,
        router: str,
        namespace: str,
        template: str,
        port: int,
        poll_interval: float,
        ready_timeout: float,
        monotonic: Callable[[], float],
    ) -> None:
        self._transport = transport
        self._credential = credential
        self.claims = f"{endpoint}/apis/{API_VERSION}/namespaces/{namespace}/sandboxclaims"
        self._execute_url = f"{router}/execute"
        self._namespace = namespace
        self._template = template
        self._port = port
        self._poll = poll_interval
        self._ready_timeout = ready_timeout
        self._monotonic = monotonic

    # -- the claims API ------------------------------------------------------------

    def list(self) -> HttpResponse:
        return self._call("GET", f"{self.claims}?limit=1", timeout=_AVAILABLE_TIMEOUT)

    def create(self, anchor: Anchor, cancel: CancelToken) -> Claim:
        """POST a claim (a fresh name after a 409) and wait until it is ready."""
        for _ in range(_CREATE_ATTEMPTS):
            name = f"piship-{secrets.token_hex(6)}"
            response = self._post_claim(name, anchor, cancel)
            if response.status == 409:
                response.close()
                continue
            if not _ok(response):
                raise self._unavailable(
                    f"creating the SandboxClaim failed: {self._failure(response)}",
                    retryable=_transient(response.status),
                )
            response.close()
            try:
                sandbox, pod_ip = self._wait_ready(name, cancel)
            except BaseException:
                self._delete_name(name)
                raise
            return Claim(name, sandbox, anchor, pod_ip)
        raise self._unavailable(
            "creating the SandboxClaim failed: HTTP 409: the generated names were taken",
            retryable=True,
        )

    def renew(self, claim: Claim, shutdown: int, cancel: CancelToken) -> None:
        """Merge-patch the claim's shutdownTime forward."""
        body = {"spec": {"lifecycle": {"shutdownTime": rfc3339(shutdown)}}}
        with self._api(
            "renewing the SandboxClaim",
            "PATCH",
            self._claim_url(claim.name),
            cancel,
            json=body,
            headers={"Content-Type": "application/merge-patch+json"},
        ) as response:
            if response.status == 404:
                raise ClaimGone("the SandboxClaim no longer exists")
            if not _ok(response):
                raise self._unavailable(
                    f"renewing the SandboxClaim failed: {self._failure(response)}",
                    retryable=_transient(response.status),
                )
            _raise_if_finished(_lenient_json(response))

    def check(self, claim: Claim, cancel: CancelToken) -> None:
        """The claim still exists and has not failed or expired on the cluster."""
        with self._api(
            "checking the SandboxClaim", "GET", self._claim_url(claim.name), cancel
        ) as response:
            if response.status == 404:
                raise ClaimGone("the SandboxClaim no longer exists")
            if not _ok(response):
                raise self._unavailable(
                    f"checking the SandboxClaim failed: {self._failure(response)}",
                    retryable=_transient(response.status),
                )
            _raise_if_finished(_lenient_json(response))

    def delete(self, claim: Claim) -> None:
        self._delete_name(claim.name)

    def _post_claim(self, name: str, anchor: Anchor, cancel: CancelToken) -> HttpResponse:
        manifest = {
            "apiVersion": API_VERSION,
            "kind": "SandboxClaim",
            "metadata": {"name": name, "labels": {"agents.x-k8s.io/created-by": "piship"}},
            "spec": {
                "warmPoolRef": {"name": self._template},
                "lifecycle": {"shutdownTime": rfc3339(anchor.expires), "shutdownPolicy": "Delete"},
            },
        }
        try:
            return self._call("POST", self.claims, cancel=cancel, json=manifest)
        except TransportError as error:
            if error.request_sent:
                self._delete_name(name)  # it may have been created
            raise self._unavailable(
                f"creating the SandboxClaim failed: {error}", retryable=True
            ) from None
        except BaseException:
            self._delete_name(name)
            raise

    def _wait_ready(self, name: str, cancel: CancelToken) -> tuple[str, str | None]:
        """Poll the claim until Ready; the deadline is on the monotonic clock only."""
        deadline = self._monotonic() + self._ready_timeout
        last = ""
        while True:
            with self._api(
                "reading the SandboxClaim", "GET", self._claim_url(name), cancel
            ) as response:
                if not _ok(response):
                    raise self._unavailable(
                        f"reading the SandboxClaim failed: {self._failure(response)}",
                        retryable=_transient(response.status),
                    )
                try:
                    claim = response.json_object()
                except ValueError as error:
                    raise self._unavailable(f"reading the SandboxClaim failed: {error}") from None
            ready = _ready_condition(claim)
            if ready.get("status") == "True":
                return _sandbox_name(claim, name), _pod_ip(claim)
            reason = ready.get("reason")
            if isinstance(reason, str) and reason in _TERMINAL_REASONS:
                raise self._unavailable(f"the SandboxClaim failed: {reason}")
            last = _condition_text(ready) or last
            if self._monotonic() >= deadline:
                suffix = f" (last reported: {last})" if last else ""
                raise self._unavailable(f"the SandboxClaim did not become ready in time{suffix}")
            if cancel.wait(self._poll):
                raise CommandCancelled()

    def _delete_name(self, name: str) -> None:
        """Best effort: a failure leaves the claim to its shutdownTime."""
        try:
            self._call("DELETE", self._claim_url(name)).close()
        except Exception:
            pass

    # -- the router ----------------------------------------------------------------------

    def execute(self, claim: Claim, command: str, cancel: CancelToken) -> _Answer:
        """Run ``command`` once. Raises :class:`_Retire` when the claim must not be reused."""
        headers = {
            "X-Sandbox-ID": claim.sandbox,
            "X-Sandbox-Namespace": self._namespace,
            "X-Sandbox-Port": str(self._port),
        }
        if claim.pod_ip is not None:
            headers["X-Sandbox-Pod-IP"] = claim.pod_ip
        try:
            response = self._call(
                "POST",
                self._execute_url,
                cancel=cancel,
                headers=headers,
                json={"command": command},
                timeout=None,
                stream=True,
            )
        except TransportError as error:
            if not error.request_sent:
                raise self._unavailable(
                    f"the sandbox router is unreachable, so the command was not sent: {error}",
                    retryable=True,
                ) from None
            raise self._unknown(f"the connection to the sandbox router failed ({error})") from None
        with response:
            if response.status == 404:
                raise _Retire(
                    self._unavailable("the sandbox router no longer knows this sandbox"), gone=True
                )
            if response.status >= 500:
                raise self._unknown(f"the sandbox router answered {self._failure(response)}")
            if not _ok(response):
                raise self._unavailable(f"running the command failed: {self._failure(response)}")
            try:
                answer = response.json_object(_ROUTER_LIMIT)
            except TransportError as error:
                raise self._unknown(
                    f"the connection to the sandbox router failed ({error})"
                ) from None
            except ValueError as error:
                raise self._unavailable(
                    f"the sandbox router's answer could not be read ({error}); "
                    "the command ran, but its result is unknown"
                ) from None
        return self._answer(answer)

    def _answer(self, answer: Mapping[str, Any]) -> _Answer:
        stdout, stderr = answer.get("stdout"), answer.get("stderr")
        result = _Answer(
            stdout if isinstance(stdout, str) else "",
            stderr if isinstance(stderr, str) else "",
            _exit_code(answer.get("exit_code")),
        )
        if result.exit_code == 1 and result.stderr.startswith(_START_FAILURE):
            detail = " ".join(result.stderr.split())[:_FAILURE_CHARS]
            raise self._unavailable(f"the sandbox runtime could not run the command: {detail}")
        return result

    # -- plumbing --------------------------------------------------------------------------

    def _claim_url(self, name: str) -> str:
        return f"{self.claims}/{name}"

    def _call(self, method: str, url: str, **kwargs: Any) -> HttpResponse:
        kwargs.setdefault("timeout", _API_TIMEOUT)
        return self._transport.credentialed(
            method,
            url,
            credential=self._credential,
            auth_header=_bearer,
            repeatable=method != "POST",
            **kwargs,
        )

    def _api(
        self, action: str, method: str, url: str, cancel: CancelToken, **kwargs: Any
    ) -> HttpResponse:
        """An API call whose transport failure reads ``<action> failed: …``."""
        try:
            return self._call(method, url, cancel=cancel, **kwargs)
        except TransportError as error:
            raise self._unavailable(f"{action} failed: {error}", retryable=True) from None

    def _failure(self, response: HttpResponse) -> str:
        """``HTTP <status>: <detail>``; a Kubernetes Status body gives its reason and message."""
        body = window_text(_head(response, _FAILURE_WINDOW), _FAILURE_WINDOW)
        detail = _status_detail(body) or body
        detail = self._transport.redactor.redact(" ".join(detail.split()))[:_FAILURE_CHARS].strip()
        return f"HTTP {response.status}: {detail}" if detail else f"HTTP {response.status}"

    def _unknown(self, reason: str) -> _Retire:
        """The command may have run: never retryable, and its claim is retired."""
        return _Retire(self._unavailable(_OUTCOME_UNKNOWN.format(reason=reason)), gone=False)

    def _unavailable(self, message: str, *, retryable: bool = False) -> PiShipError:
        return PiShipError(
            SANDBOX_UNAVAILABLE,
            message,
            retryable=retryable,
            component="sandbox",
            redactor=self._transport.redactor,
        )


def _bearer(token: str) -> Mapping[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _ok(response: HttpResponse) -> bool:
    return 200 <= response.status < 300


def _transient(status: int) -> bool:
    return status == 429 or status >= 500


def _head(response: HttpResponse, limit: int) -> bytes:
    """Up to ``limit`` bytes of the body; a failed read keeps what arrived."""
    body = bytearray()
    try:
        for chunk in response.iter_raw():
            body += chunk
            if len(body) >= limit:
                break
    except (TransportError, CommandCancelled):
        pass
    finally:
        response.close()
    return bytes(body[:limit])


def _status_detail(body: str) -> str | None:
    """The message of a Kubernetes ``Status`` (``<reason>: <message>``) or a router ``detail``."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    message = value.get("message")
    if value.get("kind") == "Status" and isinstance(message, str):
        reason = value.get("reason")
        return f"{reason}: {message}" if isinstance(reason, str) and reason else message
    detail = value.get("detail")
    if isinstance(detail, str):
        return detail
    return message if isinstance(message, str) else None


def _lenient_json(response: HttpResponse) -> dict[str, Any]:
    """The body as an object, or ``{}`` when it is not one (the claim only has to exist)."""
    try:
        return response.json_object()
    except (ValueError, TransportError):
        return {}


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _ready_condition(claim: Mapping[str, Any]) -> dict[str, Any]:
    conditions = _mapping(claim.get("status")).get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        if isinstance(condition, dict) and condition.get("type") == "Ready":
            return condition
    return {}


def _condition_text(condition: Mapping[str, Any]) -> str:
    parts = [condition.get("reason"), condition.get("message")]
    return ": ".join(p for p in parts if isinstance(p, str) and p)[:_FAILURE_CHARS]


def _raise_if_finished(claim: Mapping[str, Any]) -> None:
    """A claim being deleted, or Ready=False for good (e.g. ``ClaimExpired``), is gone."""
    if _mapping(claim.get("metadata")).get("deletionTimestamp"):
        raise ClaimGone("the SandboxClaim is being deleted")
    ready = _ready_condition(claim)
    reason = ready.get("reason")
    if ready.get("status") == "False" and isinstance(reason, str) and reason in _TERMINAL_REASONS:
        raise ClaimGone(f"the SandboxClaim failed: {reason}")


def _sandbox_name(claim: Mapping[str, Any], fallback: str) -> str:
    """``status.sandbox.name`` (a warm-pool sandbox keeps the pool's name), else the claim's."""
    sandbox = _mapping(_mapping(claim.get("status")).get("sandbox"))
    annotations = _mapping(_mapping(claim.get("metadata")).get("annotations"))
    for value in (
        sandbox.get("name"),
        sandbox.get("Name"),
        annotations.get("agents.x-k8s.io/sandbox-name"),
    ):
        if isinstance(value, str) and _RESOURCE_NAME.match(value):
            return value
    return fallback


def _pod_ip(claim: Mapping[str, Any]) -> str | None:
    """The sandbox pod's address for ``X-Sandbox-Pod-IP`` (IPv4 preferred), if reported."""
    ips = _mapping(_mapping(claim.get("status")).get("sandbox")).get("podIPs")
    addresses: list[ipaddress.IPv4Address | ipaddress.IPv6Address] = []
    for item in ips if isinstance(ips, list) else ():
        text = item.get("ip") if isinstance(item, dict) else item
        if not isinstance(text, str):
            continue
        try:
            address = ipaddress.ip_address(text.strip())
        except ValueError:
            continue
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        addresses.append(address)
    addresses.sort(key=lambda address: address.version)
    return str(addresses[0]) if addresses else None


def _exit_code(value: Any) -> int | None:
    """An integer exit code; anything else (missing, text, fraction) is unknown."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


class KubernetesInstance:
    """A prepared Kubernetes sandbox: commands share and renew one claim at a time."""

    def __init__(self, cluster: _Cluster, manager: ClaimManager, workdir: str | None) -> None:
        self._cluster = cluster
        self._manager = manager
        self._workdir = workdir
        self._watcher = EventWatcher()

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> BackendResult:
        """Run one command through the router; stdout then stderr arrive once, at the end.

        Raises ``CommandCancelled`` when ``cancel`` is set (the claim is retired:
        the runtime cannot stop a running command) and ``PiShipError`` otherwise.
        """
        command = runtime_command(request, self._workdir)
        with bridge(cancel, self._watcher) as user:
            if user.is_set():
                raise CommandCancelled()
            if self._manager.disposed:
                raise disposed_error()
            with self._manager.command(user) as use:
                try:
                    answer = self._cluster.execute(use.claim, command, use.cancel)
                except CommandCancelled:
                    use.retire()
                    if not user.is_set() and self._manager.disposed:
                        raise disposed_error() from None
                    raise
                except _Retire as outcome:
                    use.retire(gone=outcome.gone)
                    raise outcome.error from None
        if answer.stdout and on_stdout is not None:
            on_stdout(answer.stdout.encode())
        if answer.stderr and on_stderr is not None:
            on_stderr(answer.stderr.encode())
        return BackendResult(exit_code=answer.exit_code)

    def epoch(self) -> str | None:
        """The claim name the latest command ran in (``None`` before the first)."""
        return self._manager.epoch()

    def dispose(self) -> None:
        """Delete the claim and create none later; commands in flight end at once."""
        self._manager.dispose()
        self._watcher.close()


class KubernetesAgentSandboxBackend:
    """Runs commands in sandboxes claimed from a kubernetes-sigs/agent-sandbox warm pool.

    All durations are seconds; ``now`` and ``monotonic`` are the wall and monotonic
    clocks (injectable for tests). ``credential()`` is read for every request and sent
    as a bearer to the API and the router; ``credential_rejected()`` is called on a
    401 and returns ``True`` when a renewed credential is ready.
    """

    id = PROVIDER
    provider = PROVIDER

    def __init__(
        self,
        *,
        endpoint: str,
        router: str,
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
    ) -> None:
        if not all(
            isinstance(name, str) and _RESOURCE_NAME.match(name) for name in (namespace, template)
        ):
            raise ValueError("the namespace and warm pool must be Kubernetes resource names")
        self.redactor = Redactor()
        self._transport = Transport(redactor=self.redactor, component="sandbox", session=session)
        try:
            endpoint, router = self._transport.endpoint(endpoint), self._transport.endpoint(router)
        except BaseException:
            self._transport.close()
            raise
        self._lifetime = lifetime_seconds_or_default(lifetime_seconds)
        self._clock = ClaimClock.for_lifetime(self._lifetime, now=now, monotonic=monotonic)
        self._workdir = workdir
        self._cluster = _Cluster(
            self._transport,
            Credential(credential, credential_rejected, self.redactor),
            endpoint=endpoint,
            router=router,
            namespace=namespace,
            template=template,
            port=port,
            poll_interval=poll_interval,
            ready_timeout=ready_timeout,
            monotonic=monotonic,
        )

    def capabilities(self) -> Capabilities:
        """Remote isolation and the environment filter; network ``allow`` only.

        A claim selects a preconfigured warm pool whose NetworkPolicy this backend
        cannot prove, so it never offers network deny.
        """
        return Capabilities(
            isolation="remote",
            planes=("host-filesystem-isolation", "environment-filter"),
            network=("allow",),
            local_processes=False,
            workspace_mode="snapshot",
        )

    def available(self) -> Availability:
        """One ``GET …/sandboxclaims?limit=1``; never raises for an unreachable API."""
        try:
            response = self._cluster.list()
        except PiShipError as error:
            return Availability(
                False, f"the Kubernetes API is unreachable: {str(error)[:_FAILURE_CHARS]}"
            )
        response.close()
        if _ok(response):
            return Availability(True)
        return Availability(False, f"listing SandboxClaims returned HTTP {response.status}")

    def prepare(self, profile: SandboxProfile) -> KubernetesInstance:
        """Claim a sandbox and wait until it is ready (``PiShipError`` when it cannot).

        The profile needs nothing from this backend: the pool's pod is the
        sandbox, and the activation layer filters the environment.
        """
        manager = ClaimManager(
            self._cluster, self._clock, keepalive_every=keepalive_interval(self._lifetime)
        )
        manager.prepare()
        return KubernetesInstance(self._cluster, manager, self._workdir)

    def close(self) -> None:
        """Close the HTTP connections (instances should be disposed first)."""
        self._transport.close()
