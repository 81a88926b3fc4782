"""The official agent-sandbox client (``k8s-agent-sandbox`` 1.0.8 on ``kubernetes`` 37.0.2)
against the fake cluster, and our backend through the same scenarios.

The client gets a ``kubernetes.client.ApiClient`` whose host is the fake's loopback URL
(no kubeconfig, no in-cluster config) and a direct connection to the fake's router.
Passing here means the fake serves the calls the client really makes: the claim POST,
the ready-wait watch, the Sandbox GETs for status and pod IP, the router's
``/execute`` and file endpoints, the claim list, the re-attach watch from version 0,
and the DELETE.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import requests

from tests.support.optional_peers import install_hint

pytest.importorskip("k8s_agent_sandbox", reason=install_hint("interop"))
pytest.importorskip("kubernetes", reason=install_hint("interop"))

from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.exceptions import (
    SandboxRequestError,
    SandboxWarmPoolNotFoundError,
)
from k8s_agent_sandbox.models import SandboxDirectConnectionConfig
from kubernetes import client as kubernetes_client

from piship_remote.backends.base import BackendResult, ExecRequest
from piship_remote.backends.kubernetes.backend import (
    KubernetesAgentSandboxBackend,
    KubernetesInstance,
)
from piship_remote.model.policy import SandboxProfile
from piship_remote.testing import CLAIMS, Cluster, KubernetesServer
from piship_remote.wire.agent_sandbox import CLAIMS as CLAIM_RESOURCE
from piship_remote.wire.agent_sandbox import SANDBOXES as SANDBOX_RESOURCE

pytestmark = [pytest.mark.interop, pytest.mark.timeout(30)]

NAMESPACE = "agents"
POOL = "python-pool"
SANDBOXES = f"/apis/agents.x-k8s.io/v1beta1/namespaces/{NAMESPACE}/sandboxes"
PROFILE = SandboxProfile(workspace="/ws", network="allow")

Execute = Callable[[str], Mapping[str, Any]]


def echo(command: str) -> Mapping[str, Any]:
    """The runtime's answer: ``echo <word>`` prints the word, ``fail`` exits 3."""
    if "fail" in command:
        return {"stdout": "", "stderr": "failed\n", "exit_code": 3}
    word = re.search(r"echo (\w+)", command)
    return {"stdout": f"{word.group(1) if word else ''}\n", "stderr": "", "exit_code": 0}


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


@pytest.fixture
def fake(cluster: Cluster) -> Iterator[KubernetesServer]:
    with KubernetesServer(echo, cluster) as server:
        yield server


@pytest.fixture
def official(fake: KubernetesServer) -> Iterator[SandboxClient[Any]]:
    """The official client, pointed at the fake's API server and router on loopback."""
    configuration = kubernetes_client.Configuration()
    configuration.host = fake.url
    api = kubernetes_client.ApiClient(configuration)
    sandboxes = SandboxClient(
        connection_config=SandboxDirectConnectionConfig(api_url=fake.url), api_client=api
    )
    yield sandboxes
    sandboxes.delete_all()
    api.close()


@pytest.fixture
def ours(fake: KubernetesServer) -> Iterator[KubernetesInstance]:
    """Our backend, prepared (one ready claim) on the same fake cluster."""
    backend = KubernetesAgentSandboxBackend(
        endpoint=fake.url, router=fake.url, template=POOL, namespace=NAMESPACE, poll_interval=0.01
    )
    instance = backend.prepare(PROFILE)
    yield instance
    instance.dispose()


def only_claim(fake: KubernetesServer) -> dict[str, Any]:
    [claim] = fake.store.objects(CLAIM_RESOURCE, NAMESPACE)
    return claim


def run_ours(instance: KubernetesInstance, command: str) -> tuple[BackendResult, str, str]:
    out: list[bytes] = []
    err: list[bytes] = []
    result = instance.exec(
        ExecRequest(command, "/ws", ".", {}), on_stdout=out.append, on_stderr=err.append
    )
    return result, b"".join(out).decode(), b"".join(err).decode()


