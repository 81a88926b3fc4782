"""A pool checks the service's health once, and again after any failure (issue 31).

A single activation checks health before every create; a pool keeps a passing answer
for its later creates, forgets it at any failure, and never keeps a failed one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import E2bCompatibleBackend, SandboxPool
from piship_remote.backends.base import Availability
from piship_remote.model.redact import Redactor
from piship_remote.pool import _health
from piship_remote.pool._health import HealthOnce
from piship_remote.testing import CLAIMS, Cluster, E2bServer, KubernetesServer
from tests.support.pool import K8S_POLICY, POLICY, cluster_backend, exit_as_asked, settled

pytestmark = pytest.mark.timeout(30)
E2bFactory = Callable[..., E2bServer]
UP = Availability(True)
DOWN = Availability(False, "the service answered 503")


class Service:
    """A backend whose health answers are given in turn (the last one repeats), counted;
    with ``gate`` set, each check waits for it first."""

    id = "counted"
    provider = "test"

    def __init__(self, *answers: Availability, gate: threading.Event | None = None) -> None:
        self.redactor = Redactor()
        self._answers = list(answers)
        self._gate = gate
        self.checks = 0
        self.checking = threading.Event()

    def available(self) -> Availability:
        self.checks += 1
        self.checking.set()
        if self._gate is not None:
            assert self._gate.wait(10)
        return self._answers.pop(0) if len(self._answers) > 1 else self._answers[0]


def test_a_passing_check_serves_every_create_after_it() -> None:
    service = Service(UP)
    health = HealthOnce(service)  # type: ignore[arg-type]
    answers = [health.backend.available() for _ in range(3)]
    assert answers == [UP] * 3 and service.checks == 1


def test_a_failed_check_is_not_kept_and_the_next_create_checks_again() -> None:
    service = Service(DOWN, UP)
    health = HealthOnce(service)  # type: ignore[arg-type]
    assert health.available() == DOWN
    assert health.available() == UP
    assert health.available() == UP
    assert service.checks == 2


def test_after_a_failure_the_next_create_checks_again() -> None:
    service = Service(UP)
    health = HealthOnce(service)  # type: ignore[arg-type]
    health.available()
    health.forget()
    health.available()
    health.available()
    assert service.checks == 2


def test_a_failed_activation_makes_the_next_create_check_again() -> None:
    service = Service(UP)
    health = HealthOnce(service)  # type: ignore[arg-type]

    def activate() -> None:
        health.available()
        raise RuntimeError("the create was refused")

    with pytest.raises(RuntimeError):
        health.watch(activate)
    health.available()
    assert service.checks == 2


class Followers:
    """How many creates wait for a check in flight (the one that checks never waits)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        followers = self

        class Watched(threading.Event):
            def wait(self, timeout: float | None = None) -> bool:
                followers.count += 1
                return super().wait(timeout)

        class Check(_health._Check):
            def __init__(self, failures: int) -> None:
                super().__init__(failures)
                self.done = Watched()

        monkeypatch.setattr(_health, "_Check", Check)


def concurrent_answers(
    health: HealthOnce, creates: int
) -> tuple[list[threading.Thread], list[Availability]]:
    answers: list[Availability] = []
    threads = [
        threading.Thread(target=lambda: answers.append(health.available())) for _ in range(creates)
    ]
    for thread in threads:
        thread.start()
    return threads, answers


def test_creates_that_come_while_a_check_is_in_flight_share_its_answer(monkeypatch) -> None:
    followers = Followers(monkeypatch)
    gate = threading.Event()
    service = Service(UP, gate=gate)
    health = HealthOnce(service)  # type: ignore[arg-type]
    threads, answers = concurrent_answers(health, 3)
    assert settled(lambda: followers.count == 2)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert answers == [UP] * 3 and service.checks == 1


def test_creates_that_waited_for_a_failed_check_are_stopped_by_it(monkeypatch) -> None:
    followers = Followers(monkeypatch)
    gate = threading.Event()
    service = Service(DOWN, UP, gate=gate)
    health = HealthOnce(service)  # type: ignore[arg-type]
    threads, answers = concurrent_answers(health, 2)
    assert settled(lambda: followers.count == 1)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert answers == [DOWN, DOWN] and service.checks == 1


def test_a_check_that_began_before_a_failure_is_not_kept() -> None:
    gate = threading.Event()
    service = Service(UP, gate=gate)
    health = HealthOnce(service)  # type: ignore[arg-type]
    first = threading.Thread(target=health.available)
    first.start()
    assert service.checking.wait(10)
    health.forget()  # a sandbox broke while the check was on the wire
    gate.set()
    first.join(10)
    health.available()
    assert service.checks == 2


# -- on the E2B double -----------------------------------------------------------------


