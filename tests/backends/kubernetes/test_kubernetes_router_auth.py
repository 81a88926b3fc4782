"""Today's sandbox router: its own bearer token, the Sandbox's UID, and a router that checks
scoped tokens (and so refuses the pod-IP and UID routing headers)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends.base import ExecRequest
from piship_remote.model.errors import PiShipError
from piship_remote.model.policy import SandboxProfile
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.testing import Cluster, KubernetesServer
from piship_remote.wire.agent_sandbox import SANDBOXES
from tests.support.seed import kubernetes

KubernetesFactory = Callable[..., KubernetesServer]

pytestmark = pytest.mark.timeout(20)

POLICY = {"required": True, "network": {"mode": "allow"}}


def router_requests(mock: KubernetesServer) -> list[Any]:
    return [r for r in mock.requests if not r.path.startswith("/apis/")]


def test_the_router_gets_the_router_credential_and_the_api_the_cluster_credential(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(token="cluster-t0ken", router_token="router-t0ken"))
    backend = kubernetes(
        mock.url, credential=lambda: "cluster-t0ken", router_credential=lambda: "router-t0ken"
    )
    with backend, activate_sandbox(POLICY, backend=backend, workspace=tmp_path) as sandbox:
        assert sandbox.exec("true").exit_code == 0
        sandbox.files.write("a.txt", b"x")
    api = {r.headers["authorization"] for r in mock.requests if r.path.startswith("/apis/")}
    assert api == {"Bearer cluster-t0ken"}
    assert {r.headers["authorization"] for r in router_requests(mock)} == {"Bearer router-t0ken"}


def test_a_router_refusing_the_token_is_reported_with_its_answer(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(router_token="router-t0ken"))
    backend = kubernetes(mock.url, router_credential=lambda: "wrong")
    with backend, pytest.raises(PiShipError, match="HTTP 401: Invalid token"):
        activate_sandbox(POLICY, backend=backend, workspace=tmp_path)


def test_the_sandbox_uid_goes_with_each_router_request(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server()
    backend = kubernetes(mock.url)
    with backend, activate_sandbox(POLICY, backend=backend, workspace=tmp_path) as sandbox:
        assert sandbox.exec("true").exit_code == 0
        uids = {s["metadata"]["uid"] for s in mock.store.objects(SANDBOXES, "agents")}
    sent = {r.headers.get("x-sandbox-uid") for r in router_requests(mock)}
    assert sent == uids and len(uids) == 1


def test_a_scoped_token_router_refuses_the_pod_ip_and_uid_headers(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(scoped_router=True))
    backend = kubernetes(mock.url)
    with backend, pytest.raises(PiShipError, match="HTTP 403: X-Sandbox-Pod-IP is not allowed"):
        activate_sandbox(POLICY, backend=backend, workspace=tmp_path)


def test_in_scoped_token_mode_the_router_is_reached_by_the_sandbox_name_only(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(scoped_router=True, router_token="scoped-t0ken"))
    backend = kubernetes(
        mock.url, router_auth="scoped-token", router_credential=lambda: "scoped-t0ken"
    )
    with backend, activate_sandbox(POLICY, backend=backend, workspace=tmp_path) as sandbox:
        assert sandbox.exec("true").exit_code == 0
        sandbox.files.write("a.txt", b"x")
        assert sandbox.files.read("a.txt") == b"x"
        claims = mock.live_claims
    sent = router_requests(mock)
    assert {r.headers["x-sandbox-id"] for r in sent} == {f"pool-{claims[0]}"}
    assert all("x-sandbox-pod-ip" not in r.headers for r in sent)
    assert all("x-sandbox-uid" not in r.headers for r in sent)


def test_an_unknown_router_auth_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="router_auth"):
        kubernetes("http://127.0.0.1:1", router_auth="mtls")


def test_a_router_refusing_the_token_at_activation_names_router_credential(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(router_token="router-t0ken"))
    backend = kubernetes(mock.url, router_credential=lambda: "wrong")
    with backend, pytest.raises(PiShipError) as caught:
        activate_sandbox(POLICY, backend=backend, workspace=tmp_path)
    assert "HTTP 401" in str(caught.value)
    assert "router_credential" in str(caught.value)
    assert "wrong" not in str(caught.value)


def test_a_router_refusing_a_missing_token_at_activation_names_router_credential(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(router_token="router-t0ken"))
    backend = kubernetes(mock.url)
    with backend, pytest.raises(PiShipError, match=r"HTTP 401.*router_credential"):
        activate_sandbox(POLICY, backend=backend, workspace=tmp_path)


def test_a_command_the_router_refuses_with_401_says_to_set_router_credential(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(router_token="router-t0ken"))
    backend = kubernetes(mock.url, router_credential=lambda: "wrong")
    with backend:
        instance = backend.prepare(SandboxProfile(workspace=str(tmp_path)))
        try:
            with pytest.raises(PiShipError) as caught:
                instance.exec(ExecRequest("true", cwd=str(tmp_path)), cancel=threading.Event())
        finally:
            instance.dispose()
    assert "HTTP 401" in str(caught.value)
    assert "router_credential" in (caught.value.user_action or "")
