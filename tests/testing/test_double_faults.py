"""Faults on demand: each one the doubles offer, seen from a client, on both doubles."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from piship_remote import PiShipError, Sandbox, activate_sandbox
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.testing import CLAIMS, E2bServer, KubernetesServer
from tests.support.seed import kubernetes

pytestmark = pytest.mark.timeout(60)

Double = E2bServer | KubernetesServer
POLICY = {"required": True, "network": {"mode": "allow"}}


@pytest.fixture(params=["e2b", "kubernetes"])
def double(request: pytest.FixtureRequest) -> Iterator[Double]:
    server: Double = E2bServer() if request.param == "e2b" else KubernetesServer()
    with server:
        yield server


def activate(server: Double, workspace: Path) -> Sandbox:
    if isinstance(server, E2bServer):
        backend: Any = E2bCompatibleBackend(
            endpoint=server.url, envd_url=server.url, credential=lambda: "e2b-key-000001"
        )
    else:
        backend = kubernetes(server.url)
    return activate_sandbox(POLICY, backend=backend, workspace=workspace)


def create(server: Double) -> requests.Response:
    """One create, as the service's own API takes it."""
    if isinstance(server, E2bServer):
        return requests.post(f"{server.url}/sandboxes", json={"templateID": "base"}, timeout=10)
    claim = {"metadata": {"name": "c1"}, "spec": {"warmPoolRef": {"name": "python-pool"}}}
    return requests.post(f"{server.url}{CLAIMS}", json=claim, timeout=10)


def live(server: Double) -> list[str]:
    return server.live_sandboxes if isinstance(server, E2bServer) else server.live_claims


def test_the_next_creates_answer_the_status_with_retry_after(double: Double) -> None:
    double.faults.fail_creates(2, status=429, retry_after=3)
    for _ in range(2):
        refused = create(double)
        assert (refused.status_code, refused.headers.get("Retry-After")) == (429, "3")
    assert live(double) == []
    assert create(double).status_code == 201
    assert len(live(double)) == 1


def test_a_library_create_is_retried_after_a_429(tmp_path: Path) -> None:
    with E2bServer() as server:
        server.faults.fail_creates(1, status=429, retry_after=0)
        sandbox = activate(server, tmp_path)
        try:
            assert server.count("POST", "/sandboxes") == 2 and server.live_sandboxes == [sandbox.id]
        finally:
            sandbox.dispose()


def test_a_lost_create_answer_still_created(double: Double) -> None:
    double.faults.lose_create_answer()
    with pytest.raises(requests.ConnectionError):
        create(double)
    assert len(live(double)) == 1


def test_kill_ends_a_sandbox_or_claim_now(double: Double, tmp_path: Path) -> None:
    sandbox = activate(double, tmp_path)
    killed = sandbox.id
    try:
        double.kill(killed)
        assert killed not in live(double)
        if isinstance(double, E2bServer):
            with pytest.raises(PiShipError):
                sandbox.exec("echo hi")
        else:  # the library replaces a claim the cluster removed
            assert sandbox.exec("echo hi").exit_code == 0
            assert live(double) == [sandbox.id] and sandbox.id != killed
    finally:
        sandbox.dispose()


def test_a_dropped_stream_fails_the_command_after_its_output(
    double: Double, tmp_path: Path
) -> None:
    sandbox = activate(double, tmp_path)
    try:
        double.faults.drop_stream_after_output()
        seen = bytearray()
        with pytest.raises(PiShipError):
            sandbox.exec("echo partial", on_data=seen.extend)
        if isinstance(double, E2bServer):
            assert bytes(seen) == b"partial\n"  # the output came before the reset
        assert sandbox.exec("echo again").exit_code == 0  # one stream only
    finally:
        sandbox.dispose()


def test_a_stall_with_seconds_delays_the_request(double: Double) -> None:
    path = "/health" if isinstance(double, E2bServer) else "/healthz"
    double.faults.stall(path, seconds=0.5)
    started = time.monotonic()
    assert requests.get(f"{double.url}{path}", timeout=10).status_code in (200, 204)
    assert time.monotonic() - started >= 0.5
    started = time.monotonic()
    requests.get(f"{double.url}{path}", timeout=10)
    assert time.monotonic() - started < 0.5  # used up


def test_a_stall_without_seconds_holds_until_released(double: Double) -> None:
    path = "/health" if isinstance(double, E2bServer) else "/healthz"
    double.faults.stall(path)
    answered = threading.Event()

    def ask() -> None:
        requests.get(f"{double.url}{path}", timeout=10)
        answered.set()

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    double.wait_for("GET", path)
    assert not answered.wait(0.3)
    double.faults.release()
    assert answered.wait(5)
    asker.join(5)


def test_clear_forgets_faults_not_used(double: Double) -> None:
    double.faults.fail_creates(1)
    double.faults.clear()
    assert create(double).status_code == 201