@pytest.fixture
def make_pool(
    e2b_server: E2bFactory, workspace: Path
) -> Iterator[Callable[..., tuple[E2bServer, SandboxPool]]]:
    closing: list[Any] = []

    def make(*, health: int = 204, **options: Any) -> tuple[E2bServer, SandboxPool]:
        server = e2b_server(command=exit_as_asked, distinct_ids=True, health=health)
        backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
        pool = SandboxPool(POLICY, backend=backend, workspace=workspace, env={}, **options)
        closing.extend([pool, backend])
        return server, pool

    yield make
    for thing in closing:
        thing.close()


def test_a_pool_checks_the_services_health_once_for_all_its_creates(make_pool) -> None:
    server, pool = make_pool(size=3, reuse=False, progress=False)
    with pool:
        results = pool.map("echo {item}", range(6))
    assert [r.outcome for r in results] == ["ok"] * 6
    assert server.count("POST", "/sandboxes") == 6
    assert server.count("GET", "/health") == 1


def test_a_failed_create_makes_the_next_create_check_the_health_again(make_pool) -> None:
    server, pool = make_pool(size=1, progress=False)
    server.faults.fail_creates(1, status=500, retry_after=None)
    with pool:
        [result] = pool.map("echo {item}", ["x"])
    assert (result.outcome, result.attempts) == ("ok", 2)
    assert server.count("GET", "/health") == 2


def test_an_unhealthy_service_stops_every_create(make_pool) -> None:
    server, pool = make_pool(health=503, size=1, max_attempts=2, progress=False)
    with pool:
        results = pool.map("echo {item}", range(3))
    assert [r.outcome for r in results] == ["infra"] * 3
    assert all("503" in str(r.error) for r in results)
    assert server.count("POST", "/sandboxes") == 0
    assert server.count("GET", "/health") == 6  # every attempt asked: a failure is never kept


def test_a_sandbox_that_broke_under_a_task_makes_the_next_create_check_again(make_pool) -> None:
    server, pool = make_pool(size=1, progress=False)

    def task(sandbox: Any, item: str) -> str:
        if item == "break":
            server.kill(sandbox.id)
        return sandbox.run("echo {item}").stdout

    with pool:
        broken, fine = pool.map(task, ["break", "fine"])
    assert (broken.outcome, fine.outcome) == ("unknown", "ok")
    assert server.count("GET", "/health") == 2


def test_a_kubernetes_pool_lists_claims_for_its_health_once(
    kubernetes_server: Callable[..., KubernetesServer], workspace: Path
) -> None:
    server = kubernetes_server(
        lambda _: {"stdout": "ran\n", "exit_code": 0}, Cluster(real_router=True)
    )
    backend = cluster_backend(server)
    with backend, SandboxPool(
        K8S_POLICY, backend=backend, workspace=workspace, env={}, size=2, reuse=False,
        progress=False,
    ) as pool:  # fmt: skip
        results = pool.map("echo {item}", range(4))
    assert [r.outcome for r in results] == ["ok"] * 4
    assert server.count("POST", CLAIMS) == 4
    assert server.count("GET", f"{CLAIMS}?limit=1") == 1


def test_creates_that_waited_for_a_check_that_raised_ask_on_their_own(monkeypatch) -> None:
    followers = Followers(monkeypatch)
    gate = threading.Event()
    service = Service(UP, gate=gate)
    raised = threading.Event()
    first_check = service.available

    def raising_once() -> Availability:
        if not raised.is_set():
            raised.set()
            assert gate.wait(10)
            raise RuntimeError("a bug in the backend's check")
        return first_check()

    service.available = raising_once  # type: ignore[method-assign]
    health = HealthOnce(service)  # type: ignore[arg-type]
    leader_saw: list[BaseException] = []

    def lead() -> None:
        try:
            health.available()
        except RuntimeError as error:
            leader_saw.append(error)

    leader = threading.Thread(target=lead)
    leader.start()
    assert raised.wait(10)
    threads, answers = concurrent_answers(health, 1)
    assert settled(lambda: followers.count == 1)
    gate.set()
    for thread in [leader, *threads]:
        thread.join(10)
    assert [str(e) for e in leader_saw] == ["a bug in the backend's check"]
    assert answers == [UP] and service.checks == 1


def test_an_optional_policy_that_cannot_be_enforced_is_a_failed_create_not_a_sandbox(
    e2b_server: E2bFactory, workspace: Path
) -> None:
    server = e2b_server(command=exit_as_asked, health=503)
    backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
    optional = {**POLICY, "required": False}
    with backend, SandboxPool(
        optional, backend=backend, workspace=workspace, env={}, size=1, progress=False
    ) as pool:
        [result] = pool.map("echo {item}", ["x"])
    assert (result.outcome, result.attempts) == ("infra", 2)  # never started: retried
    assert "could be activated" in str(result.error)
