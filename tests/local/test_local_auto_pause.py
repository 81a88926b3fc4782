"""Auto-pause: a sandbox created with ``autoPause: true`` is paused, not killed, at its timeout.

Its lifetime is ended at once with ``POST /sandboxes/<id>/timeout {"timeout": 0}``,
so the tests wait on the reaper only, never on a clock.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest

from piship_remote.local import LocalE2bService
from tests.local.test_local_pause import TICKER, is_held, state, until
from tests.support.local_service import Client, needs_bwrap

pytestmark = pytest.mark.timeout(60)


def expire(client: Client, sandbox: dict[str, Any]) -> None:
    """End the sandbox's lifetime now."""
    path = f"/sandboxes/{sandbox['sandboxID']}/timeout"
    assert client.control("POST", path, json={"timeout": 0}).status_code == 204


def paused(client: Client, sandbox: dict[str, Any]) -> bool:
    """Whether the reaper has paused the sandbox (polled: the reaper sends no event)."""
    return until(lambda: state(client, sandbox) == "paused")


@needs_bwrap
def test_an_auto_pause_sandbox_is_paused_at_its_timeout_and_listed_paused(
    service: LocalE2bService, client: Client
) -> None:
    sandbox = client.create(autoPause=True)
    expire(client, sandbox)
    assert paused(client, sandbox)
    assert sandbox["sandboxID"] in service.sandboxes()
    assert is_held(service, sandbox["sandboxID"])
    listed = client.control("GET", "/v2/sandboxes?state=paused").json()
    assert [(s["sandboxID"], s["state"]) for s in listed] == [(sandbox["sandboxID"], "paused")]


@needs_bwrap
def test_connect_resumes_an_auto_paused_sandbox_with_its_files_and_processes(
    service: LocalE2bService, client: Client
) -> None:
    sandbox = client.create(autoPause=True)
    pid = client.run(sandbox, TICKER).stdout.strip()
    client.run(sandbox, "echo kept > ~/kept.txt")
    expire(client, sandbox)
    assert paused(client, sandbox)
    path = f"/v2/sandboxes/{sandbox['sandboxID']}/connect"
    connect = client.control("POST", path, json={"timeout": 60})
    assert connect.status_code == 201
    assert state(client, sandbox) == "running"
    assert client.run(sandbox, "cat ~/kept.txt").stdout == "kept\n"
    assert client.run(sandbox, f"kill -0 {pid} && echo alive").stdout == "alive\n"


@needs_bwrap
def test_connect_gives_an_auto_paused_sandbox_a_fresh_timeout(client: Client) -> None:
    sandbox = client.create(autoPause=True)
    expire(client, sandbox)
    assert paused(client, sandbox)
    path = f"/v2/sandboxes/{sandbox['sandboxID']}/connect"
    assert client.control("POST", path, json={"timeout": 60}).status_code == 201
    detail = client.control("GET", f"/sandboxes/{sandbox['sandboxID']}").json()
    left = _seconds(detail["endAt"]) - time.time()
    assert 50 < left <= 60


@needs_bwrap
def test_without_auto_pause_the_timeout_still_deletes_the_sandbox(
    service: LocalE2bService, client: Client
) -> None:
    sandbox = client.create(autoPause=False)
    expire(client, sandbox)
    assert until(lambda: sandbox["sandboxID"] not in service.sandboxes())


@needs_bwrap
def test_details_carry_the_lifecycle_asked_for_at_create(client: Client) -> None:
    pausing = client.create(autoPause=True, autoResume={"enabled": True})
    killing = client.create()

    def lifecycle(sandbox: dict[str, Any]) -> object:
        return client.control("GET", f"/sandboxes/{sandbox['sandboxID']}").json()["lifecycle"]

    assert lifecycle(pausing) == {"onTimeout": "pause", "autoResume": True}
    assert lifecycle(killing) == {"onTimeout": "kill", "autoResume": False}


@needs_bwrap
def test_envd_traffic_resumes_an_auto_paused_sandbox_with_auto_resume(client: Client) -> None:
    sandbox = client.create(timeout=120, autoPause=True, autoResume={"enabled": True})
    expire(client, sandbox)
    assert paused(client, sandbox)
    assert client.run(sandbox, "echo awake").stdout == "awake\n"
    assert state(client, sandbox) == "running"
    detail = client.control("GET", f"/sandboxes/{sandbox['sandboxID']}").json()
    assert 100 < _seconds(detail["endAt"]) - time.time() <= 120  # its create timeout again


@needs_bwrap
def test_without_auto_resume_envd_answers_an_auto_paused_sandbox_as_missing(
    client: Client,
) -> None:
    sandbox = client.create(autoPause=True)
    expire(client, sandbox)
    assert paused(client, sandbox)
    response = client.session.post(
        client.service.envd_url + "/process.Process/List",
        json={},
        headers=client.envd_headers(sandbox),
        timeout=5,
    )
    assert response.status_code == 502
    assert state(client, sandbox) == "paused"


@pytest.mark.parametrize(
    "body",
    [{"autoPause": "yes"}, {"autoPause": True, "autoResume": True}, {"autoResume": {"enabled": 1}}],
)
def test_a_create_with_a_malformed_lifecycle_is_400(client: Client, body: dict[str, Any]) -> None:
    response = client.control("POST", "/sandboxes", json={"templateID": "base", **body})
    assert response.status_code == 400
    assert response.json()["code"] == 400


def _seconds(rfc3339: str) -> float:
    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
