"""The claim's own options: env through the environment filter, pod labels and annotations,
volume claim templates, how long a finished claim is kept, foreground deletion, and
what the claim's Sandbox says about itself."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
from piship_remote.model.policy import SandboxProfile
from piship_remote.testing import CLAIMS, Cluster, KubernetesServer
from piship_remote.testing.k8s_controller import NODE_NAME
from tests.support.seed import kubernetes

KubernetesFactory = Callable[..., KubernetesServer]

pytestmark = pytest.mark.timeout(20)

VOLUME = {
    "metadata": {"name": "scratch"},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}


def created_spec(
    mock: KubernetesServer, backend: KubernetesAgentSandboxBackend, profile: SandboxProfile
) -> dict[str, Any]:
    with backend:
        backend.prepare(profile).dispose()
    spec: dict[str, Any] = json.loads(mock.find("POST", CLAIMS)[0].body)["spec"]
    return spec


def test_claim_options_go_into_the_claim_spec(kubernetes_server: KubernetesFactory) -> None:
    mock = kubernetes_server()
    backend = kubernetes(
        mock.url,
        pod_labels={"team": "search"},
        pod_annotations={"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
        volume_claim_templates=[VOLUME],
        ttl_seconds_after_finished=60,
    )
    spec = created_spec(mock, backend, SandboxProfile(workspace="/ws"))
    assert spec["additionalPodMetadata"] == {
        "labels": {"team": "search"},
        "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"},
    }
    assert spec["volumeClaimTemplates"] == [VOLUME]
    assert spec["lifecycle"]["ttlSecondsAfterFinished"] == 60
    assert spec["lifecycle"]["shutdownPolicy"] == "Delete"
    assert "shutdownTime" in spec["lifecycle"]
    assert "env" not in spec


def test_claim_env_passes_the_environment_filter(kubernetes_server: KubernetesFactory) -> None:
    mock = kubernetes_server()
    backend = kubernetes(
        mock.url,
        env={"MODE": "ci", "GITHUB_TOKEN": "ghp_" + "a" * 36, "UNLISTED": "x", "PATH": "/bin"},
    )
    profile = SandboxProfile(workspace="/ws", environment_allow=("MODE", "GITHUB_TOKEN", "PATH"))
    spec = created_spec(mock, backend, profile)
    assert spec["env"] == [{"name": "MODE", "value": "ci"}]


def test_claim_env_holding_the_backend_credential_is_not_sent(
    kubernetes_server: KubernetesFactory,
) -> None:
    mock = kubernetes_server()
    backend = kubernetes(
        mock.url, credential=lambda: "s3cret-value", env={"MODE": "ci", "COPY": "s3cret-value"}
    )
    assert backend.available().available  # the credential was read once, so it is known
    spec = created_spec(
        mock, backend, SandboxProfile(workspace="/ws", environment_allow=("MODE", "COPY"))
    )
    assert spec["env"] == [{"name": "MODE", "value": "ci"}]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("ttl_seconds_after_finished", -1),
        ("env", {"A": 1}),
        ("volume_claim_templates", [{"spec": {}}]),
    ],
)
def test_malformed_claim_options_are_refused(option: str, value: Any) -> None:
    with pytest.raises(ValueError):
        kubernetes("http://127.0.0.1:1", **{option: value})


def test_foreground_deletion_asks_for_foreground_propagation(
    kubernetes_server: KubernetesFactory,
) -> None:
    mock = kubernetes_server()
    with kubernetes(mock.url, foreground_deletion=True) as backend:
        backend.prepare(SandboxProfile(workspace="/ws")).dispose()
    (deleted,) = [r for r in mock.requests if r.method == "DELETE"]
    assert json.loads(deleted.body) == {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "propagationPolicy": "Foreground",
    }
    assert mock.live_claims == []


def test_a_claim_is_deleted_with_the_default_propagation_unless_asked(
    kubernetes_server: KubernetesFactory,
) -> None:
    mock = kubernetes_server()
    with kubernetes(mock.url) as backend:
        backend.prepare(SandboxProfile(workspace="/ws")).dispose()
    (deleted,) = [r for r in mock.requests if r.method == "DELETE"]
    assert deleted.body == b""


def test_the_claim_carries_its_sandbox_service_name_and_node(
    kubernetes_server: KubernetesFactory,
) -> None:
    mock = kubernetes_server()
    with kubernetes(mock.url) as backend:
        instance = backend.prepare(SandboxProfile(workspace="/ws"))
        claim = instance.claim()
        instance.dispose()
    assert claim.sandbox == f"pool-{claim.name}"
    assert claim.service_fqdn == f"pool-{claim.name}.agents.svc.cluster.local"
    assert claim.node_name == NODE_NAME
    assert claim.uid


def test_a_sandbox_without_a_service_has_no_service_name(
    kubernetes_server: KubernetesFactory,
) -> None:
    mock = kubernetes_server(cluster=Cluster(services=False, pod_ip="10.0.0.7"))
    with kubernetes(mock.url) as backend:
        instance = backend.prepare(SandboxProfile(workspace="/ws"))
        claim = instance.claim()
        instance.dispose()
    assert claim.service_fqdn is None
    assert (claim.pod_ip, claim.node_name) == ("10.0.0.7", NODE_NAME)
