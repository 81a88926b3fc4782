"""The fake cluster's access rules, driven with plain requests: the router's own token, a
scoped-token router, access reviews, warm pools, and TLS with a client certificate."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from piship_remote.testing import Cluster, KubernetesServer

KubernetesFactory = Callable[..., KubernetesServer]
TIMEOUT = 5.0
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
POOLS = "/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/agents/sandboxwarmpools"

pytestmark = pytest.mark.timeout(20)


def review(mock: KubernetesServer, verb: str, **kwargs: Any) -> requests.Response:
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "resource": "sandboxclaims"}},
    }
    return requests.post(mock.url + REVIEWS, json=body, timeout=TIMEOUT, **kwargs)


def test_access_reviews_answer_what_the_cluster_denies(
    kubernetes_server: KubernetesFactory,
) -> None:
    mock = kubernetes_server(cluster=Cluster(denied={"delete sandboxclaims"}))
    assert review(mock, "create").json()["status"] == {"allowed": True}
    denied = review(mock, "delete")
    assert denied.status_code == 201
    assert denied.json()["status"]["allowed"] is False


def test_a_warm_pool_is_read_with_its_ready_replicas(kubernetes_server: KubernetesFactory) -> None:
    mock = kubernetes_server(cluster=Cluster(warm_pools={"python-pool"}, pool_ready_replicas=0))
    pool = requests.get(f"{mock.url}{POOLS}/python-pool", timeout=TIMEOUT)
    assert pool.json()["status"] == {"replicas": 1, "readyReplicas": 0}
    missing = requests.get(f"{mock.url}{POOLS}/other", timeout=TIMEOUT)
    assert missing.status_code == 404 and missing.json()["reason"] == "NotFound"


def test_the_router_checks_its_own_token_and_the_api_the_cluster_token(
    kubernetes_server: KubernetesFactory,
) -> None:
    mock = kubernetes_server(cluster=Cluster(token="api", router_token="router"))
    assert requests.get(mock.url + "/", timeout=TIMEOUT).json() == {
        "detail": "Missing or invalid Authorization header."
    }
    wrong = requests.get(mock.url + "/", headers={"Authorization": "Bearer api"}, timeout=TIMEOUT)
    assert (wrong.status_code, wrong.json()) == (401, {"detail": "Invalid token."})
    right = requests.get(
        mock.url + "/", headers={"Authorization": "Bearer router"}, timeout=TIMEOUT
    )
    assert right.json() == {"detail": "X-Sandbox-ID header is required."}
    assert review(mock, "get", headers={"Authorization": "Bearer router"}).status_code == 401
    assert review(mock, "get", headers={"Authorization": "Bearer api"}).status_code == 201


@pytest.mark.parametrize("header", ["X-Sandbox-Pod-IP", "X-Sandbox-UID"])
def test_a_scoped_router_refuses_headers_a_token_cannot_vouch_for(
    kubernetes_server: KubernetesFactory, header: str
) -> None:
    mock = kubernetes_server(cluster=Cluster(scoped_router=True))
    refused = requests.get(
        mock.url + "/", headers={"X-Sandbox-ID": "pool-x", header: "10.0.0.1"}, timeout=TIMEOUT
    )
    assert refused.status_code == 403
    assert header in refused.json()["detail"]


def test_over_tls_the_api_wants_the_named_client_certificate(
    kubernetes_server: KubernetesFactory, tmp_path: Path
) -> None:
    pytest.importorskip("cryptography")
    from tests.support.k8s_tls import CLIENT_NAME, Pki

    pki = Pki.create(tmp_path)
    mock = kubernetes_server(cluster=Cluster(client_subject=CLIENT_NAME), tls=pki.server_context())
    assert mock.url.startswith("https://127.0.0.1:")
    anonymous = review(mock, "get", verify=str(pki.ca))
    assert anonymous.status_code == 401
    client = (str(pki.client_cert), str(pki.client_key))
    assert review(mock, "get", verify=str(pki.ca), cert=client).status_code == 201
    assert mock.client_subjects == [(REVIEWS, None), (REVIEWS, CLIENT_NAME)]
