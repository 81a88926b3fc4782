"""The Kubernetes backend with the cluster's own credentials: a kubeconfig context (client
certificate, token file, exec plugin) and a pod's service account, against the fake
cluster served over TLS with its own CA."""

from __future__ import annotations

import base64
import datetime
import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

pytest.importorskip("cryptography")  # the test CA
pytest.importorskip("kubernetes.config")  # the kubernetes extra

from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
from piship_remote.model.errors import CONFIG_INVALID, TLS_POLICY_VIOLATION, PiShipError
from piship_remote.pool import SandboxPool
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.testing import CLAIMS, Cluster, KubernetesServer
from tests.support.k8s_tls import CLIENT_NAME, Pki
from tests.support.kubeconfig import exec_user, kubeconfig_backend, plugin_runs, write_kubeconfig

KubernetesFactory = Callable[..., KubernetesServer]

pytestmark = pytest.mark.timeout(30)

POLICY = {"required": True, "network": {"mode": "allow"}}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki.create(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def tls_server(kubernetes_server: KubernetesFactory, pki: Pki) -> Callable[[Cluster], Any]:
    def start(cluster: Cluster) -> KubernetesServer:
        return kubernetes_server(cluster=cluster, tls=pki.server_context())

    return start


@pytest.fixture
def router_session(pki: Pki) -> Iterator[requests.Session]:
    """The router's session: it trusts the double's CA (the router is the same server)."""
    session = requests.Session()
    session.verify = str(pki.ca)
    yield session
    session.close()


def api_requests(mock: KubernetesServer) -> list[Any]:
    return [r for r in mock.requests if r.path.startswith("/apis/")]


def router_requests(mock: KubernetesServer) -> list[Any]:
    return [r for r in mock.requests if not r.path.startswith("/apis/")]


def in_cluster_backend(
    mock: KubernetesServer,
    service_account: Path,
    router_session: requests.Session,
    monkeypatch: pytest.MonkeyPatch,
) -> KubernetesAgentSandboxBackend:
    """A backend in a pod of ``mock``'s cluster, with the router's own token."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(mock.port))
    return KubernetesAgentSandboxBackend.in_cluster(
        router=mock.url,
        template="python-pool",
        service_account=str(service_account),
        session=router_session,
        router_credential=lambda: "router-t0ken",
    )


def run_commands_and_files(backend: KubernetesAgentSandboxBackend, workspace: Path) -> None:
    with backend, activate_sandbox(POLICY, backend=backend, workspace=workspace) as sandbox:
        assert sandbox.exec("true").exit_code == 0
        sandbox.files.write("notes.txt", b"hello")
        assert sandbox.files.read("notes.txt") == b"hello"


def client_user(pki: Pki, embedded: bool) -> dict[str, str]:
    if not embedded:
        return {"client-certificate": str(pki.client_cert), "client-key": str(pki.client_key)}
    return {
        "client-certificate-data": base64.b64encode(pki.client_cert.read_bytes()).decode(),
        "client-key-data": base64.b64encode(pki.client_key.read_bytes()).decode(),
    }


@pytest.mark.parametrize("embedded", [False, True], ids=["files", "embedded-data"])
def test_a_client_certificate_from_the_kubeconfig_authenticates_to_the_api_server_only(
    tls_server: Callable[[Cluster], KubernetesServer],
    pki: Pki,
    router_session: requests.Session,
    tmp_path: Path,
    embedded: bool,
) -> None:
    mock = tls_server(Cluster(client_subject=CLIENT_NAME))
    backend = kubeconfig_backend(
        mock.url, pki.ca, tmp_path, client_user(pki, embedded), session=router_session
    )
    run_commands_and_files(backend, tmp_path)

    subjects = dict.fromkeys(subject for path, subject in mock.client_subjects)
    api = {s for p, s in mock.client_subjects if p.startswith("/apis/")}
    router = {s for p, s in mock.client_subjects if not p.startswith("/apis/")}
    assert api == {CLIENT_NAME} and router == {None}, subjects
    assert mock.count("POST", CLAIMS) == 1  # the context's namespace, "agents"
    assert all("authorization" not in r.headers for r in mock.requests)


def test_a_server_certificate_the_kubeconfig_ca_does_not_sign_is_refused(
    tls_server: Callable[[Cluster], KubernetesServer], pki: Pki, tmp_path: Path
) -> None:
    mock = tls_server(Cluster(client_subject=CLIENT_NAME))
    other = Pki.create(tmp_path)
    config = write_kubeconfig(
        tmp_path / "config",
        mock.url,
        {"client-certificate": str(pki.client_cert), "client-key": str(pki.client_key)},
        ca=other.ca,
    )
    with KubernetesAgentSandboxBackend.from_kubeconfig(
        config, router=mock.url, template="python-pool"
    ) as backend:
        availability = backend.available()
    assert not availability.available
    assert "certificate" in (availability.reason or "").lower()
    assert mock.requests == []


def test_a_token_file_goes_to_the_api_server_and_the_router_token_to_the_router(
    tls_server: Callable[[Cluster], KubernetesServer],
    pki: Pki,
    router_session: requests.Session,
    tmp_path: Path,
) -> None:
    mock = tls_server(Cluster(token="cluster-t0ken", router_token="router-t0ken"))
    token_file = tmp_path / "token"
    token_file.write_text("cluster-t0ken\n")
    user = {"tokenFile": str(token_file)}
    backend = kubeconfig_backend(
        mock.url,
        pki.ca,
        tmp_path,
        user,
        session=router_session,
        router_credential=lambda: "router-t0ken",
    )
    run_commands_and_files(backend, tmp_path)

    assert {r.headers["authorization"] for r in api_requests(mock)} == {"Bearer cluster-t0ken"}
    assert {r.headers["authorization"] for r in router_requests(mock)} == {"Bearer router-t0ken"}


def test_without_a_router_credential_the_router_gets_no_credential_at_all(
    tls_server: Callable[[Cluster], KubernetesServer],
    pki: Pki,
    router_session: requests.Session,
    tmp_path: Path,
) -> None:
    mock = tls_server(Cluster(token="cluster-t0ken", router_token="router-t0ken"))
    config = write_kubeconfig(tmp_path / "config", mock.url, {"token": "cluster-t0ken"}, ca=pki.ca)
    with pytest.raises(PiShipError, match="HTTP 401"):
        run_commands_and_files(
            KubernetesAgentSandboxBackend.from_kubeconfig(
                config, router=mock.url, template="python-pool", session=router_session
            ),
            tmp_path,
        )
    assert router_requests(mock)
    assert all("authorization" not in r.headers for r in router_requests(mock))


def exec_plugin(tmp_path: Path, expires_in: datetime.timedelta) -> tuple[dict[str, Any], Path]:
    """A kubeconfig ``exec`` user whose plugin answers the token in ``<tmp>/plugin-token``
    and appends a line to ``<tmp>/plugin-runs`` each time it runs."""
    script = tmp_path / "plugin.py"
    runs = tmp_path / "plugin-runs"
    script.write_text(
        textwrap.dedent(
            f"""
            import datetime, json, pathlib
            pathlib.Path({str(runs)!r}).open("a").write("ran\\n")
            expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(
                seconds={expires_in.total_seconds()})
            print(json.dumps({{
                "apiVersion": "client.authentication.k8s.io/v1",
                "kind": "ExecCredential",
                "status": {{
                    "token": pathlib.Path({str(tmp_path / "plugin-token")!r}).read_text().strip(),
                    "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }},
            }}))
            """
        )
    )
    (tmp_path / "plugin-token").write_text("plugin-t0ken")
    return exec_user(script), runs


def test_an_exec_plugin_is_run_again_once_its_credential_expires(
    tls_server: Callable[[Cluster], KubernetesServer], pki: Pki, tmp_path: Path
) -> None:
    mock = tls_server(Cluster(token="plugin-t0ken"))
    user, runs = exec_plugin(tmp_path, datetime.timedelta(seconds=30))  # within the skew
    with kubeconfig_backend(mock.url, pki.ca, tmp_path, user) as backend:
        first = plugin_runs(runs)
        assert backend.available().available
        assert backend.available().available
    assert plugin_runs(runs) == first + 2
    assert {r.headers["authorization"] for r in mock.requests} == {"Bearer plugin-t0ken"}


def test_an_exec_plugin_credential_is_reused_until_it_expires(
    tls_server: Callable[[Cluster], KubernetesServer], pki: Pki, tmp_path: Path
) -> None:
    mock = tls_server(Cluster(token="plugin-t0ken"))
    user, runs = exec_plugin(tmp_path, datetime.timedelta(hours=1))
    with kubeconfig_backend(mock.url, pki.ca, tmp_path, user) as backend:
        first = plugin_runs(runs)
        assert backend.available().available
        assert backend.available().available
    assert plugin_runs(runs) == first


def test_a_rejected_exec_plugin_credential_is_renewed_by_running_the_plugin_again(
    tls_server: Callable[[Cluster], KubernetesServer], pki: Pki, tmp_path: Path
) -> None:
    cluster = Cluster(token="plugin-t0ken")
    mock = tls_server(cluster)
    user, _ = exec_plugin(tmp_path, datetime.timedelta(hours=1))
    with kubeconfig_backend(mock.url, pki.ca, tmp_path, user) as backend:
        assert backend.available().available
        cluster.token = "rotated-t0ken"
        (tmp_path / "plugin-token").write_text("rotated-t0ken")
        assert backend.available().available
    assert [r.headers["authorization"] for r in mock.requests][-2:] == [
        "Bearer plugin-t0ken",
        "Bearer rotated-t0ken",
    ]


@pytest.fixture
def service_account(tmp_path: Path, pki: Pki) -> Path:
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("pod-t0ken")
    (directory / "ca.crt").write_bytes(pki.ca.read_bytes())
    (directory / "namespace").write_text("agents\n")
    return directory


def test_in_cluster_uses_the_service_account_and_rereads_a_rotated_token(
    tls_server: Callable[[Cluster], KubernetesServer],
    service_account: Path,
    router_session: requests.Session,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    cluster = Cluster(token="pod-t0ken", router_token="router-t0ken")
    mock = tls_server(cluster)
    backend = in_cluster_backend(mock, service_account, router_session, monkeypatch)
    with backend, activate_sandbox(POLICY, backend=backend, workspace=tmp_path) as sandbox:
        assert sandbox.exec("true").exit_code == 0
        (service_account / "token").write_text("rotated-t0ken")  # the kubelet rotated it
        cluster.token = "rotated-t0ken"
        sandbox.files.write("notes.txt", b"after rotation")
        assert sandbox.exec("true").exit_code == 0
    assert mock.count("POST", CLAIMS) == 1  # the pod's namespace, "agents"
    sent = {r.headers["authorization"] for r in api_requests(mock)}
    assert sent == {"Bearer pod-t0ken", "Bearer rotated-t0ken"}
    assert api_requests(mock)[-1].headers["authorization"] == "Bearer rotated-t0ken"


def test_in_cluster_outside_a_pod_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(PiShipError) as raised:
        KubernetesAgentSandboxBackend.in_cluster(
            router="https://router.example", template="pool", service_account=str(tmp_path)
        )
    assert raised.value.code == CONFIG_INVALID
    assert "service account" in str(raised.value)


def test_a_kubeconfig_that_skips_tls_verification_is_refused(tmp_path: Path) -> None:
    config = write_kubeconfig(tmp_path / "config", "https://k8s.example:6443", {"token": "t"})
    text = config.read_text().replace('"server":', '"insecure-skip-tls-verify": true, "server":')
    config.write_text(text)
    with pytest.raises(PiShipError) as raised:
        KubernetesAgentSandboxBackend.from_kubeconfig(
            config, router="https://router.example", template="pool"
        )
    assert raised.value.code == TLS_POLICY_VIOLATION


def test_a_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(PiShipError) as raised:
        KubernetesAgentSandboxBackend.from_kubeconfig(
            missing, router="https://router.example", template="pool"
        )
    assert raised.value.code == CONFIG_INVALID
    assert str(missing) in str(raised.value)


def test_the_kubeconfig_comes_from_the_environment_and_names_a_context(
    tls_server: Callable[[Cluster], KubernetesServer],
    pki: Pki,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    mock = tls_server(Cluster(token="ctx-t0ken"))
    config = write_kubeconfig(tmp_path / "config", mock.url, {"token": "ctx-t0ken"}, ca=pki.ca)
    document = json.loads(config.read_text())
    document["contexts"].append(
        {"name": "other", "context": {"cluster": "double", "user": "me", "namespace": "team-b"}}
    )
    config.write_text(json.dumps(document))
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{config}")
    with KubernetesAgentSandboxBackend.from_kubeconfig(
        context="other", router=mock.url, template="python-pool"
    ) as backend:
        assert backend.available().available
    assert mock.requests[0].path.startswith(
        "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/team-b/"
    )


def test_a_namespace_option_wins_over_the_context(
    tls_server: Callable[[Cluster], KubernetesServer], pki: Pki, tmp_path: Path
) -> None:
    mock = tls_server(Cluster(token="ctx-t0ken"))
    with kubeconfig_backend(
        mock.url, pki.ca, tmp_path, {"token": "ctx-t0ken"}, namespace="elsewhere"
    ) as backend:
        assert backend.available().available
    assert mock.requests[0].path.startswith(
        "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/elsewhere/"
    )


def test_without_the_kubernetes_package_the_extra_is_named(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    monkeypatch.setitem(sys.modules, "kubernetes.config", None)
    with pytest.raises(PiShipError) as raised:
        KubernetesAgentSandboxBackend.from_kubeconfig(
            tmp_path / "config", router="https://router.example", template="pool"
        )
    assert raised.value.code == CONFIG_INVALID
    assert "pip install 'piship-remote[kubernetes]'" in (raised.value.user_action or "")


def run_a_pool_map(backend: KubernetesAgentSandboxBackend, workspace: Path) -> list[str]:
    """Activation, a command and a file in each task of a ``SandboxPool.map``: the outputs."""

    def task(sandbox: Any, n: int) -> str:
        sandbox.files.write(f"item-{n}.txt", f"item {n}".encode())
        return str(sandbox.run(f"cat item-{n}.txt").stdout)

    with backend, SandboxPool(POLICY, backend=backend, workspace=workspace, size=2) as pool:
        results = pool.map(task, range(4))
    assert [r.outcome for r in results] == ["ok"] * 4, [r.error for r in results]
    return [str(r.value) for r in results]


def test_a_pool_maps_with_the_client_certificate_of_a_kubeconfig(
    tls_server: Callable[[Cluster], KubernetesServer],
    pki: Pki,
    router_session: requests.Session,
    tmp_path: Path,
) -> None:
    mock = tls_server(Cluster(client_subject=CLIENT_NAME))
    backend = kubeconfig_backend(
        mock.url, pki.ca, tmp_path, client_user(pki, False), session=router_session
    )
    assert run_a_pool_map(backend, tmp_path) == [f"item {n}" for n in range(4)]
    assert {s for p, s in mock.client_subjects if p.startswith("/apis/")} == {CLIENT_NAME}


def test_a_pool_maps_with_the_exec_plugin_of_a_kubeconfig(
    tls_server: Callable[[Cluster], KubernetesServer],
    pki: Pki,
    router_session: requests.Session,
    tmp_path: Path,
) -> None:
    mock = tls_server(Cluster(token="plugin-t0ken", router_token="router-t0ken"))
    user, _ = exec_plugin(tmp_path, datetime.timedelta(hours=1))
    backend = kubeconfig_backend(
        mock.url,
        pki.ca,
        tmp_path,
        user,
        session=router_session,
        router_credential=lambda: "router-t0ken",
    )
    assert run_a_pool_map(backend, tmp_path) == [f"item {n}" for n in range(4)]
    assert {r.headers["authorization"] for r in api_requests(mock)} == {"Bearer plugin-t0ken"}


def test_a_pool_maps_with_an_in_cluster_token_file(
    tls_server: Callable[[Cluster], KubernetesServer],
    service_account: Path,
    router_session: requests.Session,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    mock = tls_server(Cluster(token="pod-t0ken", router_token="router-t0ken"))
    backend = in_cluster_backend(mock, service_account, router_session, monkeypatch)
    assert run_a_pool_map(backend, tmp_path) == [f"item {n}" for n in range(4)]
    assert {r.headers["authorization"] for r in api_requests(mock)} == {"Bearer pod-t0ken"}
