"""The Kubernetes backend beyond the seed: bad input, real-cluster and real-router behaviour.

Most cases use the seed's fake cluster (``kubernetes_server``); the ones it cannot
express (a 409 on create, a claim that reports ``ClaimExpired``, malformed
statuses, 410s) use :class:`Scripted`, a small claims API + router whose answers
each test sets.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from werkzeug import Request, Response

from piship_remote.backends.base import BackendResult, ExecRequest
from piship_remote.backends.kubernetes._claims_api import pod_ip
from piship_remote.backends.kubernetes.backend import (
    KubernetesAgentSandboxBackend,
    KubernetesInstance,
    runtime_command,
)
from piship_remote.backends.kubernetes.claims import (
    DEFAULT_EXISTENCE_WINDOW as EXISTENCE_WINDOW,
)
from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.testing import (
    CLAIMS,
    Cluster,
    DropConnection,
    KubernetesServer,
    MockHttpClient,
    MockRequest,
    MockResponse,
    RecordingServer,
    json_response,
)
from piship_remote.wire.agent_sandbox import CLAIMS as CLAIM_RESOURCE
from piship_remote.wire.agent_sandbox import SANDBOXES
from tests.support.seed import (
    Clocks,
    Rejections,
    assert_no_library_thread_left,
    failure_of,
    kubernetes,
)

KubernetesFactory = Callable[..., KubernetesServer]
Answer = tuple[int, Any]

pytestmark = pytest.mark.timeout(20)


def request(command: str = "true", workspace_path: str = ".") -> ExecRequest:
    return ExecRequest(command, "/ws", workspace_path, {})


PROFILE = SandboxProfile(workspace="/ws", network="allow")


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    yield
    assert_no_library_thread_left()


def prepared(made: list[KubernetesInstance], url: str, **options: Any) -> KubernetesInstance:
    instance = kubernetes(url, **options).prepare(PROFILE)
    made.append(instance)
    return instance


def preparing_fails(url: str, **options: Any) -> BaseException:
    """What preparing an instance on ``url`` raises (it must fail)."""
    return failure_of(lambda: kubernetes(url, **options).prepare(PROFILE))


API = "http://127.0.0.1:1"  # a client that answers in-process is given with it


def unused_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port: int = unused.getsockname()[1]
    return port


def ready(name: str) -> dict[str, Any]:
    return {
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "sandbox": {"name": f"pool-{name}"},
        }
    }


class Scripted:
    """A claims API and router on one loopback server, answering as the test says.

    ``create`` answers POSTs in turn (``None`` drops the connection; then 201);
    ``claim(name, poll)`` answers GETs; ``patch(name)`` PATCHes; ``execute(command)``
    the router (default ``ok``).
    """

    def __init__(self) -> None:
        self.create: list[Answer | None] = []  # None: drop the connection
        self.claim: Callable[[str, int], Answer] = lambda name, poll: (200, ready(name))
        self.patch: Callable[[str], Answer] = lambda name: (200, {})
        self.delete: Answer = (200, {})
        self.execute: Callable[[str], Answer] = lambda command: (
            200,
            {"stdout": "ok\n", "stderr": "", "exit_code": 0},
        )
        self.polls: dict[str, int] = {}
        self.server = RecordingServer(self._handle)
        self.url = self.server.url

    def names(self) -> list[str]:
        return [r.json()["metadata"]["name"] for r in self.server.find("POST", CLAIMS)]

    def routed_to(self) -> str:
        """The sandbox the last command was routed to (``X-Sandbox-Id``)."""
        return self.server.find("POST", "/execute")[-1].headers["x-sandbox-id"]

    def deletions(self, name: str) -> int:
        return self.server.count("DELETE", f"{CLAIMS}/{name}")

    def _handle(self, request: Request) -> Response:
        if request.path == "/execute":
            return json_response(*self.execute(request.get_json()["command"]))
        if request.path == CLAIMS and request.method == "POST":
            if self.create:
                answer = self.create.pop(0)
                if answer is None:
                    raise DropConnection
                return json_response(*answer)
            return json_response(201, request.get_data())
        name = request.path.rsplit("/", 1)[-1]
        if request.method == "GET":
            self.polls[name] = self.polls.get(name, 0) + 1
            return json_response(*self.claim(name, self.polls[name]))
        if request.method == "PATCH":
            return json_response(*self.patch(name))
        if request.method == "DELETE":
            return json_response(*self.delete)
        return json_response(404, {})


@pytest.fixture
def scripted() -> Iterator[Scripted]:
    fake = Scripted()
    yield fake
    fake.server.close()


# ---------------------------------------------------------------- construction


def test_identity_and_redactor() -> None:
    k8s = kubernetes("http://127.0.0.1:1")
    assert (k8s.id, k8s.provider) == ("kubernetes-agent-sandbox", "kubernetes-agent-sandbox")
    assert isinstance(k8s.redactor, Redactor)
    assert "deny" not in k8s.capabilities().network
    assert "network-deny" not in k8s.capabilities().planes


@pytest.mark.parametrize(
    "names",
    [
        {"template": ""},
        {"template": "Python-Pool"},
        {"template": "a" * 64},
        {"namespace": "-agents"},
        {"namespace": "agents_1"},
    ],
)
def test_rejects_names_that_are_not_resource_names(names: Mapping[str, str]) -> None:
    with pytest.raises(ValueError, match="Kubernetes resource names"):
        kubernetes("http://127.0.0.1:1", **names)


def test_accepts_a_63_character_name() -> None:
    kubernetes("http://127.0.0.1:1", template="a" * 63)


def test_refuses_plain_http_to_a_remote_host() -> None:
    with pytest.raises(PiShipError) as caught:
        KubernetesAgentSandboxBackend(
            endpoint="http://k8s.example.com", router="http://127.0.0.1:1", template="pool"
        )
    assert caught.value.code == "NETWORK_DENIED"


# ---------------------------------------------------------------- available()


def test_available_reports_an_unreachable_api() -> None:
    def refused(request: MockRequest) -> MockResponse:
        raise ConnectionRefusedError(111, "refused")

    availability = kubernetes(API, client=MockHttpClient(refused)).available()
    assert availability.available is False
    assert (availability.reason or "").startswith("the Kubernetes API is unreachable: ")


def test_available_reports_the_listing_status() -> None:
    client = MockHttpClient(lambda request: MockResponse.of_json(401, {"kind": "Status"}))
    availability = kubernetes(API, client=client).available()
    assert availability.available is False
    assert availability.reason == "listing SandboxClaims returned HTTP 401"
    (listing,) = client.requests
    assert (listing.method, listing.path.split("?")[0]) == ("GET", CLAIMS)


# ---------------------------------------------------------------- runtime_command


def test_runtime_command_maps_a_subdirectory_without_workdir() -> None:
    assert runtime_command(request("ls", "a/b"), None) == (
        "env /bin/sh -c 'cd -- '\"'\"'a/b'\"'\"' && ls'"
    )


def test_runtime_command_uses_the_workdir_itself_for_the_root() -> None:
    assert runtime_command(request("ls"), "/workspace/") == (
        "env /bin/sh -c 'cd -- '\"'\"'/workspace/'\"'\"' && ls'"
    )


def test_runtime_command_under_the_filesystem_root() -> None:
    assert (
        runtime_command(request("ls", "a"), "/") == "env /bin/sh -c 'cd -- '\"'\"'/a'\"'\"' && ls'"
    )


@pytest.mark.parametrize("path", ["../x", "/etc", "a/../../b"])
def test_runtime_command_refuses_paths_outside_the_workspace(path: str) -> None:
    with pytest.raises(PiShipError, match="outside the workspace"):
        runtime_command(request("ls", path), "/workspace")


def test_runtime_command_keeps_environment_order() -> None:
    command = runtime_command(ExecRequest("true", "/ws", ".", {"B": "2", "A": "it's"}), None)
    assert command == "env 'B=2' 'A=it'\"'\"'s' /bin/sh -c 'true'"


# ---------------------------------------------------------------- claim creation


def test_a_409_on_create_is_retried_with_a_fresh_name(
    scripted: Scripted, instances: list[KubernetesInstance]
) -> None:
    scripted.create = [(409, {"kind": "Status", "reason": "AlreadyExists", "code": 409})]
    instance = prepared(instances, scripted.url)
    first, second = scripted.names()
    assert first != second
    assert instance.exec(request()) == BackendResult(0)
    assert scripted.routed_to() == f"pool-{second}"


def test_names_taken_again_and_again_fail_creation(scripted: Scripted) -> None:
    scripted.create = [(409, {})] * 3
    error = preparing_fails(scripted.url)
    assert isinstance(error, PiShipError)
    assert "creating the SandboxClaim failed: HTTP 409" in str(error)
    assert len(scripted.names()) == 3


def test_a_kubernetes_status_body_is_understood(kubernetes_server: KubernetesFactory) -> None:
    mock = kubernetes_server(None, Cluster(create_status=403))
    error = preparing_fails(mock.url)
    assert str(error).startswith(
        "creating the SandboxClaim failed: HTTP 403: Forbidden: sandboxclaims is forbidden: "
        'anonymous cannot create resource "sandboxclaims"'
    )


@pytest.mark.parametrize("status", [500, 503])
def test_an_api_outage_on_create_is_clear(scripted: Scripted, status: int) -> None:
    scripted.create = [(status, {"message": "etcdserver: request timed out"})]
    error = preparing_fails(scripted.url)
    assert isinstance(error, PiShipError)
    assert error.code == "SANDBOX_UNAVAILABLE"
    assert str(error) == (
        f"creating the SandboxClaim failed: HTTP {status}: etcdserver: request timed out"
    )


def test_a_create_whose_answer_never_came_deletes_the_name(scripted: Scripted) -> None:
    scripted.create = [None]  # the connection drops after the claim POST was sent
    error = preparing_fails(scripted.url)
    assert isinstance(error, PiShipError)
    assert "creating the SandboxClaim failed" in str(error)
    [name] = scripted.names()
    assert scripted.deletions(name) == 1


def test_a_terminal_reason_fails_readiness_and_deletes_the_claim(scripted: Scripted) -> None:
    scripted.claim = lambda name, poll: (
        200,
        {
            "status": {
                "conditions": [{"type": "Ready", "status": "False", "reason": "InvalidMetadata"}]
            }
        },
    )
    error = preparing_fails(scripted.url)
    assert str(error) == "the SandboxClaim failed: InvalidMetadata"
    [name] = scripted.names()
    assert scripted.deletions(name) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"status": "garbage"},
        {"status": {"conditions": "Ready"}},
        {"status": {"conditions": [None, 3, {"type": "Ready"}]}},
        [],
    ],
)
def test_a_malformed_status_never_counts_as_ready(scripted: Scripted, body: Any) -> None:
    scripted.claim = lambda name, poll: (200, body)
    error = preparing_fails(scripted.url, ready_timeout=0.1)
    assert "did not become ready in time" in str(error) or "not a JSON object" in str(error)
    [name] = scripted.names()
    assert scripted.deletions(name) == 1


def test_the_last_reason_is_named_when_readiness_times_out(scripted: Scripted) -> None:
    condition = {
        "type": "Ready",
        "status": "False",
        "reason": "WarmPoolNotFound",
        "message": 'SandboxWarmPool "python-pool" not found',
    }
    scripted.claim = lambda name, poll: (200, {"status": {"conditions": [condition]}})
    error = preparing_fails(scripted.url, ready_timeout=0.05)
    assert str(error) == (
        "the SandboxClaim did not become ready in time "
        '(last reported: WarmPoolNotFound: SandboxWarmPool "python-pool" not found)'
    )


def test_a_claim_body_that_is_not_json_fails_clearly(scripted: Scripted) -> None:
    scripted.claim = lambda name, poll: (200, "<html>proxy</html>")
    error = preparing_fails(scripted.url)
    assert str(error) == "reading the SandboxClaim failed: the response is not JSON"
    [name] = scripted.names()
    assert scripted.deletions(name) == 1


def test_a_410_while_waiting_fails_clearly(scripted: Scripted) -> None:
    scripted.claim = lambda name, poll: (
        410,
        {"kind": "Status", "reason": "Expired", "message": "too old resource version"},
    )
    error = preparing_fails(scripted.url)
    assert str(error) == (
        "reading the SandboxClaim failed: HTTP 410: Expired: too old resource version"
    )
    assert scripted.server.count("DELETE") == 1


def test_ready_without_a_sandbox_name_routes_by_claim_name(
    scripted: Scripted, instances: list[KubernetesInstance]
) -> None:
    scripted.claim = lambda name, poll: (
        200,
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
    )
    instance = prepared(instances, scripted.url)
    instance.exec(request())
    [name] = scripted.names()
    assert scripted.routed_to() == name


# ---------------------------------------------------------------- real cluster behaviour


def test_a_claim_the_cluster_expired_is_replaced_without_a_patch(
    scripted: Scripted, instances: list[KubernetesInstance]
) -> None:
    expired: set[str] = set()

    def claim(name: str, poll: int) -> Answer:
        if name in expired:
            condition = {"type": "Ready", "status": "False", "reason": "ClaimExpired"}
            return 200, {"status": {"conditions": [condition]}}
        return 200, ready(name)

    scripted.claim = claim
    clocks = Clocks()
    instance = prepared(instances, scripted.url, clocks=clocks)
    [first] = scripted.names()
    expired.add(first)
    clocks.advance(EXISTENCE_WINDOW)  # past the window: the command checks the claim first
    assert instance.exec(request()) == BackendResult(0)
    second = scripted.names()[1]
    assert scripted.server.count("PATCH") == 0
    assert scripted.deletions(first) == 1
    assert scripted.routed_to() == f"pool-{second}"


def test_a_claim_being_deleted_is_replaced(
    scripted: Scripted, instances: list[KubernetesInstance]
) -> None:
    deleting: set[str] = set()

    def claim(name: str, poll: int) -> Answer:
        body = ready(name)
        if name in deleting:
            body["metadata"] = {"deletionTimestamp": "2026-09-28T18:00:00Z"}
        return 200, body

    scripted.claim = claim
    clocks = Clocks()
    instance = prepared(instances, scripted.url, clocks=clocks)
    deleting.add(scripted.names()[0])
    clocks.advance(EXISTENCE_WINDOW)  # past the window: the command checks the claim first
    instance.exec(request())
    assert len(scripted.names()) == 2


def test_the_pod_ip_is_sent_to_the_router(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server(None, Cluster(pod_ip="10.4.0.7", real_router=True))
    instance = prepared(instances, mock.url)
    assert instance.exec(request()) == BackendResult(0)
    assert mock.find("POST", "/execute")[-1].headers["x-sandbox-pod-ip"] == "10.4.0.7"


def test_without_pod_ips_on_the_claim_the_pod_ip_comes_from_the_sandbox(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server()
    prepared(instances, mock.url).exec(request())
    [claim] = [r.json()["metadata"]["name"] for r in mock.find("POST", CLAIMS)]
    sandbox = mock.store.get(SANDBOXES, "agents", f"pool-{claim}")
    assert "podIPs" not in mock.store.get(CLAIM_RESOURCE, "agents", claim)["status"]["sandbox"]
    sent = mock.find("POST", "/execute")[-1].headers["x-sandbox-pod-ip"]
    assert sent == sandbox["status"]["podIPs"][0]


@pytest.mark.parametrize(
    ("ips", "chosen"),
    [
        (["fd00::7", "10.4.0.7"], "10.4.0.7"),
        ([{"ip": "::ffff:10.1.2.3"}], "10.1.2.3"),
        (["fd00::7"], "fd00::7"),
        (["not an ip", "10.0.0.1\r\nX: y"], None),
        ("10.0.0.1", None),
    ],
)
def test_the_pod_ip_prefers_ipv4_and_ignores_junk(ips: Any, chosen: str | None) -> None:
    assert pod_ip({"status": {"sandbox": {"podIPs": ips}}}) == chosen


def test_a_real_router_502_for_a_gone_sandbox_is_a_command_that_never_ran(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    cluster = Cluster(real_router=True)
    mock = kubernetes_server(None, cluster)
    instance = prepared(instances, mock.url)
    [first] = [r.json()["metadata"]["name"] for r in mock.find("POST", CLAIMS)]
    cluster.router_gone.add(first)
    error = failure_of(lambda: instance.exec(request("deploy")))
    assert isinstance(error, PiShipError)
    assert error.retryable is True
    assert str(error).startswith(
        "the sandbox router could not connect to the sandbox, so the command did not run "
        f"(HTTP 502: Could not connect to the backend sandbox: pool-{first})"
    )
    assert mock.count("DELETE", f"{CLAIMS}/{first}") == 1
    instance.exec(request("echo next"))
    assert len([r for r in mock.find("POST", "/execute") if b"deploy" in r.body]) == 1


# ---------------------------------------------------------------- router answers


def test_a_router_answer_that_is_not_json_is_clear_and_sent_once(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server(
        lambda c: {"body": "<html>oops</html>"} if "x" in c else {"exit_code": 0}
    )
    instance = prepared(instances, mock.url)
    error = failure_of(lambda: instance.exec(request("x")))
    assert isinstance(error, PiShipError)
    assert error.code == "SANDBOX_UNAVAILABLE"
    assert "the response is not JSON" in str(error)
    assert mock.count("POST", "/execute") == 1
    assert instance.exec(request("y")) == BackendResult(0)
    assert mock.count("POST", CLAIMS) == 1  # the claim is kept: the command did run


@pytest.mark.parametrize(
    ("answer", "exit_code"),
    [
        ({}, None),
        ({"exit_code": "3"}, None),
        ({"exit_code": 3.0}, 3),
        ({"exit_code": True}, None),
        ({"exit_code": 2.5}, None),
        ({"exit_code": -1}, 129),
    ],
)
def test_an_exit_code_that_is_not_an_integer_is_unknown(
    kubernetes_server: KubernetesFactory,
    instances: list[KubernetesInstance],
    answer: Mapping[str, Any],
    exit_code: int | None,
) -> None:
    mock = kubernetes_server(lambda command: answer)
    assert prepared(instances, mock.url).exec(request()) == BackendResult(exit_code)


def test_a_missing_exit_code_is_a_failed_command_through_activation(
    kubernetes_server: KubernetesFactory, workspace: Path, home: Path
) -> None:
    mock = kubernetes_server(lambda command: {"stdout": "ok\n"})
    policy = {"required": True, "network": {"mode": "allow"}}
    with activate_sandbox(
        policy, backend=kubernetes(mock.url), workspace=workspace, home_dir=home
    ) as sandbox:
        assert sandbox.exec("true").exit_code == 1


def test_an_oversized_router_answer_is_refused(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    huge = b'{"stdout":"' + b"a" * (16 * 1024 * 1024) + b'"}'
    mock = kubernetes_server(lambda command: {"body": huge})
    error = failure_of(lambda: prepared(instances, mock.url).exec(request()))
    assert "the response is too large" in str(error)


def test_output_arrives_as_stdout_then_stderr(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server(lambda command: {"stdout": "out\n", "stderr": "err\n", "exit_code": 2})
    seen: list[tuple[str, bytes]] = []
    result = prepared(instances, mock.url).exec(
        request(),
        on_stdout=lambda chunk: seen.append(("out", chunk)),
        on_stderr=lambda chunk: seen.append(("err", chunk)),
    )
    assert result == BackendResult(2)
    assert seen == [("out", b"out\n"), ("err", b"err\n")]


def test_a_runtime_start_failure_is_reported_as_such(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    stderr = "Failed to execute command: [Errno 2] No such file or directory: 'env'"
    mock = kubernetes_server(
        lambda c: {"stderr": stderr, "exit_code": 1} if "x" in c else {"exit_code": 0}
    )
    instance = prepared(instances, mock.url)
    error = failure_of(lambda: instance.exec(request("x")))
    assert isinstance(error, PiShipError)
    assert str(error) == f"the sandbox runtime could not run the command: {stderr}"
    assert instance.exec(request("y")) == BackendResult(0)
    assert mock.count("POST", CLAIMS) == 1


def test_a_plain_exit_1_with_stderr_is_just_an_exit_code(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server(lambda c: {"stderr": "make: *** Error 1", "exit_code": 1})
    assert prepared(instances, mock.url).exec(request()) == BackendResult(1)


def test_a_router_401_rejects_the_credential_and_never_resends(
    scripted: Scripted, instances: list[KubernetesInstance]
) -> None:
    scripted.execute = lambda command: (401, {"detail": "Invalid token."})
    rejected = Rejections()
    instance = prepared(
        instances,
        scripted.url,
        credential=lambda: "router-token-0001",
        credential_rejected=rejected,
    )
    error = failure_of(lambda: instance.exec(request("deploy")))
    assert str(error) == "running the command failed: HTTP 401: Invalid token."
    assert scripted.server.count("POST", "/execute") == 1
    assert rejected.count == 1


def test_an_unreachable_router_sends_nothing_and_keeps_the_claim(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server()
    router = f"http://127.0.0.1:{unused_port()}"
    instance = prepared(instances, mock.url, router=router, template="pool")
    error = failure_of(lambda: instance.exec(request()))
    assert isinstance(error, PiShipError)
    assert error.retryable is True
    assert "the command was not sent" in str(error)
    assert mock.count("DELETE") == 0


# ---------------------------------------------------------------- API failures before a command


def test_an_api_outage_before_a_command_sends_nothing_and_keeps_the_claim(
    scripted: Scripted, instances: list[KubernetesInstance]
) -> None:
    outage = threading.Event()

    def claim(name: str, poll: int) -> Answer:
        return (503, {"message": "etcd unavailable"}) if outage.is_set() else (200, ready(name))

    scripted.claim = claim
    clocks = Clocks()
    instance = prepared(instances, scripted.url, clocks=clocks)
    outage.set()
    clocks.advance(EXISTENCE_WINDOW)  # past the window: the command checks the claim first
    error = failure_of(lambda: instance.exec(request()))
    assert isinstance(error, PiShipError)
    assert str(error) == "checking the SandboxClaim failed: HTTP 503: etcd unavailable"
    assert error.retryable is True
    assert scripted.server.count("POST", "/execute") == 0
    outage.clear()
    assert instance.exec(request()) == BackendResult(0)
    assert len(scripted.names()) == 1


def test_a_failed_renewal_fails_the_command_before_it_is_sent(
    scripted: Scripted, instances: list[KubernetesInstance]
) -> None:
    clocks = Clocks()
    scripted.patch = lambda name: (500, {"message": "boom"})
    instance = prepared(instances, scripted.url, clocks=clocks, lifetime_seconds=60)
    clocks.advance(40)
    error = failure_of(lambda: instance.exec(request()))
    assert str(error) == "renewing the SandboxClaim failed: HTTP 500: boom"
    assert scripted.server.count("POST", "/execute") == 0


# ---------------------------------------------------------------- cancel and dispose


def test_a_pre_cancelled_command_sends_nothing(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server()
    instance = prepared(instances, mock.url)
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CommandCancelled):
        instance.exec(request(), cancel=cancel)
    assert mock.count("POST", "/execute") == 0
    assert mock.count("DELETE") == 0


def test_dispose_ends_a_running_command_at_once(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server(lambda c: {"hang": True})
    instance = prepared(instances, mock.url)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(instance.exec, request("sleep 600"))
        mock.wait_for("POST", "/execute")
        started = time.monotonic()
        instance.dispose()
        with pytest.raises(PiShipError, match="disposed"):
            pending.result(5)
        assert time.monotonic() - started < 2
    assert mock.count("DELETE") == 1
    assert mock.live_claims == []


def test_a_command_after_dispose_creates_nothing(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server()
    instance = prepared(instances, mock.url)
    instance.dispose()
    with pytest.raises(PiShipError, match="disposed"):
        instance.exec(request())
    assert mock.count("POST", CLAIMS) == 1
    assert mock.count("POST", "/execute") == 0


def test_a_plain_event_cancels_and_its_watcher_stops_at_dispose(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server(lambda c: {"hang": True})
    instance = prepared(instances, mock.url)
    cancel = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(instance.exec, request("sleep 600"), cancel=cancel)
        mock.wait_for("POST", "/execute")
        cancel.set()
        with pytest.raises(CommandCancelled):
            pending.result(5)
    assert mock.count("DELETE") == 1
    instance.dispose()


def test_32_concurrent_commands_share_one_claim_and_delete_it_once(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance]
) -> None:
    mock = kubernetes_server(lambda c: {"stdout": c.split("'")[-2]})
    instance = prepared(instances, mock.url)
    outputs: list[bytes] = []
    with ThreadPoolExecutor(32) as pool:
        results = list(
            pool.map(
                lambda i: instance.exec(request(f"echo {i}"), on_stdout=outputs.append),
                range(32),
            )
        )
    assert results == [BackendResult(None)] * 32
    assert sorted(outputs) == sorted(f"echo {i}".encode() for i in range(32))
    assert mock.count("POST", CLAIMS) == 1
    instance.dispose()
    assert mock.count("DELETE") == 1


def test_a_deny_policy_on_kubernetes_says_to_use_network_allow(tmp_path: Path) -> None:
    with KubernetesServer() as mock:
        backend = KubernetesAgentSandboxBackend(
            endpoint=mock.url, router=mock.url, template="python-pool", namespace="agents"
        )
        with pytest.raises(PiShipError) as raised:
            activate_sandbox({"required": True}, backend=backend, workspace=tmp_path)
    assert raised.value.user_action is not None
    assert 'network "allow"' in raised.value.user_action
    assert "--network allow" in raised.value.user_action
