"""The claim's own options: env through the environment filter, pod labels and annotations,
volume claim templates, and how long a finished claim is kept."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from seed_support import kubernetes

from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
from piship_remote.model.policy import SandboxProfile
from piship_remote.testing import CLAIMS, KubernetesServer

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