def router_headers(fake: KubernetesServer) -> dict[str, str]:
    """The headers our backend addresses the claim's sandbox with."""
    sandbox = only_claim(fake)["status"]["sandbox"]["name"]
    return {"X-Sandbox-ID": sandbox, "X-Sandbox-Namespace": NAMESPACE, "X-Sandbox-Port": "8888"}


# ---------------------------------------------------------------- the official client


def test_official_create_waits_on_one_watch_and_binds_the_pool_sandbox(
    official: SandboxClient[Any], fake: KubernetesServer
) -> None:
    sandbox = official.create_sandbox(POOL, namespace=NAMESPACE, sandbox_ready_timeout=10)
    claim = only_claim(fake)
    assert sandbox.claim_name == claim["metadata"]["name"]
    assert (
        sandbox.sandbox_id
        == claim["status"]["sandbox"]["name"]
        == f"pool-{claim['metadata']['name']}"
    )
    watches = [r for r in fake.find("GET") if "watch=true" in r.path]
    assert len(watches) == 1
    assert "resourceVersion=1&" in watches[0].path


def test_official_command_reaches_the_runtime_with_the_sandbox_pod_ip(
    official: SandboxClient[Any], fake: KubernetesServer
) -> None:
    sandbox = official.create_sandbox(POOL, namespace=NAMESPACE, sandbox_ready_timeout=10)
    result = sandbox.commands.run("echo hello")
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "", 0)
    assert sandbox.commands.run("fail now").exit_code == 3
    pod_ip = fake.store.get(SANDBOX_RESOURCE, NAMESPACE, sandbox.sandbox_id)["status"]["podIPs"][0]
    execute = fake.find("POST", "/execute")[0]
    assert execute.headers["x-sandbox-pod-ip"] == pod_ip == sandbox.get_pod_ip()
    assert execute.headers["x-sandbox-id"] == sandbox.sandbox_id


def test_official_files_write_read_list_and_exists(
    official: SandboxClient[Any], fake: KubernetesServer
) -> None:
    sandbox = official.create_sandbox(POOL, namespace=NAMESPACE, sandbox_ready_timeout=10)
    sandbox.files.write("/notes/a.txt", b"alpha")
    sandbox.files.write("notes/b.txt", "beta")
    assert fake.files(sandbox.claim_name) == {"notes/a.txt": b"alpha", "notes/b.txt": b"beta"}
    assert sandbox.files.read("notes/a.txt") == b"alpha"
    assert sorted((e.name, e.size, e.type) for e in sandbox.files.list("notes")) == [
        ("a.txt", 5, "file"),
        ("b.txt", 4, "file"),
    ]
    assert [(e.name, e.type) for e in sandbox.files.list(".")] == [("notes", "directory")]
    assert sandbox.files.exists("notes/a.txt") is True
    assert sandbox.files.exists("notes/missing.txt") is False
    with pytest.raises(SandboxRequestError) as missing:
        sandbox.files.read("notes/missing.txt")
    assert missing.value.status_code == 404


def test_official_status_list_reattach_and_terminate(
    official: SandboxClient[Any], fake: KubernetesServer
) -> None:
    sandbox = official.create_sandbox(POOL, namespace=NAMESPACE, sandbox_ready_timeout=10)
    name = sandbox.claim_name
    assert sandbox.status() == ("SandboxReady", "Pod is Ready")
    assert official.list_all_sandboxes(NAMESPACE) == [name]
    again = official.get_sandbox(name, namespace=NAMESPACE)
    assert again.sandbox_id == sandbox.sandbox_id
    sandbox.terminate()
    assert fake.live_claims == []
    assert official.list_all_sandboxes(NAMESPACE) == []
    assert fake.count("GET", f"{SANDBOXES}/{again.sandbox_id}") >= 1
    assert again.status() == ("SandboxNotFound", "Sandbox object not found in Kubernetes.")


