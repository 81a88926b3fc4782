"""The E2B control plane's JSON shapes: create, connect, timeouts, details, the list, metrics.

Each shape is an attrs class with Python field names; :data:`CONTROL_NAMES` gives
the JSON names that differ (``templateID``, ``envdAccessToken``, ...) and
:data:`CONTROL_ALWAYS_SENT` the fields written even at their default. The
converter of :mod:`piship_remote.wire.e2b_json` reads and writes them::

    >>> parse(b'{"templateID": "base", "timeout": 60}', NewSandbox).timeout
    60
    >>> to_json(ApiError(404, "not found"))
    b'{"code":404,"message":"not found"}'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = [
    "CONTROL_ALWAYS_SENT",
    "CONTROL_NAMES",
    "ApiError",
    "ConnectRequest",
    "ForkRequest",
    "ListedSandbox",
    "NetworkUpdate",
    "NewSandbox",
    "Refresh",
    "SandboxDetail",
    "SandboxInfo",
    "SandboxMetric",
    "SnapshotInfo",
    "SnapshotRequest",
    "TimeoutRequest",
]


@attrs.frozen
class NewSandbox:
    """``POST /sandboxes``: the fields the local service uses; others are ignored."""

    template_id: str
    timeout: int | None = None
    """Seconds; absent means 300 on ``/v2/sandboxes`` and 15 on ``/sandboxes``, as E2B does."""
    allow_internet_access: bool | None = None
    env_vars: dict[str, str] = attrs.field(factory=dict)
    metadata: dict[str, str] = attrs.field(factory=dict)
    auto_pause_memory: bool | None = None
    """``false``: the pause at the timeout keeps only the files (resuming reboots)."""


@attrs.frozen
class TimeoutRequest:
    """``POST /sandboxes/<id>/timeout``."""

    timeout: int


@attrs.frozen
class ConnectRequest:
    """``POST /sandboxes/<id>/connect``: the lifetime from now (absent: 300 s); ``memory:
    false`` (the SDKs' ``on_resume="reboot"``) resumes a paused sandbox by rebooting it."""

    timeout: int | None = None
    memory: bool | None = None


@attrs.frozen
class Refresh:
    """``POST /sandboxes/<id>/refreshes``."""

    duration: int = 0


@attrs.frozen
class SandboxInfo:
    """The ``201`` answer to a create; ``domain`` is always sent (``null``: E2B's default)."""

    sandbox_id: str
    template_id: str
    client_id: str
    envd_version: str
    envd_access_token: str
    domain: str | None = None
    traffic_access_token: str | None = None
    """Set when the sandbox was created with ``network.allowPublicTraffic: false``."""


@attrs.frozen
class SandboxDetail:
    """``GET /sandboxes/<id>``."""

    sandbox_id: str
    template_id: str
    client_id: str
    envd_version: str
    envd_access_token: str
    started_at: str
    end_at: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    state: str
    metadata: dict[str, str] = attrs.field(factory=dict)
    domain: str | None = None
    allow_internet_access: bool | None = None
    network: dict[str, Any] | None = None
    """As set at create or by the last network update (``allowOut``, ``denyOut``…)."""


@attrs.frozen
class ListedSandbox:
    """One entry of ``GET /sandboxes`` and ``GET /v2/sandboxes``."""

    sandbox_id: str
    template_id: str
    client_id: str
    started_at: str
    end_at: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    state: str
    envd_version: str
    metadata: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen
class SandboxMetric:
    """One sample of ``GET /sandboxes/<id>/metrics``."""

    timestamp: str
    timestamp_unix: int
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    mem_cache: int
    disk_used: int
    disk_total: int


@attrs.frozen
class ApiError:
    """The control plane's error body: an integer ``code`` (the HTTP status)."""

    code: int
    message: str


@attrs.frozen
class ForkRequest:
    """``POST /sandboxes/<id>/fork``: each fork's lifetime and how many (1 to 20)."""

    timeout: int | None = None
    count: int = 1


@attrs.frozen
class NetworkUpdate:
    """``PUT /sandboxes/<id>/network``: the egress rules that replace the sandbox's."""

    allow_out: list[str] = attrs.field(factory=list)
    deny_out: list[str] = attrs.field(factory=list)
    dns_servers: list[str] = attrs.field(factory=list)
    egress_proxy: dict[str, Any] | None = None
    rules: dict[str, Any] = attrs.field(factory=dict)
    allow_internet_access: bool | None = None

    @property
    def filters(self) -> bool:
        """Whether it asks for egress filtered by address or sent through a proxy."""
        return bool(self.allow_out or self.deny_out or self.dns_servers or self.rules) or (
            self.egress_proxy is not None
        )


@attrs.frozen
class SnapshotRequest:
    """``POST /sandboxes/<id>/snapshots``: an optional name; ``memory`` (false:
    filesystem-only) is accepted, and a snapshot keeps the files either way."""

    name: str | None = None
    memory: bool | None = None


@attrs.frozen
class SnapshotInfo:
    """A snapshot as created and listed: its ID (a template to create sandboxes from)
    and its names."""

    snapshot_id: str
    names: list[str] = attrs.field(factory=list)


CONTROL_NAMES: Mapping[type, Mapping[str, str]] = {
    SnapshotInfo: {"snapshot_id": "snapshotID"},
    NetworkUpdate: {
        "allow_out": "allowOut",
        "deny_out": "denyOut",
        "dns_servers": "dnsServers",
        "egress_proxy": "egressProxy",
    },
    NewSandbox: {
        "template_id": "templateID",
        "env_vars": "envVars",
        "auto_pause_memory": "autoPauseMemory",
    },
    SandboxInfo: {
        "sandbox_id": "sandboxID",
        "template_id": "templateID",
        "client_id": "clientID",
        "envd_version": "envdVersion",
        "envd_access_token": "envdAccessToken",
        "traffic_access_token": "trafficAccessToken",
    },
    SandboxDetail: {
        "sandbox_id": "sandboxID",
        "template_id": "templateID",
        "client_id": "clientID",
        "envd_version": "envdVersion",
        "envd_access_token": "envdAccessToken",
        "started_at": "startedAt",
        "end_at": "endAt",
        "cpu_count": "cpuCount",
        "memory_mb": "memoryMB",
        "disk_size_mb": "diskSizeMB",
        "allow_internet_access": "allowInternetAccess",
    },
    ListedSandbox: {
        "sandbox_id": "sandboxID",
        "template_id": "templateID",
        "client_id": "clientID",
        "started_at": "startedAt",
        "end_at": "endAt",
        "cpu_count": "cpuCount",
        "memory_mb": "memoryMB",
        "disk_size_mb": "diskSizeMB",
        "envd_version": "envdVersion",
    },
    SandboxMetric: {
        "timestamp_unix": "timestampUnix",
        "cpu_count": "cpuCount",
        "cpu_used_pct": "cpuUsedPct",
        "mem_used": "memUsed",
        "mem_total": "memTotal",
        "mem_cache": "memCache",
        "disk_used": "diskUsed",
        "disk_total": "diskTotal",
    },
}
"""The JSON names of the fields whose wire name is not the Python one."""

CONTROL_ALWAYS_SENT: Mapping[type, frozenset[str]] = {
    SandboxInfo: frozenset({"domain"}),
    SandboxMetric: frozenset(a.name for a in attrs.fields(SandboxMetric)),
    ListedSandbox: frozenset({"metadata"}),
    SnapshotInfo: frozenset({"names"}),
}
"""Fields written even at their default value (``"domain": null``, every metric)."""
