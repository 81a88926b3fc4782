"""One request per direct command: the existence window, and a router that cannot reach the pod.

Against the fake cluster with settable clocks: within the window a command is only
its ``POST /execute``; when the router cannot reach the sandbox, one GET of the
claim decides whether the command runs once in a new claim or fails closed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs
import pytest

from piship_remote.backends.base import BackendResult, ExecRequest
from piship_remote.backends.kubernetes.backend import KubernetesInstance
from piship_remote.backends.kubernetes.claims import DEFAULT_EXISTENCE_WINDOW as WINDOW
from piship_remote.model.errors import CONFIG_INVALID, PiShipError
from piship_remote.model.policy import SandboxProfile
from piship_remote.testing import CLAIMS, Cluster, KubernetesServer
from tests.support.seed import Clocks, assert_no_library_thread_left, failure_of, kubernetes

KubernetesFactory = Callable[..., KubernetesServer]

pytestmark = pytest.mark.timeout(30)

PROFILE = SandboxProfile(workspace="/ws", network="allow")
TOKEN = "k8s-existence-token"


@pytest.fixture(autouse=True)
def no_thread_left() -> Iterator[None]:
    yield
    assert_no_library_thread_left()


class Runtime:
    """The sandboxes' runtime: answers ``ok`` and records every command that reached it."""

    def __init__(self) -> None:
        self.ran: list[str] = []

    def __call__(self, command: str) -> Mapping[str, Any]:
        self.ran.append(command)
        return {"stdout": "ok\n", "exit_code": 0}

    def times(self, text: str) -> int:
        return len([command for command in self.ran if text in command])


class Tokens:
    """The bearer, read once per request: the queued values first, then :data:`TOKEN`."""

    def __init__(self) -> None:
        self.queue: list[str] = []

    def __call__(self) -> str:
        return self.queue.pop(0) if self.queue else TOKEN


def request(command: str = "true") -> ExecRequest:
    return ExecRequest(command, "/ws", ".", {})


def prepared(
    made: list[KubernetesInstance], url: str, clocks: Clocks, **options: Any
) -> KubernetesInstance:
    instance = kubernetes(url, clocks=clocks, **options).prepare(PROFILE)
    made.append(instance)
    return instance


def claim_names(mock: KubernetesServer) -> list[str]:
    return [r.json()["metadata"]["name"] for r in mock.find("POST", CLAIMS)]


def sent_after(mock: KubernetesServer, count: int) -> list[str]:
    """``METHOD path`` of every request after the first ``count``."""
    return [f"{r.method} {r.path}" for r in mock.requests[count:]]


def executes_to(mock: KubernetesServer, name: str) -> int:
    return len([r for r in mock.find("POST", "/execute") if r.headers["x-sandbox-id"] == name])


# ---------------------------------------------------------------- the window


def test_a_command_within_the_window_is_its_execute_alone(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance], clocks: Clocks
) -> None:
    mock = kubernetes_server(Runtime())
    instance = prepared(instances, mock.url, clocks)
    before = len(mock.requests)
    clocks.advance(WINDOW / 4)
    assert instance.exec(request()) == BackendResult(0)
    assert sent_after(mock, before) == ["POST /execute"]


def test_a_command_past_the_window_checks_the_claim_first(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance], clocks: Clocks
) -> None:
    mock = kubernetes_server(Runtime())
    instance = prepared(instances, mock.url, clocks)
    [name] = claim_names(mock)
    before = len(mock.requests)
    clocks.advance(WINDOW)
    instance.exec(request())
    assert sent_after(mock, before) == [f"GET {CLAIMS}/{name}", "POST /execute"]


def test_a_window_of_zero_checks_before_every_command(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance], clocks: Clocks
) -> None:
    mock = kubernetes_server(Runtime())
    instance = prepared(instances, mock.url, clocks, existence_window=0)
    [name] = claim_names(mock)
    before = len(mock.requests)
    instance.exec(request())
    instance.exec(request())
    assert sent_after(mock, before) == [f"GET {CLAIMS}/{name}", "POST /execute"] * 2


