"""The command line on Kubernetes as its users run it: a kubeconfig and its context, the
router's own token from the environment, and ``doctor``'s checks before any claim."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from piship_remote import cli
from piship_remote.testing import CLAIMS, KubernetesServer
from piship_remote.testing.kubernetes_server import Cluster
from tests.support.kubeconfig import write_kubeconfig

KubernetesFactory = Callable[..., KubernetesServer]
K8S_TOKEN = "k8s-cli-bearer-0123456789abcdef"
ROUTER_TOKEN = "router-cli-0123456789abcdef"

pytestmark = pytest.mark.timeout(30)


def use_kubernetes(cli_environ: pytest.MonkeyPatch, mock: KubernetesServer) -> None:
    cli_environ.setenv("PISHIP_BACKEND", "kubernetes")
    cli_environ.setenv("PISHIP_K8S_API", mock.url)
    cli_environ.setenv("PISHIP_K8S_ROUTER", mock.url)
    cli_environ.setenv("PISHIP_K8S_TEMPLATE", "python-pool")
    cli_environ.setenv("PISHIP_K8S_NAMESPACE", "agents")
    cli_environ.setenv("PISHIP_K8S_TOKEN", K8S_TOKEN)


def doctor(workspace: Path, *extra: str) -> int:
    return cli.main(["doctor", "--network", "allow", "--workspace", str(workspace), *extra])


def test_doctor_names_a_missing_rbac_verb_before_any_claim_exists(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = kubernetes_server(cluster=Cluster(token=K8S_TOKEN, denied={"delete sandboxclaims"}))
    use_kubernetes(cli_environ, mock)
    assert doctor(workspace) != 0
    err = capsys.readouterr().err
    assert "ok: may create sandboxclaims in namespace agents" in err
    assert "fail: may not delete sandboxclaims in namespace agents (fix: grant it" in err
    assert mock.count("POST", CLAIMS) == 0


def test_doctor_json_lists_the_checks_and_a_missing_warm_pool(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = kubernetes_server(cluster=Cluster(token=K8S_TOKEN, warm_pools={"other-pool"}))
    use_kubernetes(cli_environ, mock)
    assert doctor(workspace, "--json") != 0
    answer = json.loads(capsys.readouterr().out)
    failed = [c for c in answer["checks"] if c["status"] == "fail"]
    assert [c["check"] for c in failed] == [
        "the warm pool python-pool in namespace agents does not exist"
    ]
    assert "SandboxWarmPool" in failed[0]["fix"]
    assert answer["error"]["code"] == "SANDBOX_UNAVAILABLE"
    assert mock.count("POST", CLAIMS) == 0


def test_doctor_warns_of_a_warm_pool_without_ready_sandboxes_and_goes_on(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = kubernetes_server(cluster=Cluster(token=K8S_TOKEN, pool_ready_replicas=0))
    use_kubernetes(cli_environ, mock)
    assert doctor(workspace) == 0
    output = capsys.readouterr()
    assert "warn: the warm pool python-pool in namespace agents has no ready sandbox" in output.err
    assert output.out.startswith("enforced by kubernetes-agent-sandbox")


def test_doctor_takes_the_router_token_from_the_environment(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = kubernetes_server(cluster=Cluster(token=K8S_TOKEN, router_token=ROUTER_TOKEN))
    use_kubernetes(cli_environ, mock)
    cli_environ.setenv("PISHIP_K8S_ROUTER_TOKEN", ROUTER_TOKEN)
    assert doctor(workspace) == 0
    assert f"ok: the sandbox router at {mock.url} accepts the token" in capsys.readouterr().err
    router = [r for r in mock.requests if not r.path.startswith("/apis/")]
    assert {r.headers["authorization"] for r in router} == {f"Bearer {ROUTER_TOKEN}"}


def test_doctor_says_when_the_router_refuses_the_token(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = kubernetes_server(cluster=Cluster(token=K8S_TOKEN, router_token=ROUTER_TOKEN))
    use_kubernetes(cli_environ, mock)
    assert doctor(workspace) != 0
    err = capsys.readouterr().err
    assert "fail: the sandbox router refused the token" in err
    assert "PISHIP_K8S_ROUTER_TOKEN" in err
    assert mock.count("POST", CLAIMS) == 0


@pytest.mark.skipif(
    importlib.util.find_spec("kubernetes") is None, reason="needs the kubernetes extra"
)
def test_run_reads_the_cluster_from_a_kubeconfig_context(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    tmp_path: Path,
    cli_environ: pytest.MonkeyPatch,
) -> None:
    mock = kubernetes_server(cluster=Cluster(token=K8S_TOKEN, router_token=ROUTER_TOKEN))
    config = write_kubeconfig(
        tmp_path / "config", mock.url, {"token": K8S_TOKEN}, namespace="agents", context="dev"
    )
    cli_environ.setenv("PISHIP_BACKEND", "kubernetes")
    cli_environ.setenv("PISHIP_K8S_ROUTER", mock.url)
    cli_environ.setenv("PISHIP_K8S_TEMPLATE", "python-pool")
    cli_environ.setenv("MY_ROUTER_TOKEN", ROUTER_TOKEN)
    cli_environ.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    status = cli.main(
        [
            "run",
            "--network",
            "allow",
            "--kubeconfig",
            str(config),
            "--context",
            "dev",
            "--router-token",
            "MY_ROUTER_TOKEN",
            "--workspace",
            str(workspace),
            "--",
            "true",
        ]
    )
    assert status == 0
    assert mock.count("POST", CLAIMS) == 1  # the context's namespace
    api = {r.headers["authorization"] for r in mock.requests if r.path.startswith("/apis/")}
    assert api == {f"Bearer {K8S_TOKEN}"}
    assert mock.live_claims == []


@pytest.mark.skipif(
    importlib.util.find_spec("websocket") is None, reason="needs the kubernetes extra"
)
def test_run_reaches_the_router_by_port_forward_to_a_named_service(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
) -> None:
    cluster = Cluster(token=K8S_TOKEN, router_service="router", router_namespace="edge")
    mock = kubernetes_server(cluster=cluster)
    use_kubernetes(cli_environ, mock)
    status = cli.main(
        [
            "run",
            "--network",
            "allow",
            "--router",
            "port-forward",
            "--router-service",
            "router",
            "--router-namespace",
            "edge",
            "--workspace",
            str(workspace),
            "--",
            "true",
        ]
    )
    assert status == 0
    forward = "/api/v1/namespaces/edge/pods/sandbox-router-6d8f9-x7k2p/portforward?ports=8080"
    assert mock.count("GET", forward) >= 1
    assert mock.count("POST", "/execute") >= 1


@pytest.mark.skipif(
    importlib.util.find_spec("websocket") is None, reason="needs the kubernetes extra"
)
def test_doctor_says_when_the_router_cannot_be_port_forwarded(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    mock = kubernetes_server(cluster=Cluster(token=K8S_TOKEN, router_pods=[]))
    use_kubernetes(cli_environ, mock)
    assert doctor(workspace, "--router", "port-forward") != 0
    err = capsys.readouterr().err
    assert "fail: the sandbox router cannot be port-forwarded" in err
    assert "no ready pod to port-forward to" in err
    assert mock.count("POST", CLAIMS) == 0


@pytest.mark.skipif(
    importlib.util.find_spec("websocket") is None, reason="needs the kubernetes extra"
)
def test_doctor_names_a_missing_port_forward_permission_in_the_router_namespace(
    kubernetes_server: KubernetesFactory,
    workspace: Path,
    cli_environ: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = Cluster(token=K8S_TOKEN, denied={"create pods/portforward"})
    mock = kubernetes_server(cluster=cluster)
    use_kubernetes(cli_environ, mock)
    assert doctor(workspace, "--router", "port-forward") != 0
    err = capsys.readouterr().err
    assert "ok: may get endpoints in namespace agent-sandbox-system" in err
    assert "fail: may not create pods/portforward in namespace agent-sandbox-system" in err
    assert mock.count("POST", CLAIMS) == 0
