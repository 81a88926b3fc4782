"""Pins the fake cluster's real-cluster behaviour: API-server state and watch, the
controller, the router's answers and the runtime's, driven with plain requests."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from piship_remote.testing import CLAIMS, Cluster, KubernetesServer
from piship_remote.transport.deadline import Deadline

pytestmark = pytest.mark.timeout(20)

TIMEOUT = 5.0
SANDBOXES = "/apis/agents.x-k8s.io/v1beta1/namespaces/agents/sandboxes"

Factory = Callable[..., KubernetesServer]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="piship-test-client")
    yield executor
    executor.shutdown(wait=False, cancel_futures=True)


def claim(name: str = "c1", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "extensions.agents.x-k8s.io/v1beta1",
        "kind": "SandboxClaim",
        "metadata": {"name": name, "labels": {"team": "a"}},
        "spec": {"warmPoolRef": {"name": "python-pool"}, **spec},
    }


def create(mock: KubernetesServer, name: str = "c1", **spec: Any) -> requests.Response:
    return requests.post(mock.url + CLAIMS, json=claim(name, **spec), timeout=TIMEOUT)


def get(mock: KubernetesServer, path: str) -> requests.Response:
    return requests.get(mock.url + path, timeout=TIMEOUT)


def ready(mock: KubernetesServer, name: str = "c1") -> dict[str, Any]:
    create(mock, name)
    get(mock, f"{CLAIMS}/{name}")
    body: dict[str, Any] = get(mock, f"{CLAIMS}/{name}").json()
    return body


def router(mock: KubernetesServer, path: str, sandbox: str | None = "pool-c1", **kw: Any) -> Any:
    headers = {"X-Sandbox-Namespace": "agents", **kw.pop("headers", {})}
    if sandbox is not None:
        headers["X-Sandbox-ID"] = sandbox
    method = kw.pop("method", "GET")
    return requests.request(method, mock.url + path, headers=headers, timeout=TIMEOUT, **kw)


def watch(mock: KubernetesServer, query: str) -> list[dict[str, Any]]:
    response = get(mock, f"{CLAIMS}?{query}&watch=true")
    assert response.status_code == 200
    return [json.loads(line) for line in response.text.splitlines()]


# ---------------------------------------------------------------- API server state


def test_create_sets_server_fields_and_drops_status(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    body = {**claim(), "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    created = requests.post(mock.url + CLAIMS, data=json.dumps(body), timeout=TIMEOUT).json()
    metadata = created["metadata"]
    assert {"uid", "resourceVersion", "creationTimestamp"} <= set(metadata)
    assert metadata["generation"] == 1 and metadata["namespace"] == "agents"
    assert metadata["creationTimestamp"].endswith("Z")
    assert "status" not in created


def test_a_taken_name_is_409_already_exists_as_a_status(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    create(mock)
    again = create(mock)
    assert again.status_code == 409
    assert again.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'sandboxclaims.extensions.agents.x-k8s.io "c1" already exists',
        "reason": "AlreadyExists",
        "details": {"name": "c1", "group": "extensions.agents.x-k8s.io", "kind": "sandboxclaims"},
        "code": 409,
    }


def test_a_missing_claim_is_404_not_found_for_get_patch_and_delete(
    kubernetes_server: Factory,
) -> None:
    mock = kubernetes_server()
    url = f"{mock.url}{CLAIMS}/nope"
    answers = [
        requests.get(url, timeout=TIMEOUT),
        requests.patch(url, json={}, timeout=TIMEOUT),
        requests.delete(url, timeout=TIMEOUT),
    ]
    assert {(a.status_code, a.json()["reason"]) for a in answers} == {(404, "NotFound")}
    assert answers[0].json()["message"] == (
        'sandboxclaims.extensions.agents.x-k8s.io "nope" not found'
    )


def test_a_claim_without_a_warm_pool_is_422_invalid(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    body = {"metadata": {"name": "c1"}, "spec": {}}
    answer = requests.post(mock.url + CLAIMS, json=body, timeout=TIMEOUT)
    assert (answer.status_code, answer.json()["reason"]) == (422, "Invalid")


def test_lifecycle_defaults_to_retain(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    created = create(mock, lifecycle={"shutdownTime": "2030-01-01T00:00:00Z"}).json()
    assert created["spec"]["lifecycle"]["shutdownPolicy"] == "Retain"


def test_merge_patch_renews_bumps_generation_and_rejects_a_stale_version(
    kubernetes_server: Factory,
) -> None:
    mock = kubernetes_server()
    first = create(mock).json()
    url = f"{mock.url}{CLAIMS}/c1"
    headers = {"Content-Type": "application/merge-patch+json"}
    renewal = {"spec": {"lifecycle": {"shutdownTime": "2030-01-01T00:00:00Z"}}}
    patched = requests.patch(url, json=renewal, headers=headers, timeout=TIMEOUT).json()
    assert patched["spec"]["lifecycle"]["shutdownTime"] == "2030-01-01T00:00:00Z"
    assert patched["spec"]["warmPoolRef"] == {"name": "python-pool"}
    assert patched["metadata"]["generation"] == 2
    stale = {"metadata": {"resourceVersion": first["metadata"]["resourceVersion"]}, **renewal}
    conflict = requests.patch(url, json=stale, headers=headers, timeout=TIMEOUT)
    assert (conflict.status_code, conflict.json()["reason"]) == (409, "Conflict")


def test_a_strategic_merge_patch_is_415(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    create(mock)
    headers = {"Content-Type": "application/strategic-merge-patch+json"}
    answer = requests.patch(f"{mock.url}{CLAIMS}/c1", json={}, headers=headers, timeout=TIMEOUT)
    assert (answer.status_code, answer.json()["reason"]) == (415, "UnsupportedMediaType")


def test_delete_honours_a_uid_precondition(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    uid = create(mock).json()["metadata"]["uid"]
    url = f"{mock.url}{CLAIMS}/c1"
    wrong = requests.delete(url, json={"preconditions": {"uid": "other"}}, timeout=TIMEOUT)
    assert (wrong.status_code, wrong.json()["reason"]) == (409, "Conflict")
    right = requests.delete(url, json={"preconditions": {"uid": uid}}, timeout=TIMEOUT)
    assert (right.status_code, right.json()["metadata"]["uid"]) == (200, uid)


def test_list_filters_by_label_selector(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    create(mock, "c1")
    requests.post(
        mock.url + CLAIMS,
        json={**claim("c2"), "metadata": {"name": "c2", "labels": {"team": "b"}}},
        timeout=TIMEOUT,
    )
    names = [
        i["metadata"]["name"] for i in get(mock, f"{CLAIMS}?labelSelector=team%3Da").json()["items"]
    ]
    assert names == ["c1"]


# ---------------------------------------------------------------- watch


def test_watch_from_the_create_version_replays_the_controllers_writes(
    kubernetes_server: Factory,
) -> None:
    mock = kubernetes_server()
    rv = create(mock).json()["metadata"]["resourceVersion"]
    events = watch(mock, f"fieldSelector=metadata.name%3Dc1&resourceVersion={rv}&timeoutSeconds=1")
    assert {e["type"] for e in events} == {"MODIFIED"}
    last = events[-1]["object"]
    assert last["status"]["conditions"][0]["status"] == "True"
    assert last["status"]["sandbox"]["name"] == "pool-c1"
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv)


def test_watch_from_zero_starts_with_a_synthetic_added(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    ready(mock, "c1")
    ready(mock, "c2")
    events = watch(mock, "fieldSelector=metadata.name%3Dc2&resourceVersion=0&timeoutSeconds=1")
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "c2")]


def test_watch_stays_open_and_streams_a_delete(
    kubernetes_server: Factory, pool: ThreadPoolExecutor
) -> None:
    mock = kubernetes_server()
    rv = ready(mock)["metadata"]["resourceVersion"]
    pending = pool.submit(
        watch, mock, f"fieldSelector=metadata.name%3Dc1&resourceVersion={rv}&timeoutSeconds=2"
    )
    mock.wait_for("GET", timeout=TIMEOUT)
    requests.delete(f"{mock.url}{CLAIMS}/c1", timeout=TIMEOUT)
    events = pending.result(TIMEOUT)
    assert [e["type"] for e in events] == ["DELETED"]


def test_watch_of_a_missing_name_is_an_empty_stream_not_a_404(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    assert (
        watch(mock, "fieldSelector=metadata.name%3Dnope&resourceVersion=0&timeoutSeconds=1") == []
    )


def test_watch_from_a_compacted_version_is_an_error_410_event(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    ready(mock)
    mock.compact()
    [event] = watch(mock, "resourceVersion=1&timeoutSeconds=1")
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
    assert event["object"]["message"].startswith("too old resource version: 1")


def test_watch_from_a_compacted_version_can_be_http_410(kubernetes_server: Factory) -> None:
    mock = kubernetes_server(None, Cluster(gone_as_http=True))
    ready(mock)
    mock.compact()
    answer = get(mock, f"{CLAIMS}?resourceVersion=1&timeoutSeconds=1&watch=true")
    assert (answer.status_code, answer.json()["reason"]) == (410, "Expired")


def test_an_unsupported_field_selector_is_400(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    answer = get(mock, f"{CLAIMS}?fieldSelector=spec.x%3Dy&watch=true")
    assert (answer.status_code, answer.json()["reason"]) == (400, "BadRequest")


# ---------------------------------------------------------------- controller


def test_the_sandbox_has_pod_ips_an_owner_and_turns_ready_with_the_claim(
    kubernetes_server: Factory,
) -> None:
    mock = kubernetes_server()
    bound = ready(mock)
    sandbox = get(mock, f"{SANDBOXES}/pool-c1").json()
    assert sandbox["status"]["podIPs"] and "podIPs" not in bound["status"]["sandbox"]
    assert sandbox["status"]["conditions"][0]["reason"] == "DependenciesReady"
    [owner] = sandbox["metadata"]["ownerReferences"]
    assert (owner["name"], owner["uid"], owner["controller"]) == (
        "c1",
        bound["metadata"]["uid"],
        True,
    )


def test_deleting_a_claim_garbage_collects_its_sandbox(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    ready(mock)
    requests.delete(f"{mock.url}{CLAIMS}/c1", timeout=TIMEOUT)
    assert get(mock, f"{SANDBOXES}/pool-c1").json()["reason"] == "NotFound"
    assert router(mock, "/execute", method="POST", json={"command": "true"}).status_code == 502


def test_a_missing_warm_pool_is_warm_pool_not_found(kubernetes_server: Factory) -> None:
    mock = kubernetes_server(None, Cluster(warm_pools={"other"}))
    create(mock)
    status = get(mock, f"{CLAIMS}/c1").json()["status"]
    assert status["conditions"][0]["reason"] == "WarmPoolNotFound"
    assert "sandbox" not in status


def test_a_delete_claim_expires_on_the_cluster_clock(kubernetes_server: Factory) -> None:
    clock = [1_900_000_000.0]
    mock = kubernetes_server(None, Cluster(clock=lambda: clock[0]))
    create(mock, lifecycle={"shutdownTime": "2030-03-17T17:46:41Z", "shutdownPolicy": "Delete"})
    mock.reconcile()
    assert mock.live_claims == ["c1"]
    clock[0] += 3600
    mock.reconcile()
    expired = get(mock, f"{CLAIMS}/c1").json()["status"]["conditions"][0]
    assert (expired["reason"], expired["message"]) == (
        "ClaimExpired",
        "Claim expired. Sandbox cleanup initiated.",
    )
    mock.reconcile()
    assert mock.live_claims == []
    assert get(mock, f"{SANDBOXES}/pool-c1").status_code == 404


def test_a_retain_claim_keeps_the_claim_and_loses_its_sandbox(kubernetes_server: Factory) -> None:
    clock = [1_900_000_000.0]
    mock = kubernetes_server(None, Cluster(clock=lambda: clock[0]))
    create(mock, lifecycle={"shutdownTime": "2030-03-17T17:46:41Z"})
    clock[0] += 3600
    mock.reconcile()
    mock.reconcile()
    status = get(mock, f"{CLAIMS}/c1").json()["status"]
    assert status["conditions"][0]["reason"] == "ClaimExpired"
    assert "sandbox" not in status
    assert get(mock, f"{SANDBOXES}/pool-c1").status_code == 404


# ---------------------------------------------------------------- router


@pytest.mark.parametrize(
    ("headers", "sandbox", "detail"),
    [
        ({}, None, "X-Sandbox-ID header is required."),
        ({}, "Pool_C1", "Invalid sandbox ID format."),
        ({"X-Sandbox-Namespace": "Agents"}, "pool-c1", "Invalid namespace format."),
        ({"X-Sandbox-Port": "0"}, "pool-c1", "Invalid port format."),
        ({"X-Sandbox-Pod-IP": "127.0.0.1"}, "pool-c1", "Invalid target IP address."),
        ({"X-Sandbox-Pod-IP": "10.0.0"}, "pool-c1", "Invalid target IP address format."),
    ],
)
def test_the_router_refuses_bad_headers_with_400(
    kubernetes_server: Factory, headers: dict[str, str], sandbox: str | None, detail: str
) -> None:
    mock = kubernetes_server()
    ready(mock)
    answer = router(mock, "/", sandbox, headers=headers)
    assert (answer.status_code, answer.json()) == (400, {"detail": detail})


def test_the_router_answers_502_for_an_unknown_sandbox(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    answer = router(mock, "/execute", "pool-zz", method="POST", json={"command": "true"})
    assert (answer.status_code, answer.json()) == (
        502,
        {"detail": "Could not connect to the backend sandbox: pool-zz"},
    )


def test_the_router_answers_504_once_x_sandbox_timeout_passes(kubernetes_server: Factory) -> None:
    mock = kubernetes_server(lambda command: {"hang": True})
    ready(mock)
    answer = router(
        mock,
        "/execute",
        method="POST",
        json={"command": "sleep 9"},
        headers={"X-Sandbox-Timeout": "0.2"},
    )
    assert (answer.status_code, answer.json()) == (
        504,
        {"detail": "Timed out waiting for the backend sandbox: pool-c1"},
    )


def test_the_routers_own_limit_also_ends_in_504(kubernetes_server: Factory) -> None:
    done = threading.Event()
    mock = kubernetes_server(lambda command: {"after": done}, Cluster(proxy_timeout=0.2))
    ready(mock)
    answer = router(mock, "/execute", method="POST", json={"command": "sleep 9"})
    assert answer.status_code == 504


def test_without_services_the_router_reaches_a_sandbox_only_by_pod_ip(
    kubernetes_server: Factory,
) -> None:
    mock = kubernetes_server(None, Cluster(services=False))
    ready(mock)
    pod_ip = get(mock, f"{SANDBOXES}/pool-c1").json()["status"]["podIPs"][0]
    by_name = router(mock, "/execute", method="POST", json={"command": "true"})
    assert by_name.status_code == 502
    headers = {"X-Sandbox-Pod-IP": pod_ip}
    by_ip = router(mock, "/execute", method="POST", json={"command": "true"}, headers=headers)
    assert by_ip.status_code == 200


# ---------------------------------------------------------------- runtime


def test_the_runtimes_own_timeout_is_exit_1_with_its_text(kubernetes_server: Factory) -> None:
    mock = kubernetes_server(lambda command: {"hang": True}, Cluster(runtime_timeout=0.2))
    ready(mock)
    answer = router(mock, "/execute", method="POST", json={"command": "sleep 400"})
    assert answer.json() == {
        "stdout": "",
        "stderr": "Failed to execute command: Command '['sleep', '400']' timed out after "
        "0.2 seconds",
        "exit_code": 1,
    }


def test_output_that_is_not_utf8_fails_like_the_runtime(kubernetes_server: Factory) -> None:
    mock = kubernetes_server(lambda command: {"stdout": b"\xff", "exit_code": 0})
    ready(mock)
    answer = router(mock, "/execute", method="POST", json={"command": "cat blob"}).json()
    assert answer["exit_code"] == 1
    assert answer["stderr"].startswith("Failed to execute command: 'utf-8' codec can't decode")


@pytest.mark.parametrize(
    ("command", "stderr"),
    [
        ("echo 'open", "Failed to execute command: No closing quotation"),
        ("", "Failed to execute command: list index out of range"),
    ],
)
def test_commands_the_runtime_cannot_split_fail_with_exit_1(
    kubernetes_server: Factory, command: str, stderr: str
) -> None:
    mock = kubernetes_server()
    ready(mock)
    answer = router(mock, "/execute", method="POST", json={"command": command}).json()
    assert answer == {"stdout": "", "stderr": stderr, "exit_code": 1}


def test_execute_without_a_command_is_422(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    ready(mock)
    answer = router(mock, "/execute", method="POST", json={})
    assert answer.status_code == 422


def test_files_upload_download_list_and_exists(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    ready(mock)
    upload = router(mock, "/upload", method="POST", files={"file": ("/d/a.txt", b"alpha")})
    assert upload.json() == {"message": "File '/d/a.txt' uploaded successfully."}
    assert mock.files("c1") == {"d/a.txt": b"alpha"}
    download = router(mock, "/download/d%2Fa.txt")
    assert (download.content, download.headers["content-type"]) == (
        b"alpha",
        "application/octet-stream",
    )
    assert [e["name"] for e in router(mock, "/list/").json()] == ["d"]
    assert router(mock, "/exists/d").json() == {"path": "d", "exists": True}
    assert router(mock, "/download/d").json() == {"message": "File not found"}
    assert router(mock, "/list/d%2Fa.txt").json() == {"message": "Path is not a directory"}


def test_paths_that_escape_the_base_are_403(kubernetes_server: Factory) -> None:
    mock = kubernetes_server()
    ready(mock)
    answer = router(mock, "/download/..%2F..%2Fetc%2Fpasswd")
    assert (answer.status_code, answer.json()) == (403, {"message": "Access denied"})
    upload = router(mock, "/upload", method="POST", files={"file": ("../x", b"x")})
    assert upload.status_code == 403


# ---------------------------------------------------------------- our backend on these behaviours


@pytest.fixture
def backend_on() -> Iterator[Callable[[KubernetesServer], Any]]:
    """``backend_on(mock)``: our backend prepared on the fake, disposed at teardown."""
    from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
    from piship_remote.model.policy import SandboxProfile

    made: list[Any] = []

    def prepare(mock: KubernetesServer) -> Any:
        backend = KubernetesAgentSandboxBackend(
            endpoint=mock.url,
            router=mock.url,
            template="python-pool",
            namespace="agents",
            poll_interval=0.01,
        )
        instance = backend.prepare(SandboxProfile(workspace="/ws", network="allow"))
        made.append(instance)
        return instance

    yield prepare
    for instance in made:
        instance.dispose()


def exec_request(command: str) -> Any:
    from piship_remote.backends.base import ExecRequest

    return ExecRequest(command, "/ws", ".", {})


def test_our_backend_says_a_command_the_runtime_timed_out_ran(
    kubernetes_server: Factory, backend_on: Callable[[KubernetesServer], Any]
) -> None:
    mock = kubernetes_server(
        lambda command: {"hang": True} if "sleep" in command else {"stdout": "ok\n"},
        Cluster(runtime_timeout=0.2),
    )
    instance = backend_on(mock)
    with pytest.raises(Exception) as failure:
        instance.exec(exec_request("sleep 400"))
    assert "could not run" not in str(failure.value)


def test_our_backend_reports_a_signal_exit_as_128_plus_n(
    kubernetes_server: Factory, backend_on: Callable[[KubernetesServer], Any]
) -> None:
    mock = kubernetes_server(
        lambda command: {"exit_code": -9} if "kill" in command else {"stdout": "ok\n"}
    )
    assert backend_on(mock).exec(exec_request("kill -9 $$")).exit_code == 137


def test_our_backend_sends_x_sandbox_timeout_when_a_timeout_is_set(
    kubernetes_server: Factory, backend_on: Callable[[KubernetesServer], Any]
) -> None:
    mock = kubernetes_server()
    backend_on(mock).exec(exec_request("true"), deadline=Deadline.after(5.0))
    assert "x-sandbox-timeout" in mock.find("POST", "/execute")[-1].headers


def test_our_backend_keeps_the_claim_after_the_runtime_timed_out_a_command(
    kubernetes_server: Factory, backend_on: Callable[[KubernetesServer], Any]
) -> None:
    mock = kubernetes_server(
        lambda command: {"hang": True} if "sleep" in command else {"exit_code": 0},
        Cluster(runtime_timeout=0.2),
    )
    instance = backend_on(mock)
    with pytest.raises(Exception) as failure:
        instance.exec(exec_request("sleep 400"))
    assert str(failure.value).startswith(
        "the command ran, but the sandbox runtime stopped it at its own limit of 0.2 seconds"
    )
    assert instance.exec(exec_request("echo ok")).exit_code == 0
    assert mock.count("POST", CLAIMS) == 1


def test_our_backend_says_a_command_with_undecodable_output_ran(
    kubernetes_server: Factory, backend_on: Callable[[KubernetesServer], Any]
) -> None:
    mock = kubernetes_server(lambda command: {"stdout": b"\xff\xfe", "exit_code": 0})
    with pytest.raises(Exception) as failure:
        backend_on(mock).exec(exec_request("cat /bin/sh"))
    assert str(failure.value).startswith("the command ran, but its output is not UTF-8 text")


def test_our_backend_returns_a_real_exit_1_whatever_its_stderr_says(
    kubernetes_server: Factory, backend_on: Callable[[KubernetesServer], Any]
) -> None:
    stderr = "Failed to execute command: the tool's own message\n"
    mock = kubernetes_server(lambda command: {"stderr": stderr, "exit_code": 1})
    assert backend_on(mock).exec(exec_request("tool")).exit_code == 1


def test_our_backend_gives_the_router_a_timeout_a_little_past_the_commands(
    kubernetes_server: Factory, backend_on: Callable[[KubernetesServer], Any]
) -> None:
    mock = kubernetes_server()
    instance = backend_on(mock)
    instance.exec(exec_request("true"))
    assert "x-sandbox-timeout" not in mock.find("POST", "/execute")[-1].headers
    instance.exec(exec_request("true"), deadline=Deadline.after(2.5, clock=lambda: 0.0))
    assert mock.find("POST", "/execute")[-1].headers["x-sandbox-timeout"] == "8"
