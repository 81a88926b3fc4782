"""A request without a sandbox's token changes nothing about it: a paused ``autoResume``
sandbox stays paused (today the envd lookup resumed it before the token was checked)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.local.test_local_pause import pause, state
from tests.support.local_service import Client, needs_bwrap

pytestmark = [needs_bwrap, pytest.mark.timeout(60)]

WRONG_TOKEN = "0" * 32


@pytest.fixture
def paused(client: Client) -> dict[str, Any]:
    """A sandbox that auto-resumes and whose ports want its traffic token, paused."""
    sandbox = client.create(
        autoPause=True, autoResume={"enabled": True}, network={"allowPublicTraffic": False}
    )
    assert pause(client, sandbox) == 204
    return sandbox


def test_envd_traffic_with_a_wrong_token_does_not_resume(
    client: Client, paused: dict[str, Any]
) -> None:
    headers = {**client.envd_headers(paused), "X-Access-Token": WRONG_TOKEN}
    response = client.session.post(
        client.service.envd_url + "/process.Process/List", json={}, headers=headers, timeout=5
    )
    assert response.status_code == 502
    assert state(client, paused) == "paused"


def test_a_file_download_without_token_or_signature_does_not_resume(
    client: Client, paused: dict[str, Any]
) -> None:
    response = client.session.get(
        client.service.envd_url + "/files",
        params={"path": "/etc/hostname"},
        headers={"E2b-Sandbox-Id": paused["sandboxID"]},
        timeout=5,
    )
    assert response.status_code == 502
    assert state(client, paused) == "paused"


def test_a_port_request_without_the_traffic_token_does_not_resume(
    client: Client, paused: dict[str, Any]
) -> None:
    response = client.session.get(
        client.service.url,
        headers={"E2b-Sandbox-Id": paused["sandboxID"], "E2b-Sandbox-Port": "8000"},
        timeout=5,
    )
    assert response.status_code == 403
    assert state(client, paused) == "paused"


def test_envd_traffic_with_the_token_still_resumes(client: Client, paused: dict[str, Any]) -> None:
    assert client.run(paused, "echo awake").stdout == "awake\n"
    assert state(client, paused) == "running"
