"""The control plane of the local service: E2B's sandbox REST API, the parts clients use.

=========================================  ======================================
``GET /health``                            204, no key needed
``POST /sandboxes`` (and ``/v2/sandboxes``)  201 with ``sandboxID``, ``envdAccessToken``…
``GET /sandboxes``                         200: the running sandboxes (``metadata`` filter)
``GET /v2/sandboxes``                      200: one page (``metadata``, ``state``, ``limit``…)
``GET /sandboxes/<id>``                    200 with the sandbox's details (``state``)
``POST /sandboxes/<id>/connect`` (+ v2)    200 with its ``envdAccessToken``; 201 if it resumed
``POST /sandboxes/<id>/pause``             204: its processes frozen; 409 if already paused
``POST /sandboxes/<id>/resume``            201: thawed, to live ``timeout`` (15) s; 409 running
``GET /sandboxes/<id>/metrics``            200: its samples (one taken now), ``?start=&end=``
``POST /sandboxes/<id>/timeout``           204: live ``timeout`` more seconds from now
``POST /sandboxes/<id>/refreshes``         204: live at least ``duration`` more seconds
``DELETE /sandboxes/<id>``                 204: kill its processes, remove its files
=========================================  ======================================

A paused sandbox keeps its files and its frozen processes; envd answers for it as
for a sandbox that is not there (502), its lifetime stops (it is kept up to the
service's maximum lifetime), and the timeout calls answer 404 for it, as E2B's
do. Resuming (``resume``, or ``connect`` with its ``timeout``, 300 s on v2 when
absent) gives it a new lifetime from then. ``memory: false`` on pause (E2B's
filesystem-only snapshot) is accepted and pauses it whole. A sandbox created with
``autoPause: true`` is paused, not killed, when its timeout is reached; with
``autoResume: {"enabled": true}`` envd traffic naming it resumes it (see
:class:`~piship_remote.local.sandbox.listing.Lifecycle`). Details carry its ``lifecycle``.

Every ``/sandboxes…`` request needs ``X-API-Key``. A create without ``timeout``
lives 300 s on ``/v2/sandboxes`` (the current SDKs send none) and 15 s on
``/sandboxes``, E2B's defaults. Create and connect answers carry ``domain``
(``localhost:<port>``), so ``get_host(port)`` names a loopback host the service routes
(see :mod:`~piship_remote.local.ports`); a sandbox created with
``network.allowPublicTraffic: false`` also gets a ``trafficAccessToken`` its ports want.
Errors are E2B's ``{"code": <status>, "message": …}``. A sandbox may reach the internet only when
created with ``"allow_internet_access": true`` (E2B's default is to allow)::

    control = ControlPlane(registry, api_key="e2b_…")
    reply = control.handle(request)
"""

from __future__ import annotations

import hmac
import json
import os
import re
import shutil
import time
from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit

from piship_remote._http_server.messages import Head, Reply, Request
from piship_remote.local.sandbox.listing import (
    Lifecycle,
    ListError,
    Page,
    PauseRequest,
    ResumeRequest,
    lifecycle,
    metadata_filter,
    rfc3339,
    state,
)
from piship_remote.local.sandbox.metrics import SandboxMetrics, time_range
from piship_remote.local.sandbox.registry import (
    Registry,
    Sandbox,
    SandboxGone,
    TooManySandboxes,
    UnknownTemplate,
)
from piship_remote.wire.e2b_control import (
    ApiError,
    ConnectRequest,
    ListedSandbox,
    NewSandbox,
    Refresh,
    SandboxDetail,
    SandboxInfo,
    TimeoutRequest,
)
from piship_remote.wire.e2b_json import WireError, parse, to_json, unstructure

__all__ = ["CLIENT_ID", "ENVD_VERSION", "ControlPlane"]

ENVD_VERSION = "0.6.4"
CLIENT_ID = "piship-local"
MAX_REFRESH = 3600
MIB = 1024 * 1024
V2_TIMEOUT = 300
V1_TIMEOUT = 15
_SANDBOX_PATH = re.compile(
    r"(?:/v2)?/sandboxes/([A-Za-z0-9-]{1,128})"
    r"(/timeout|/refreshes|/connect|/metrics|/pause|/resume)?\Z"
)
_ACTION_METHOD = {
    None: ("GET", "DELETE"),
    "/timeout": ("POST",),
    "/refreshes": ("POST",),
    "/connect": ("POST",),
    "/metrics": ("GET",),
    "/pause": ("POST",),
    "/resume": ("POST",),
}
_RUNNING_ONLY = ("/timeout", "/refreshes")


