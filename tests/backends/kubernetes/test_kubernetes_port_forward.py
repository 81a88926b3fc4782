"""The router reached by port-forward through the API server (``router="port-forward"``),
as ``kubectl port-forward svc/sandbox-router-svc`` does, against the fake cluster's
Service, Endpoints and ``pods/<pod>/portforward`` WebSocket."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("websocket")  # websocket-client: the kubernetes extra

from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend, PortForward
from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from piship_remote.model.policy import SandboxProfile
from piship_remote.pool import SandboxPool
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.testing import CLAIMS, Cluster, KubernetesServer, RecordingServer, json_response
from tests.support.seed import assert_no_library_thread_left

KubernetesFactory = Callable[..., KubernetesServer]

pytestmark = pytest.mark.timeout(30)

POLICY = {"required": True, "network": {"mode": "allow"}}
ROUTER_POD = "sandbox-router-6d8f9-x7k2p"
FORWARD = f"/api/v1/namespaces/agent-sandbox-system/pods/{ROUTER_POD}/portforward?ports=8080"


def backend_for(mock: KubernetesServer, **options: Any) -> KubernetesAgentSandboxBackend:
    return KubernetesAgentSandboxBackend(
        endpoint=mock.url,
        router=options.pop("router", "port-forward"),
        template="python-pool",
        namespace="agents",
        credential=lambda: "cluster-t0ken",
        **options,
    )


def tunnel_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("piship-router-tunnel")]


def test_commands_and_files_reach_the_router_through_the_pod_port_forward(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(token="cluster-t0ken", router_token="router-t0ken"))
    backend = backend_for(mock, router_credential=lambda: "router-t0ken")
    with backend, activate_sandbox(POLICY, backend=backend, workspace=tmp_path) as sandbox:
        assert sandbox.run("echo hi").stdout == "hi\n"
        sandbox.files.write("notes.txt", b"hello")
        assert sandbox.files.read("notes.txt") == b"hello"

    forwards = mock.find("GET", FORWARD)
    assert forwards, [r.path for r in mock.requests]
    assert {r.headers["authorization"] for r in forwards} == {"Bearer cluster-t0ken"}
    assert {r.headers["sec-websocket-protocol"] for r in forwards} == {"v4.channel.k8s.io"}
    executes = mock.find("POST", "/execute")
    assert {r.headers["authorization"] for r in executes} == {"Bearer router-t0ken"}


def test_the_router_pod_comes_from_the_service_endpoints(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(router_pods=["router-b"], router_namespace="edge"))
    backend = backend_for(mock, router=PortForward(namespace="edge"))
    with backend, activate_sandbox(POLICY, backend=backend, workspace=tmp_path) as sandbox:
        assert sandbox.exec("true").exit_code == 0
    paths = [r.path for r in mock.requests]
    assert "/api/v1/namespaces/edge/services/sandbox-router-svc" in paths
    assert "/api/v1/namespaces/edge/endpoints/sandbox-router-svc" in paths
    assert mock.count("GET", "/api/v1/namespaces/edge/pods/router-b/portforward?ports=8080") >= 1


def test_a_service_without_ready_pods_fails_the_activation_before_any_claim(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server(cluster=Cluster(router_pods=[]))
    backend = backend_for(mock)
    with backend, pytest.raises(PiShipError, match="no ready pod to port-forward to"):
        activate_sandbox(POLICY, backend=backend, workspace=tmp_path)
    assert mock.count("POST", CLAIMS) == 0


def test_a_missing_router_service_is_named(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server()
    backend = backend_for(mock, router=PortForward(service="no-such-router"))
    missing = r"services/no-such-router in namespace agent-sandbox-system .*HTTP 404"
    with backend, pytest.raises(PiShipError, match=missing):
        activate_sandbox(POLICY, backend=backend, workspace=tmp_path)


def test_a_refused_port_forward_is_a_command_never_sent(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    cluster = Cluster()
    mock = kubernetes_server(cluster=cluster)
    backend = backend_for(mock)
    with backend, activate_sandbox(POLICY, backend=backend, workspace=tmp_path) as sandbox:
        cluster.denied.add("create pods/portforward")
        sent = mock.count("POST", "/execute")
        with pytest.raises(PiShipError) as raised:
            sandbox.exec("touch /tmp/x")
        assert raised.value.not_started
        assert "port-forward to the sandbox router failed" in str(raised.value)
        assert "HTTP 403: pods/portforward is forbidden" in str(raised.value)
        assert mock.count("POST", "/execute") == sent


def test_the_tunnel_threads_are_gone_after_dispose(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server()
    backend = backend_for(mock)
    sandbox = activate_sandbox(POLICY, backend=backend, workspace=tmp_path)
    assert sandbox.exec("true").exit_code == 0
    assert "piship-router-tunnel-accept" in tunnel_threads()
    sandbox.dispose()
    assert tunnel_threads() == []
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("piship-"))
    backend.close()
    assert_no_library_thread_left()


def test_a_pool_maps_over_sandboxes_sharing_one_tunnel(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server()
    backend = backend_for(mock)
    with backend, SandboxPool(POLICY, backend=backend, workspace=tmp_path, size=2) as pool:
        results = pool.map(lambda sandbox, n: sandbox.run(f"echo {n}").stdout, range(4))
    assert [(r.outcome, r.value) for r in results] == [("ok", f"{n}\n") for n in range(4)]
    assert tunnel_threads() == []


def test_port_forward_options_are_checked() -> None:
    with pytest.raises(ValueError, match="resource name"):
        PortForward(namespace="Not_A_Name")
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        PortForward(port=0)


def test_a_kubeconfig_client_certificate_opens_the_port_forward_over_tls(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    pytest.importorskip("cryptography")
    pytest.importorskip("kubernetes.config")
    from tests.support.k8s_tls import CLIENT_NAME, Pki
    from tests.support.kubeconfig import kubeconfig_backend

    pki = Pki.create(tmp_path)
    cluster = Cluster(client_subject=CLIENT_NAME)
    mock = kubernetes_server(cluster=cluster, tls=pki.server_context())
    user = {"client-certificate": str(pki.client_cert), "client-key": str(pki.client_key)}
    backend = kubeconfig_backend(mock.url, pki.ca, tmp_path, user, router="port-forward")
    with backend, activate_sandbox(POLICY, backend=backend, workspace=tmp_path) as sandbox:
        assert sandbox.run("echo over-tls").stdout == "over-tls\n"
    assert mock.find("GET", FORWARD)  # accepted: the double wants this client certificate
    assert all("authorization" not in r.headers for r in mock.requests)


def test_a_sandbox_disposed_twice_leaves_the_tunnel_to_the_one_still_open(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    mock = kubernetes_server()
    with backend_for(mock) as backend:
        first = backend.prepare(SandboxProfile(workspace=str(tmp_path)))
        second = activate_sandbox(POLICY, backend=backend, workspace=tmp_path)
        first.dispose()
        first.dispose()
        assert second.run("echo still").stdout == "still\n"
        second.dispose()
        assert tunnel_threads() == []


def test_without_websocket_client_the_extra_is_named(
    kubernetes_server: KubernetesFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "websocket", None)
    with pytest.raises(PiShipError) as raised:
        backend_for(kubernetes_server())
    assert raised.value.code == CONFIG_INVALID
    assert "piship-remote[kubernetes]" in (raised.value.user_action or "")


def test_the_double_forwards_to_a_loopback_router_upstream(
    kubernetes_server: KubernetesFactory,
) -> None:
    websocket = pytest.importorskip("websocket")
    with RecordingServer(lambda request: json_response(200, {"upstream": request.path})) as up:
        mock = kubernetes_server(cluster=Cluster(router_upstream=("127.0.0.1", up.port)))
        url = mock.url.replace("http://", "ws://") + FORWARD
        stream = websocket.create_connection(url, subprotocols=["v4.channel.k8s.io"], timeout=5)
        try:
            prefixes = [stream.recv_data()[1] for _ in range(2)]
            stream.send_binary(b"\x00GET /healthz HTTP/1.1\r\nHost: router\r\n\r\n")
            answer = b""
            while (message := stream.recv_data()[1]) and message[:1] == b"\x00":
                answer += message[1:]
        finally:
            stream.close()
    assert prefixes == [b"\x00\x90\x1f", b"\x01\x90\x1f"]  # each channel's port, 8080
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"upstream":"/healthz"}')
    assert up.count("GET", "/healthz") == 1
