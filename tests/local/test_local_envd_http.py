"""envd's plain HTTP endpoints on the local service: ``/health``, ``/envs``, ``/metrics``.

They are routed by ``E2b-Sandbox-Id`` like every envd request, so a paused or
deleted sandbox answers E2B's 502 (what the SDK's ``is_running`` reads as False).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.local_service import Client, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.timeout(60)]


def envd_get(client: Client, sandbox: dict[str, Any], path: str) -> Any:
    return client.session.get(
        client.service.envd_url + path, headers=client.envd_headers(sandbox), timeout=10
    )


def test_envs_are_the_variables_the_sandbox_was_created_with(client: Client) -> None:
    sandbox = client.create(envVars={"GREETING": "hi", "N": "1"})
    response = envd_get(client, sandbox, "/envs")
    assert (response.status_code, response.json()) == (200, {"GREETING": "hi", "N": "1"})


def test_metrics_are_one_sample_in_envd_shape(client: Client) -> None:
    sandbox = client.create()
    sample = envd_get(client, sandbox, "/metrics").json()
    assert set(sample) == {
        "ts",
        "cpu_count",
        "cpu_used_pct",
        "mem_total",
        "mem_used",
        "mem_cache",
        "mem_total_mib",
        "mem_used_mib",
        "disk_used",
        "disk_total",
    }
    assert sample["mem_total_mib"] == sample["mem_total"] // (1024 * 1024)
    assert sample["disk_total"] > 0 and sample["cpu_count"] >= 1


def test_health_is_204_and_502_once_the_sandbox_is_paused_or_gone(client: Client) -> None:
    sandbox = client.create()
    assert envd_get(client, sandbox, "/health").status_code == 204
    client.control("POST", f"/sandboxes/{sandbox['sandboxID']}/pause", json={})
    assert envd_get(client, sandbox, "/health").status_code == 502
    client.control("DELETE", f"/sandboxes/{sandbox['sandboxID']}")
    assert envd_get(client, sandbox, "/health").status_code == 502