class ControlPlane:
    """Answers the REST requests for the sandboxes of a :class:`Registry`."""

    def __init__(self, registry: Registry, *, api_key: str, domain: str | None = None) -> None:
        self._registry = registry
        self._api_key = api_key
        self.domain = domain
        """What create and connect answers give as ``domain`` (the service's loopback host)."""
        self._metrics = SandboxMetrics()

    def screen(self, head: Head) -> Reply | None:
        """The refusal of a request its headers already rule out (no key), before its body."""
        return self._refusal(head.path, head.headers)

    def handle(self, request: Request) -> Reply:
        """Answer one control-plane request."""
        if request.path == "/health":
            return Reply(204)
        refusal = self._refusal(request.path, request.headers)
        if refusal is not None:
            return refusal
        try:
            return self._route(request)
        except (WireError, ListError) as e:
            return _error(400, str(e))

    def _route(self, request: Request) -> Reply:
        if request.path in ("/sandboxes", "/v2/sandboxes"):
            if request.method == "GET":
                return self._list(request)
            if request.method != "POST":
                return _error(405, f"{request.method} is not allowed on {request.path}")
            default = V2_TIMEOUT if request.path.startswith("/v2/") else V1_TIMEOUT
            return self._create(request.body, default)
        match = _SANDBOX_PATH.match(request.path)
        if match is None:
            return _error(404, "not found")
        sandbox_id, action = match.group(1), match.group(2)
        sandbox = self._registry.lookup(sandbox_id)
        if sandbox is None or (action in _RUNNING_ONLY and sandbox.pause_state.paused):
            return _error(404, f'sandbox "{sandbox_id}" not found')
        if request.method not in _ACTION_METHOD[action]:
            return _error(405, f"{request.method} is not allowed on {request.path}")
        if action == "/connect":
            return self._connect(sandbox, request.body)
        if action == "/pause":
            return self._pause(sandbox, request.body)
        if action == "/resume":
            return self._resume(sandbox, request.body)
        if action == "/metrics":
            start, end = time_range(request.target)
            samples = self._metrics.read(sandbox, start, end)
            return Reply(200, to_json(samples), "application/json")
        if action == "/timeout":
            seconds = parse(request.body, TimeoutRequest).timeout
            return self._lifetime(sandbox_id, seconds, extend_only=False)
        if action == "/refreshes":
            duration = min(max(parse(request.body, Refresh).duration, 0), MAX_REFRESH)
            return self._lifetime(sandbox_id, duration, extend_only=True)
        if request.method == "GET":
            detail = unstructure(_detail(sandbox, self._left(sandbox), self.domain))
            detail["lifecycle"] = lifecycle(sandbox)
            text = json.dumps(detail, separators=(",", ":"), ensure_ascii=False)
            return Reply(200, text.encode(), "application/json")
        self._registry.delete(sandbox_id)
        return Reply(204)

    def _left(self, sandbox: Sandbox) -> float:
        return max(sandbox.expires_at - self._registry.clock(), 0.0)

    def _list(self, request: Request) -> Reply:
        query = {k: v[0] for k, v in parse_qs(urlsplit(request.target).query).items()}
        sandboxes = [s for i in self._registry.ids() if (s := self._registry.lookup(i)) is not None]
        running = [s for s in sandboxes if not s.pause_state.paused]
        headers: tuple[tuple[str, str], ...] = ()
        if request.path == "/sandboxes":  # v1: running sandboxes, metadata filter, one page
            wanted = metadata_filter(query.get("metadata"))
            chosen = [s for s in running if all(s.metadata.get(k) == v for k, v in wanted.items())]
        else:
            page = Page.of(query)
            chosen, token = page.select(sandboxes)
            if "running" in page.states:
                headers = (("X-Total-Running", str(len(running))),)
            if token is not None:
                headers += (("X-Next-Token", token),)
        listed = [_listed(s, self._left(s)) for s in chosen]
        return Reply(200, to_json(listed), "application/json", headers)

    def _connect(self, sandbox: Sandbox, body: bytes) -> Reply:
        timeout = parse(body, ConnectRequest).timeout
        seconds = V2_TIMEOUT if timeout is None else timeout
        if seconds <= 0:
            return _error(400, "Timeout must be greater than 0")
        if self._registry.resume(sandbox.id, seconds):
            return Reply(201, to_json(self._info(sandbox)), "application/json")
        if not self._registry.set_lifetime(sandbox.id, seconds, extend_only=True):
            return _error(404, f'sandbox "{sandbox.id}" not found')
        # The sandbox's own envd token, as E2B answers: rotating it would cut off every
        # client already attached.
        return Reply(200, to_json(self._info(sandbox)), "application/json")

    def _pause(self, sandbox: Sandbox, body: bytes) -> Reply:
        parse(body, PauseRequest)
        try:
            paused = self._registry.pause(sandbox.id)
        except OSError as e:
            return _error(500, f"the sandbox could not be paused: {e}")
        if paused is None:
            return _error(404, f'sandbox "{sandbox.id}" not found')
        if not paused:
            return _error(409, f'sandbox "{sandbox.id}" is already paused')
        return Reply(204)

    def _resume(self, sandbox: Sandbox, body: bytes) -> Reply:
        seconds = parse(body, ResumeRequest).timeout
        if seconds <= 0:
            return _error(400, "Timeout must be greater than 0")
        try:
            resumed = self._registry.resume(sandbox.id, seconds)
        except OSError as e:
            return _error(500, f"the sandbox could not be resumed: {e}")
        if resumed is None:
            return _error(404, f'sandbox "{sandbox.id}" not found')
        if not resumed:
            return _error(409, f'sandbox "{sandbox.id}" is already running')
        return Reply(201, to_json(self._info(sandbox)), "application/json")

    def _info(self, sandbox: Sandbox) -> SandboxInfo:
        return SandboxInfo(
            sandbox_id=sandbox.id,
            template_id=sandbox.template,
            client_id=CLIENT_ID,
            envd_version=ENVD_VERSION,
            envd_access_token=sandbox.access_token,
            domain=self.domain,
            traffic_access_token=sandbox.traffic_access_token,
        )

    def _create(self, body: bytes, default_timeout: int) -> Reply:
        new = parse(body, NewSandbox)
        ending = Lifecycle.of(body)
        timeout = default_timeout if new.timeout is None else new.timeout
        if timeout < 0:
            return _error(400, "timeout must not be negative")
        try:
            sandbox = self._registry.create(
                template=new.template_id,
                lifetime=timeout,
                network=new.allow_internet_access is True,
                env_vars=new.env_vars,
                metadata=new.metadata,
                auto_pause=ending.auto_pause,
                auto_resume=ending.auto_resume,
                private_traffic=_private_traffic(body),
            )
        except UnknownTemplate:
            return _error(404, f"template '{new.template_id}' not found")
        except TooManySandboxes as e:
            return _error(429, str(e))
        except SandboxGone as e:
            return _error(503, str(e))
        return Reply(201, to_json(self._info(sandbox)), "application/json")

    def _lifetime(self, sandbox_id: str, seconds: int, *, extend_only: bool) -> Reply:
        if seconds < 0:
            return _error(400, "timeout must not be negative")
        if not self._registry.set_lifetime(sandbox_id, seconds, extend_only=extend_only):
            return _error(404, f'sandbox "{sandbox_id}" not found')
        return Reply(204)

    def _refusal(self, path: str, headers: Mapping[str, str]) -> Reply | None:
        if path == "/health":
            return None
        if not path.startswith(("/sandboxes", "/v2/sandboxes")):
            return _error(404, "not found")
        key = headers.get("x-api-key", "")
        if not hmac.compare_digest(key.encode(), self._api_key.encode()):
            return _error(401, "Invalid API key")
        return None


