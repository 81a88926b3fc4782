# ruff: noqa: F811  (a test names the fixture it takes from another test module)
"""One deadline and one cancel token per command, made in Sandbox.exec and handed down.

The backend instance gets the very deadline the run engine fires; the services are
told what is left of it; a caller's plain Event becomes one token, once.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends.base import BackendResult, ExecRequest
from piship_remote.backends.e2b._instance import E2bInstance
from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.testing import (
    E2bServer,
    KubernetesServer,
    MockHttpClient,
    MockRequest,
    MockResponse,
)
from piship_remote.transport._cancel import CancelToken
from piship_remote.transport.deadline import Deadline
from tests.backends.e2b.test_e2b_backend import prepared, profile  # noqa: F401 (fixtures)
from tests.sandbox.test_activation import FakeBackend, FakeInstance, activate, ws  # noqa: F401 (fixture)
from tests.testing.test_kubernetes_cluster import backend_on, exec_request  # noqa: F401 (fixture)

WAIT = 5.0  # seconds a test waits for something that happens at once


class FakeClock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


class DeadlineInstance(FakeInstance):
    """A fake instance whose exec takes the deadline, and records what it was given."""

    def __init__(self, backend: FakeBackend) -> None:
        super().__init__(backend)
        self.deadlines: list[Deadline | None] = []
        self.tokens: list[threading.Event] = []
        self.watchers: list[int] = []

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> BackendResult:
        if "piship-sandbox-ready" not in request.command:
            assert cancel is not None
            self.deadlines.append(deadline)
            self.tokens.append(cancel)
            self.watchers.append(_watcher_threads())
        return super().exec(request, on_stdout=on_stdout, on_stderr=on_stderr, cancel=cancel)


class DeadlineBackend(FakeBackend):
    def prepare(self, profile: Any) -> DeadlineInstance:
        self.log.append("prepare")
        instance = DeadlineInstance(self)
        self.instance = instance
        return instance


def _watcher_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "piship-cancel-watch")


@pytest.mark.parametrize("timeout", [0, 0.0, -1, math.nan])
def test_a_timeout_of_no_time_is_config_invalid_and_runs_nothing(ws: Path, timeout: float) -> None:
    backend = DeadlineBackend()
    with activate(backend, ws) as sandbox, pytest.raises(PiShipError) as caught:
        sandbox.exec("true", timeout=timeout)
    assert caught.value.code == "CONFIG_INVALID"
    assert [r.command for r in backend.requests if r.command == "true"] == []


def test_the_instance_gets_the_deadline_of_the_timeout(ws: Path) -> None:
    backend = DeadlineBackend()
    with activate(backend, ws) as sandbox:
        sandbox.exec("true", timeout=30)
        assert isinstance(backend.instance, DeadlineInstance)
        (deadline,) = backend.instance.deadlines
    assert deadline is not None and deadline.seconds == 30
    remaining = deadline.remaining()
    assert remaining is not None and 0 < remaining <= 30


def test_no_timeout_hands_down_a_deadline_that_never_passes(ws: Path) -> None:
    backend = DeadlineBackend()
    with activate(backend, ws) as sandbox:
        sandbox.exec("true")
        assert isinstance(backend.instance, DeadlineInstance)
        assert backend.instance.deadlines == [Deadline.never()]


@pytest.mark.timeout(10)
def test_a_plain_event_is_bridged_once_and_its_set_cancels_the_command(ws: Path) -> None:
    started = threading.Event()

    def hang(request: ExecRequest, out: Callable[[bytes], None], cancel: threading.Event) -> Any:
        started.set()
        assert cancel.wait(WAIT)
        raise CommandCancelled()

    backend = DeadlineBackend(hang)
    event = threading.Event()
    with activate(backend, ws) as sandbox:
        setter = threading.Thread(target=lambda: started.wait(WAIT) and event.set())
        setter.start()
        with pytest.raises(CommandCancelled):
            sandbox.exec("sleep", cancel=event)
        setter.join(WAIT)
        assert isinstance(backend.instance, DeadlineInstance)
        (token,) = backend.instance.tokens
        assert isinstance(token, CancelToken) and token.is_set()
        assert backend.instance.watchers == [1]


def test_envd_is_told_what_is_left_of_the_deadline(
    prepared: Callable[..., tuple[E2bServer, E2bInstance]],
) -> None:
    clock = FakeClock()
    deadline = Deadline.after(10, clock=clock)
    clock.now += 4  # 6 s left when Start goes out
    mock, instance = prepared()
    instance.exec(ExecRequest("true", cwd="/unused"), deadline=deadline)
    (start,) = mock.find("POST", "/process.Process/Start")
    assert start.headers["connect-timeout-ms"] == "7000"  # 6 s and envd's 1 s of slack


def test_the_router_is_told_what_is_left_of_the_deadline(
    kubernetes_server: Callable[..., KubernetesServer],
    backend_on: Callable[[KubernetesServer], Any],
) -> None:
    clock = FakeClock()
    deadline = Deadline.after(10, clock=clock)
    clock.now += 7.5  # 2.5 s left when the command goes out
    mock = kubernetes_server()
    backend_on(mock).exec(exec_request("true"), deadline=deadline)
    assert mock.find("POST", "/execute")[-1].headers["x-sandbox-timeout"] == "8"


def test_the_mock_client_takes_a_deadline_as_the_time_left_of_it() -> None:
    clock = FakeClock()
    deadline = Deadline.after(10, clock=clock)
    clock.now += 4

    def slow(request: MockRequest) -> MockResponse:
        return MockResponse(200)

    client = MockHttpClient(slow)
    client.request("GET", "https://api.example.com/health", timeout=30, deadline=deadline).close()
    (request,) = client.requests
    assert request.timeout == 6
