"""The official agent-sandbox client (``k8s-agent-sandbox`` 1.0.8 with its ``grpc`` extra) on
its sandboxd path against ``KubernetesServer(runtime="sandboxd")``, and our backend through
the same steps: both must record the same outcomes.

The client's own way to sandboxd outside the cluster is ``kubectl port-forward pod/…``,
which speaks SPDY (or SPDY over WebSocket) to the API server; the double serves the
``v4.channel.k8s.io`` WebSocket our backend speaks, so the client takes its closest
supported route instead: ``SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")``,
the pod IP (``127.0.0.1`` here) and the ports where the double's port-forward lands for that
pod. It still creates and watches its claim on the double's API server, reads the Sandbox
for the pod IP, runs commands over gRPC ``Execute`` and moves files over the REST surface.
Our backend reaches the same sandboxd through its own port-forward to the pod.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.optional_peers import install_hint

pytest.importorskip("k8s_agent_sandbox", reason=install_hint("interop"))
pytest.importorskip("kubernetes", reason=install_hint("interop"))
pytest.importorskip("grpc", reason=install_hint("sandboxd"))

from k8s_agent_sandbox import SandboxClient
from k8s_agent_sandbox.models import SandboxdInClusterConnectionConfig
from kubernetes import client as kubernetes_client

from piship_remote import Sandbox, activate_sandbox
from piship_remote.testing import Cluster, KubernetesServer
from tests.support.seed import kubernetes

pytestmark = [pytest.mark.interop, pytest.mark.timeout(60)]

NAMESPACE = "agents"
POOL = "python-pool"
Outcomes = list[tuple[str, Any]]


@pytest.fixture
def fake() -> Iterator[KubernetesServer]:
    with KubernetesServer(cluster=Cluster(pod_ip="127.0.0.1"), runtime="sandboxd") as server:
        yield server


def official_steps(fake: KubernetesServer) -> Outcomes:
    """The steps through the official client's sandboxd path."""
    configuration = kubernetes_client.Configuration()
    configuration.host = fake.url
    api = kubernetes_client.ApiClient(configuration)
    route = SandboxdInClusterConnectionConfig(mode="in-cluster-pod-ip")
    client = SandboxClient(connection_config=route, api_client=api)
    try:
        sandbox = client.create_sandbox(POOL, namespace=NAMESPACE, sandbox_ready_timeout=10)
        _, route.rest_port, route.grpc_port = fake.sandboxd_address(sandbox.claim_name)
        files, commands = sandbox.files, sandbox.commands
        files.write("notes/hello.txt", b"hello sandboxd\n")
        outcomes: Outcomes = [("read", files.read("notes/hello.txt"))]
        ran = commands.run("cat notes/hello.txt; echo oops >&2; exit 3")
        outcomes.append(("run", (ran.exit_code, ran.stdout, ran.stderr)))
        ran = commands.run("pwd", cwd="notes")
        outcomes.append(("cwd", ran.stdout.strip().rsplit("/", 1)[-1]))
        outcomes.append(("list", sorted((e.name, e.type) for e in files.list("notes"))))
        outcomes.append(("exists", (files.exists("notes/hello.txt"), files.exists("nope"))))
        files.delete("notes", recursive=True)
        outcomes.append(("gone", files.exists("notes/hello.txt")))
        return outcomes
    finally:
        client.delete_all()
        api.close()


def our_steps(fake: KubernetesServer, workspace: Path) -> Outcomes:
    """The same steps through our backend (the runtime read from the claim's template)."""
    sandbox: Sandbox = activate_sandbox(
        {"required": True, "network": {"mode": "allow"}},
        backend=kubernetes(fake.url),
        workspace=workspace,
        env={},
    )
    with sandbox:
        files = sandbox.files
        files.write("notes/hello.txt", b"hello sandboxd\n")
        outcomes: Outcomes = [("read", files.read("notes/hello.txt"))]
        ran = sandbox.run("cat notes/hello.txt; echo oops >&2; exit 3")
        outcomes.append(("run", (ran.exit_code, ran.stdout, ran.stderr)))
        (workspace / "notes").mkdir(exist_ok=True)
        ran = sandbox.run("pwd", cwd=workspace / "notes")
        outcomes.append(("cwd", ran.stdout.strip().rsplit("/", 1)[-1]))
        kinds = {"dir": "directory"}
        outcomes.append(
            ("list", sorted((i.name, kinds.get(i.type, i.type)) for i in files.list("notes")))
        )
        outcomes.append(("exists", (files.exists("notes/hello.txt"), files.exists("nope"))))
        files.remove("notes")
        outcomes.append(("gone", files.exists("notes/hello.txt")))
        return outcomes


EXPECTED: Outcomes = [
    ("read", b"hello sandboxd\n"),
    ("run", (3, "hello sandboxd\n", "oops\n")),
    ("cwd", "notes"),
    ("list", [("hello.txt", "file")]),
    ("exists", (True, False)),
    ("gone", False),
]


def test_the_official_client_runs_its_sandboxd_steps_against_the_double(
    fake: KubernetesServer,
) -> None:
    assert official_steps(fake) == EXPECTED
    assert any(r.path.startswith("/apis/") and "watch=true" in r.path for r in fake.requests)
    assert fake.live_claims == []


def test_our_backend_records_the_same_outcomes_through_its_port_forward(
    fake: KubernetesServer, workspace: Path
) -> None:
    assert our_steps(fake, workspace) == EXPECTED
    assert any(r.path.endswith("/portforward?ports=9090") for r in fake.requests)
    assert any(r.path.endswith("/portforward?ports=8080") for r in fake.requests)
    assert fake.live_claims == []
