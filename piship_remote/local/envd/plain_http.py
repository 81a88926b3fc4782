"""envd's plain HTTP endpoints besides ``/files``: ``GET /health``, ``GET /envs``, ``GET /metrics``.

``/health`` answers 204. ``/envs`` is the variables the sandbox was created with
(``envVars``), as a JSON object. ``/metrics`` is one sample of the sandbox in envd's
own shape: ``ts`` (unix seconds), ``cpu_count``, ``cpu_used_pct``, ``mem_total``,
``mem_used``, ``mem_cache``, ``mem_total_mib``, ``mem_used_mib``, ``disk_used``,
``disk_total`` (bytes unless named MiB)::

    reply = envd_http(sandbox, request)     # request.path in ENVD_HTTP_PATHS
"""

from __future__ import annotations

import json

from piship_remote._http_server.messages import Reply, Request
from piship_remote.local.sandbox.metrics import snapshot
from piship_remote.local.sandbox.registry import Sandbox

__all__ = ["ENVD_HTTP_PATHS", "envd_http"]

ENVD_HTTP_PATHS = frozenset({"/health", "/envs", "/metrics"})
MIB = 1024 * 1024


def envd_http(sandbox: Sandbox, request: Request) -> Reply:
    """Answer ``GET`` on one of :data:`ENVD_HTTP_PATHS`."""
    if request.method != "GET":
        return Reply(405, headers=(("Allow", "GET"),))
    if request.path == "/health":
        return Reply(204)
    if request.path == "/envs":
        return _json(sandbox.env_vars)
    sample = snapshot(sandbox)
    return _json(
        {
            "ts": sample.timestamp_unix,
            "cpu_count": sample.cpu_count,
            "cpu_used_pct": sample.cpu_used_pct,
            "mem_total": sample.mem_total,
            "mem_used": sample.mem_used,
            "mem_cache": sample.mem_cache,
            "mem_total_mib": sample.mem_total // MIB,
            "mem_used_mib": sample.mem_used // MIB,
            "disk_used": sample.disk_used,
            "disk_total": sample.disk_total,
        }
    )


def _json(value: object) -> Reply:
    return Reply(200, json.dumps(value, separators=(",", ":")).encode(), "application/json")
