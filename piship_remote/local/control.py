"""The control plane of the local service: E2B's sandbox REST API, the parts clients use.

=========================================  ======================================
``GET /health``                            204, no key needed
``POST /sandboxes`` (and ``/v2/sandboxes``)  201 with ``sandboxID``, ``envdAccessToken``…
``GET /sandboxes/<id>``                    200 with the sandbox's details
``POST /sandboxes/<id>/timeout``           204: live ``timeout`` more seconds from now
``POST /sandboxes/<id>/refreshes``         204: live at least ``duration`` more seconds
``DELETE /sandboxes/<id>``                 204: kill its processes, remove its files
=========================================  ======================================

Every ``/sandboxes…`` request needs ``X-API-Key``. Errors are E2B's
``{"code": <status>, "message": …}``. A sandbox may reach the internet only when
created with ``"allow_internet_access": true`` (E2B's default is to allow)::

    control = ControlPlane(registry, api_key="e2b_…")
    reply = control.handle(request)
"""

from __future__ import annotations

import hmac
import os
import re
import shutil
import time
from collections.abc import Mapping
from datetime import datetime, timezone

from piship_remote.local.sandboxes import Registry, Sandbox, SandboxGone, TooManySandboxes
from piship_remote.local.server import Head, Reply, Request
from piship_remote.local.wire import (
    ApiError,
    NewSandbox,
    Refresh,
    SandboxDetail,
    SandboxInfo,
    TimeoutRequest,
    WireError,
    parse,
    to_json,
)

__all__ = ["CLIENT_ID", "ENVD_VERSION", "ControlPlane"]

ENVD_VERSION = "0.4.0"
CLIENT_ID = "piship-local"
MAX_REFRESH = 3600
MIB = 1024 * 1024
_SANDBOX_PATH = re.compile(r"/sandboxes/([A-Za-z0-9-]{1,128})(/timeout|/refreshes)?\Z")


class ControlPlane:
    """Answers the REST requests for the sandboxes of a :class:`Registry`."""

    def __init__(self, registry: Registry, *, api_key: str) -> None:
        self._registry = registry
        self._api_key = api_key

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
        except WireError as e:
            return _error(400, str(e))

    def _route(self, request: Request) -> Reply:
        if request.path in ("/sandboxes", "/v2/sandboxes"):
            if request.method != "POST":
                return _error(405, f"{request.method} is not allowed on {request.path}")
            return self._create(request.body)
        match = _SANDBOX_PATH.match(request.path)
        if match is None:
            return _error(404, "not found")
        sandbox_id, action = match.group(1), match.group(2)
        sandbox = self._registry.get(sandbox_id)
        if sandbox is None:
            return _error(404, f'sandbox "{sandbox_id}" not found')
        allowed = ("POST",) if action else ("GET", "DELETE")
        if request.method not in allowed:
            return _error(405, f"{request.method} is not allowed on {request.path}")
        if action == "/timeout":
            seconds = parse(request.body, TimeoutRequest).timeout
            return self._lifetime(sandbox_id, seconds, extend_only=False)
        if action == "/refreshes":
            duration = min(max(parse(request.body, Refresh).duration, 0), MAX_REFRESH)
            return self._lifetime(sandbox_id, duration, extend_only=True)
        if request.method == "GET":
            left = max(sandbox.expires_at - self._registry.clock(), 0.0)
            return Reply(200, to_json(_detail(sandbox, left)), "application/json")
        self._registry.delete(sandbox_id)
        return Reply(204)

    def _create(self, body: bytes) -> Reply:
        new = parse(body, NewSandbox)
        if new.timeout < 0:
            return _error(400, "timeout must not be negative")
        try:
            sandbox = self._registry.create(
                template=new.template_id,
                lifetime=new.timeout,
                network=new.allow_internet_access is True,
                env_vars=new.env_vars,
                metadata=new.metadata,
            )
        except TooManySandboxes as e:
            return _error(429, str(e))
        except SandboxGone as e:
            return _error(503, str(e))
        info = SandboxInfo(
            sandbox_id=sandbox.id,
            template_id=sandbox.template,
            client_id=CLIENT_ID,
            envd_version=ENVD_VERSION,
            envd_access_token=sandbox.access_token,
        )
        return Reply(201, to_json(info), "application/json")

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


def _detail(sandbox: Sandbox, left: float) -> SandboxDetail:
    return SandboxDetail(
        sandbox_id=sandbox.id,
        template_id=sandbox.template,
        client_id=CLIENT_ID,
        envd_version=ENVD_VERSION,
        envd_access_token=sandbox.access_token,
        started_at=_rfc3339(sandbox.started_at),
        end_at=_rfc3339(time.time() + left),
        # No limits are enforced: these are the host's, which the sandbox shares.
        cpu_count=os.cpu_count() or 1,
        memory_mb=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB,
        disk_size_mb=shutil.disk_usage(sandbox.home).total // MIB,
        state="running",
        metadata=sandbox.metadata,
    )


def _rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")


def _error(status: int, message: str) -> Reply:
    return Reply(status, to_json(ApiError(status, message)), "application/json")
