"""The repository-wide secret sweep (``tests/conftest.py``) finds what it must find.

Each test leaks on purpose, checks that ``secret_sweep.findings()`` reports it, then
takes the deliberate leak out of the sweep so the test itself passes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from reliability_support import API_KEY, BEARER, HOST_ENV, HOST_SECRETS, policy

from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.testing import Cluster, E2bServer, KubernetesServer

pytestmark = pytest.mark.timeout(20)
HOST_SECRET = HOST_SECRETS["ACME_API_TOKEN"]


def forget(sweep: Any, server: object) -> None:
    sweep.servers.remove(server)
    assert sweep.findings() == []


def test_a_key_in_a_query_is_found(secret_sweep: Any, e2b_server: Callable[..., E2bServer]) -> None:
    mock = e2b_server(api_key=API_KEY)
    requests.delete(f"{mock.url}/sandboxes/sbx1?key={API_KEY}", headers={"X-API-Key": API_KEY})
    assert any("path" in finding for finding in secret_sweep.findings())
    forget(secret_sweep, mock)


def test_a_key_sent_to_envd_is_found(
    secret_sweep: Any, e2b_server: Callable[..., E2bServer]
) -> None:
    mock = e2b_server()
    requests.post(f"{mock.url}/process.Process/SendSignal", headers={"X-API-Key": API_KEY})
    assert secret_sweep.findings() == ["an API key sent to /process.Process/SendSignal"]
    forget(secret_sweep, mock)


def test_a_host_secret_anywhere_is_found(secret_sweep: Any) -> None:
    with E2bServer() as mock:  # made directly, not by the fixture: tracked all the same
        requests.post(f"{mock.url}/sandboxes", data=f"env={HOST_SECRET}")
    assert any("body" in finding for finding in secret_sweep.findings())
    forget(secret_sweep, mock)


def test_a_bearer_outside_authorization_is_found(
    secret_sweep: Any, kubernetes_server: Callable[..., KubernetesServer]
) -> None:
    mock = kubernetes_server(None, Cluster(token=BEARER))
    requests.get(f"{mock.url}/execute", headers={"X-Debug": f"token {BEARER}"})
    assert any("header x-debug" in finding for finding in secret_sweep.findings())
    forget(secret_sweep, mock)


def test_a_secret_in_a_log_record_is_found(secret_sweep: Any) -> None:
    logging.getLogger("piship_remote.anything").debug("sending %s", HOST_SECRET)
    assert any("log record" in finding for finding in secret_sweep.findings())
    secret_sweep.records.clear()


def test_a_test_added_secret_is_swept(
    secret_sweep: Any, e2b_server: Callable[..., E2bServer]
) -> None:
    mock = e2b_server()
    secret_sweep.add("my-own-secret-000", ["x-mine"])
    requests.get(f"{mock.url}/health", headers={"X-Mine": "my-own-secret-000"})
    assert secret_sweep.findings() == []
    requests.get(f"{mock.url}/health", headers={"X-Other": "my-own-secret-000"})
    assert len(secret_sweep.findings()) == 1
    forget(secret_sweep, mock)


def test_a_clean_session_is_tracked_and_passes(
    secret_sweep: Any, e2b_server: Callable[..., E2bServer], workspace: Path
) -> None:
    mock = e2b_server(api_key=API_KEY)
    backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url, credential=lambda: API_KEY)
    with activate_sandbox(policy("deny"), backend=backend, workspace=workspace, env=HOST_ENV) as s:
        assert s.exec("true").exit_code == 0
    backend.close()
    assert mock in secret_sweep.servers
    assert secret_sweep.records, "the library's DEBUG records were not captured"
    assert secret_sweep.findings() == []


@pytest.mark.no_secret_sweep
def test_the_marker_turns_the_sweep_off(secret_sweep: Any) -> None:
    with E2bServer() as mock:
        requests.get(f"{mock.url}/health?k={HOST_SECRET}")
    assert secret_sweep.servers == []