def test_official_missing_pool_fails_fast_and_rolls_back_by_uid(
    official: SandboxClient[Any], fake: KubernetesServer, cluster: Cluster
) -> None:
    cluster.warm_pools = {"another-pool"}
    with pytest.raises(SandboxWarmPoolNotFoundError):
        official.create_sandbox(POOL, namespace=NAMESPACE, sandbox_ready_timeout=10)
    [rollback] = fake.find("DELETE")
    created = fake.find("POST", CLAIMS)[0]
    assert rollback.path == f"{CLAIMS}/{created.json()['metadata']['name']}"
    assert set(rollback.json()["preconditions"]) == {"uid"}
    assert fake.live_claims == []


def test_official_claim_expires_on_the_cluster_clock(
    official: SandboxClient[Any], fake: KubernetesServer, cluster: Cluster
) -> None:
    clock = [time.time()]  # the client writes shutdownTime from the real clock
    cluster.clock = lambda: clock[0]
    sandbox = official.create_sandbox(
        POOL, namespace=NAMESPACE, sandbox_ready_timeout=10, shutdown_after_seconds=60
    )
    lifecycle = only_claim(fake)["spec"]["lifecycle"]
    assert lifecycle["shutdownPolicy"] == "Delete"
    clock[0] = 4_000_000_000.0  # long past any shutdownTime the client wrote
    fake.reconcile()
    assert only_claim(fake)["status"]["conditions"][0]["reason"] == "ClaimExpired"
    fake.reconcile()
    assert fake.live_claims == []
    with pytest.raises(SandboxRequestError) as unreachable:
        sandbox.commands.run("echo late")
    assert unreachable.value.status_code == 502


# ---------------------------------------------------------------- our backend, same scenarios


def test_ours_command_runs_in_the_claims_sandbox(
    ours: KubernetesInstance, fake: KubernetesServer
) -> None:
    assert run_ours(ours, "echo hello") == (BackendResult(0), "hello\n", "")
    assert (
        fake.find("POST", "/execute")[-1].headers["x-sandbox-id"]
        == router_headers(fake)["X-Sandbox-ID"]
    )
    result, _, stderr = run_ours(ours, "fail now")
    assert (result, stderr) == (BackendResult(3), "failed\n")


def test_ours_files_through_the_router_api(
    ours: KubernetesInstance, fake: KubernetesServer
) -> None:
    headers = router_headers(fake)
    upload = requests.post(
        fake.url + "/upload", files={"file": ("notes/a.txt", b"alpha")}, headers=headers, timeout=5
    )
    assert upload.status_code == 200
    claim = only_claim(fake)["metadata"]["name"]
    assert fake.files(claim) == {"notes/a.txt": b"alpha"}
    read = requests.get(fake.url + "/download/notes%2Fa.txt", headers=headers, timeout=5)
    assert read.content == b"alpha"
    listed = requests.get(fake.url + "/list/notes", headers=headers, timeout=5).json()
    assert [(e["name"], e["size"], e["type"]) for e in listed] == [("a.txt", 5, "file")]
    exists = requests.get(fake.url + "/exists/notes%2Fa.txt", headers=headers, timeout=5)
    assert exists.json() == {"path": "notes/a.txt", "exists": True}


def test_ours_status_list_and_delete(ours: KubernetesInstance, fake: KubernetesServer) -> None:
    claim = only_claim(fake)
    assert claim["status"]["conditions"][0]["status"] == "True"
    assert fake.live_claims == [claim["metadata"]["name"]]
    ours.dispose()
    assert fake.live_claims == []
    assert fake.store.objects(SANDBOX_RESOURCE, NAMESPACE) == []


def test_ours_reaches_a_sandbox_without_a_service_by_its_pod_ip(
    fake: KubernetesServer, cluster: Cluster
) -> None:
    cluster.services = False
    backend = KubernetesAgentSandboxBackend(
        endpoint=fake.url, router=fake.url, template=POOL, namespace=NAMESPACE, poll_interval=0.01
    )
    instance = backend.prepare(PROFILE)
    try:
        assert run_ours(instance, "echo hello")[0] == BackendResult(0)
    finally:
        instance.dispose()