@pytest.mark.parametrize("window", [-1, -0.001, float("nan"), "1"])
def test_an_invalid_window_is_refused_with_a_config_error(window: object) -> None:
    error = failure_of(lambda: kubernetes("http://127.0.0.1:1", existence_window=window))
    assert isinstance(error, PiShipError)
    assert error.code == CONFIG_INVALID
    assert "existence_window" in str(error)


# ---------------------------------------------------------------- the router cannot reach it


@attrs.frozen
class _Claimed:
    """One prepared instance on its first claim, behind a router of either kind."""

    runtime: Runtime
    cluster: Cluster
    mock: KubernetesServer
    instance: KubernetesInstance
    first: str


@pytest.fixture
def claimed(
    kubernetes_server: KubernetesFactory,
    instances: list[KubernetesInstance],
    clocks: Clocks,
    real_router: bool,
) -> _Claimed:
    runtime = Runtime()
    cluster = Cluster(real_router=real_router)
    mock = kubernetes_server(runtime, cluster)
    instance = prepared(instances, mock.url, clocks)
    [first] = claim_names(mock)
    return _Claimed(runtime, cluster, mock, instance, first)


@pytest.mark.parametrize("real_router", [False, True], ids=["router 404", "router 502"])
def test_a_claim_the_api_no_longer_has_runs_the_command_once_in_a_new_claim(
    claimed: _Claimed,
) -> None:
    runtime, mock, instance, first = claimed.runtime, claimed.mock, claimed.instance, claimed.first
    claimed.cluster.expired.add(first)
    before = len(mock.requests)
    assert instance.exec(request("echo fresh")) == BackendResult(0)
    [_, second] = claim_names(mock)
    assert runtime.times("echo fresh") == 1
    assert executes_to(mock, f"pool-{first}") == 1
    assert executes_to(mock, f"pool-{second}") == 1
    assert sent_after(mock, before)[:2] == ["POST /execute", f"GET {CLAIMS}/{first}"]
    assert sent_after(mock, before).count(f"GET {CLAIMS}/{first}") == 1  # the one that decided


@pytest.mark.parametrize(
    ("real_router", "said", "retryable"),
    [
        (False, "the sandbox router no longer knows this sandbox", False),
        (True, "the sandbox router could not connect to the sandbox, so the command did not", True),
    ],
    ids=["router 404", "router 502"],
)
def test_a_claim_the_api_still_has_is_retired_without_running_the_command_again(
    claimed: _Claimed, said: str, retryable: bool
) -> None:
    runtime, mock, instance, first = claimed.runtime, claimed.mock, claimed.instance, claimed.first
    claimed.cluster.router_gone.add(first)
    error = failure_of(lambda: instance.exec(request("deploy")))
    assert isinstance(error, PiShipError)
    assert str(error).startswith(said)
    assert error.retryable is retryable
    assert claim_names(mock) == [first]  # no replay in a new claim
    assert mock.count("DELETE", f"{CLAIMS}/{first}") == 1
    assert runtime.times("deploy") == 0
    instance.exec(request("echo next"))
    assert executes_to(mock, f"pool-{claim_names(mock)[1]}") == 1


def test_an_api_that_cannot_say_whether_the_claim_exists_fails_closed(
    kubernetes_server: KubernetesFactory, instances: list[KubernetesInstance], clocks: Clocks
) -> None:
    runtime = Runtime()
    cluster = Cluster(token=TOKEN)
    mock = kubernetes_server(runtime, cluster)
    tokens = Tokens()
    instance = prepared(instances, mock.url, clocks, credential=tokens)
    [first] = claim_names(mock)
    cluster.router_gone.add(first)
    tokens.queue = [TOKEN, "rejected"]  # the execute gets through, the GET of the claim is 401
    before = len(mock.requests)
    error = failure_of(lambda: instance.exec(request("deploy")))
    assert isinstance(error, PiShipError)
    assert "no longer knows this sandbox" in str(error)
    assert sent_after(mock, before)[:2] == ["POST /execute", f"GET {CLAIMS}/{first}"]
    assert mock.count("POST", "/execute") == 1
    assert claim_names(mock) == [first]
    assert mock.count("DELETE", f"{CLAIMS}/{first}") == 1