def _detail(sandbox: Sandbox, left: float, domain: str | None) -> SandboxDetail:
    size = _sizes(sandbox)
    return SandboxDetail(
        sandbox_id=sandbox.id,
        template_id=sandbox.template,
        client_id=CLIENT_ID,
        envd_version=ENVD_VERSION,
        envd_access_token=sandbox.access_token,
        started_at=rfc3339(sandbox.started_at),
        end_at=_end_at(sandbox, left),
        cpu_count=size[0],
        memory_mb=size[1],
        disk_size_mb=size[2],
        state=state(sandbox),
        metadata=sandbox.metadata,
        domain=domain,
    )


def _listed(sandbox: Sandbox, left: float) -> ListedSandbox:
    size = _sizes(sandbox)
    return ListedSandbox(
        sandbox_id=sandbox.id,
        template_id=sandbox.template,
        client_id=CLIENT_ID,
        started_at=rfc3339(sandbox.started_at),
        end_at=_end_at(sandbox, left),
        cpu_count=size[0],
        memory_mb=size[1],
        disk_size_mb=size[2],
        state=state(sandbox),
        envd_version=ENVD_VERSION,
        metadata=sandbox.metadata,
    )


def _end_at(sandbox: Sandbox, left: float) -> str:
    """When its lifetime ends; for a paused sandbox, when it was paused (its clock stopped)."""
    paused_at = sandbox.pause_state.paused_at
    return rfc3339(paused_at if paused_at is not None else time.time() + left)


def _sizes(sandbox: Sandbox) -> tuple[int, int, int]:
    """CPUs, memory MiB and disk MiB: the host's, which the sandbox shares."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB
    return os.cpu_count() or 1, memory, shutil.disk_usage(sandbox.home).total // MIB


def _private_traffic(body: bytes) -> bool:
    """Whether a create asked for its ports to need a traffic token (``allowPublicTraffic``)."""
    network = json.loads(body).get("network") if body.strip() else None
    return isinstance(network, dict) and network.get("allowPublicTraffic") is False


def _error(status: int, message: str) -> Reply:
    return Reply(status, to_json(ApiError(status, message)), "application/json")
