"""Attach, detach and sweep when the sandbox is gone, foreign or the service refuses."""

from __future__ import annotations

import pytest
import requests

from piship_remote import activate_sandbox
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from piship_remote.testing import CLAIMS, E2bServer, KubernetesServer
from piship_remote.testing.e2b_server import ENVD_ACCESS_TOKEN

pytestmark = pytest.mark.timeout(30)
E2B_POLICY = {"required": True, "network": {"mode": "deny"}}
K8S_POLICY = {"required": True, "network": {"mode": "allow"}}


def e2b(server: E2bServer) -> E2bCompatibleBackend:
    return E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)


def k8s(server: KubernetesServer) -> KubernetesAgentSandboxBackend:
    return KubernetesAgentSandboxBackend(
        endpoint=server.url, router=server.url, template="python-pool", namespace="agents",
        poll_interval=0.05,
    )  # fmt: skip


def test_attaching_to_a_gone_e2b_sandbox_says_so(tmp_path) -> None:
    with E2bServer() as server, e2b(server) as backend:
        with pytest.raises(PiShipError, match="does not exist any more"):
            activate_sandbox(E2B_POLICY, backend=backend, workspace=tmp_path, attach="gone1")
        assert server.live_sandboxes == []


def test_an_attached_e2b_sandbox_uses_the_envd_token_its_connect_answer_gives(tmp_path) -> None:
    with E2bServer() as server, e2b(server) as backend:
        server.plant("kept1", metadata={"created-by": "piship"})
        with activate_sandbox(E2B_POLICY, backend=backend, workspace=tmp_path, attach="kept1"):
            pass
        paths = [r.path for r in server.requests]
        assert "/sandboxes/kept1/connect" in paths
        connected = paths.index("/sandboxes/kept1/connect")
        starts = [r for r in server.requests[connected:] if r.path == "/process.Process/Start"]
        assert starts and starts[-1].headers.get("x-access-token") == ENVD_ACCESS_TOKEN
        assert server.live_sandboxes == []


def test_kubernetes_never_attaches_to_a_claim_it_did_not_create(tmp_path) -> None:
    with KubernetesServer() as server, k8s(server) as backend:
        body = {
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
            "kind": "SandboxClaim",
            "metadata": {"name": "foreign"},
            "spec": {"warmPoolRef": {"name": "python-pool"}},
        }
        assert requests.post(server.url + CLAIMS, json=body, timeout=5).status_code == 201
        with pytest.raises(PiShipError) as raised:
            activate_sandbox(K8S_POLICY, backend=backend, workspace=tmp_path, attach="foreign")
        assert "not created by piship_remote" in str(raised.value)
        assert server.live_claims == ["foreign"]
        assert not [r for r in server.requests if r.method in ("PATCH", "DELETE")]


def test_kubernetes_attach_to_a_missing_claim_fails_cleanly(tmp_path) -> None:
    with KubernetesServer() as server, k8s(server) as backend:
        with pytest.raises(PiShipError, match="does not exist any more"):
            activate_sandbox(K8S_POLICY, backend=backend, workspace=tmp_path, attach="piship-gone")
        assert server.live_claims == []


@pytest.mark.parametrize("kind", ["e2b", "k8s"])
def test_detach_keeps_the_sandbox_and_a_later_dispose_deletes_nothing(kind, tmp_path) -> None:
    server = E2bServer() if kind == "e2b" else KubernetesServer()
    with server:
        backend = e2b(server) if isinstance(server, E2bServer) else k8s(server)
        policy = E2B_POLICY if kind == "e2b" else K8S_POLICY
        sandbox = activate_sandbox(policy, backend=backend, workspace=tmp_path)
        sandbox_id = sandbox.detach()
        sandbox.dispose()
        backend.close()
        live = server.live_sandboxes if isinstance(server, E2bServer) else server.live_claims
        assert live == [sandbox_id]
        with pytest.raises(PiShipError, match="disposed"):
            sandbox.exec("true")


def test_a_sweep_whose_list_is_refused_deletes_nothing() -> None:
    with (
        E2bServer(reject_once=["/v2/sandboxes", "/v2/sandboxes"]) as server,
        e2b(server) as backend,
    ):
        server.plant("ours", metadata={"created-by": "piship"}, age=7200)
        with pytest.raises(PiShipError):
            backend.list_owned()
        assert server.live_sandboxes == ["ours"]


def test_delete_owned_refuses_what_is_not_an_id() -> None:
    with E2bServer() as server, e2b(server) as backend:
        with pytest.raises(PiShipError) as raised:
            backend.delete_owned("../sandboxes")
        assert raised.value.code == CONFIG_INVALID
