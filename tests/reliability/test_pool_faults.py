"""``SandboxPool`` under faults: only work that never started runs again, on another
sandbox; an unknown outcome is never re-run; a broken sandbox is never handed on; close()
and Ctrl-C leave no sandbox and no thread behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import (
    E2bCompatibleBackend,
    SandboxPool,
    TaskResult,
)
from piship_remote.testing import CLAIMS, Cluster, E2bServer, KubernetesServer
from tests.support.pool import (
    K8S_POLICY,
    POLICY,
    cluster_backend,
    pool_maker,
    pool_threads,
    script,
    settled,
)

pytestmark = pytest.mark.timeout(30)
REPO = Path(__file__).resolve().parents[2]
E2bFactory = Callable[..., E2bServer]


class Commands:
    """The E2B double's answers (to live sandboxes only): ``hang`` in a script hangs (and
    is announced), ``fail`` exits 2; ``ran`` lists every script run."""

    def __init__(self) -> None:
        self.hanging = threading.Event()
        self.ran: list[str] = []

    def __call__(self, start: dict[str, Any]) -> dict[str, Any]:
        text = script(start)
        self.ran.append(text)
        if "hang" in text:
            self.hanging.set()
            return {"hang": True}
        if "fail" in text:
            return {"stdout": text + "\n", "exit_code": 2}
        return {"stdout": text + "\n"}


@pytest.fixture
def commands() -> Commands:
    return Commands()


@pytest.fixture
def server(e2b_server: E2bFactory, commands: Commands) -> E2bServer:
    return e2b_server(command=commands, distinct_ids=True)


@pytest.fixture
def make_pool(server: E2bServer, workspace: Path) -> Iterator[Callable[..., SandboxPool]]:
    backend = E2bCompatibleBackend(
        endpoint=server.url, envd_url=server.url, idempotent_creates=True
    )
    with pool_maker(POLICY, backend, workspace) as make:
        yield make
    backend.close()
    assert settled(lambda: pool_threads() == []), pool_threads()


def starts_of(server: E2bServer, text: str) -> int:
    """How many commands whose script contains ``text`` the double was asked to start."""
    bodies = [r.body[5:] for r in server.requests if r.path == "/process.Process/Start"]
    return sum(text in script(json.loads(body)) for body in bodies)


def test_a_refused_create_is_infra_and_the_task_runs_on_another_sandbox(make_pool, server) -> None:
    server.faults.fail_creates(1, status=500, retry_after=None)
    with make_pool(size=2) as pool:
        [result] = pool.map("echo {item}", ["x"])
    assert (result.outcome, result.attempts) == ("ok", 2)


def test_every_create_refused_is_infra_after_max_attempts(make_pool, server) -> None:
    server.faults.fail_creates(5, status=500, retry_after=None)
    with make_pool(size=2, max_attempts=3) as pool:
        [result] = pool.map("echo {item}", ["x"])
    assert (result.outcome, result.attempts) == ("infra", 3)
    assert "creating the sandbox failed" in str(result.error)


def test_a_sandbox_killed_before_the_command_started_is_retried_on_another(
    make_pool, server, commands
) -> None:
    pool = make_pool(size=2)
    with pool.sandbox() as ready:  # activated, then back in the pool
        killed = ready.id
    server.kill(killed)
    [result] = pool.map("echo {item}", ["x"])
    assert (result.outcome, result.attempts) == ("ok", 2)
    assert result.sandbox_id != killed
    assert commands.ran.count("echo x") == 1


def test_a_sandbox_killed_after_the_command_started_is_unknown_and_never_rerun(
    make_pool, server, commands
) -> None:
    pool = make_pool(size=2)
    results: list[TaskResult] = []
    runner = threading.Thread(target=lambda: results.extend(pool.map("hang {item}", ["x"])))
    runner.start()
    assert commands.hanging.wait(10)
    [victim] = server.live_sandboxes
    server.kill(victim)
    runner.join(15)
    [result] = results
    assert (result.outcome, result.attempts, result.sandbox_id) == ("unknown", 1, victim)
    assert starts_of(server, "hang x") == 1


def test_a_dropped_command_stream_is_unknown_and_its_sandbox_not_reused(make_pool, server) -> None:
    with make_pool(size=1) as pool:
        with pool.sandbox():  # activated (its readiness check passed), then back
            server.faults.drop_stream_after_output()
        first, second = pool.map("echo {item}", ["a", "b"])
        assert (first.outcome, first.attempts) == ("unknown", 1)
        assert second.outcome == "ok" and second.sandbox_id != first.sandbox_id
        assert first.sandbox_id not in server.live_sandboxes
    assert starts_of(server, "echo a") == 1


def test_a_command_stream_cut_and_followed_again_ends_ok_not_unknown(make_pool, server) -> None:
    with make_pool(size=1) as pool:
        with pool.sandbox():  # activated (its readiness check passed), then back
            server.faults.cut_streams_after(3)
        [result] = pool.map("echo {item}", ["a"])
        assert (result.outcome, result.attempts) == ("ok", 1)
    assert starts_of(server, "echo a") == 1


def test_a_failing_command_stream_cut_and_followed_again_ends_failed_not_unknown(
    make_pool, server
) -> None:
    with make_pool(size=1) as pool:
        with pool.sandbox():  # activated (its readiness check passed), then back
            server.faults.cut_streams_after(3)
        [result] = pool.map("fail {item}", ["a"])
        assert (result.outcome, result.attempts) == ("failed", 1)
    assert starts_of(server, "fail a") == 1


def test_close_with_tasks_running_ends_them_as_closed_and_leaves_nothing(
    make_pool, server, commands
) -> None:
    pool = make_pool(size=2, warm=2)
    results: list[TaskResult] = []
    runner = threading.Thread(target=lambda: results.extend(pool.map("hang {item}", [1, 2, 3])))
    runner.start()
    assert commands.hanging.wait(10)
    pool.close()
    runner.join(15)
    assert [r.outcome for r in results] == ["cancelled"] * 3
    assert all("closed" in str(r.error) for r in results)
    assert server.live_sandboxes == []


CTRL_C_SCRIPT = textwrap.dedent(
    """
    import sys
    from piship_remote import E2bCompatibleBackend, SandboxPool

    url, workspace = sys.argv[1:3]
    backend = E2bCompatibleBackend(endpoint=url, envd_url=url)
    policy = {"required": True, "network": {"mode": "deny"}}
    with SandboxPool(policy, backend=backend, workspace=workspace, size=3, progress=False) as pool:
        print("started", flush=True)
        pool.map("hang {item}", range(6))
    print("not reached", flush=True)
    """
)


@pytest.mark.timeout(40)
@pytest.mark.usefixtures("ctrl_c")
def test_ctrl_c_kills_every_running_command_and_disposes_every_sandbox(
    tmp_path: Path, workspace: Path, server: E2bServer, commands: Commands
) -> None:
    child = tmp_path / "pool_map.py"
    child.write_text(CTRL_C_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    process = subprocess.Popen(
        [sys.executable, str(child), server.url, str(workspace)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    try:
        assert process.stdout.readline().strip() == "started"
        assert settled(lambda: starts_of(server, "hang") == 3, timeout=10)
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode in (1, -signal.SIGINT, 130), stderr[-2000:]
    assert "KeyboardInterrupt" in stderr and "not reached" not in stdout
    assert server.live_sandboxes == []
    assert starts_of(server, "hang") == 3


# -- Kubernetes ------------------------------------------------------------------------


@pytest.fixture
def cluster_pool(
    kubernetes_server: Callable[..., KubernetesServer], workspace: Path
) -> Iterator[tuple[KubernetesServer, Callable[..., SandboxPool]]]:
    cluster = Cluster(real_router=True)
    server = kubernetes_server(lambda command: {"stdout": "ran\n", "exit_code": 0}, cluster)
    backend = cluster_backend(server)
    with pool_maker(K8S_POLICY, backend, workspace) as make:
        yield server, make
    backend.close()
    assert settled(lambda: pool_threads() == []), pool_threads()


def test_kubernetes_map_runs_every_item_and_deletes_every_claim(cluster_pool) -> None:
    server, make = cluster_pool
    with make(size=2, warm=1) as pool:
        results = pool.map("echo {item}", range(4))
    assert [r.outcome for r in results] == ["ok"] * 4
    assert server.live_claims == []


def test_kubernetes_a_refused_claim_is_infra_then_retried(cluster_pool) -> None:
    server, make = cluster_pool
    server.faults.fail_creates(1, status=500, retry_after=None)
    with make(size=2) as pool:
        [result] = pool.map("echo {item}", ["x"])
    assert (result.outcome, result.attempts) == ("ok", 2)
    assert server.live_claims == []


def test_kubernetes_a_router_that_cannot_connect_is_infra_then_retried(cluster_pool) -> None:
    server, make = cluster_pool
    with make(size=2) as pool:
        with pool.sandbox() as ready:
            unreachable = ready.id
        server.cluster.router_gone.add(unreachable)
        [result] = pool.map("echo {item}", ["x"])
    assert (result.outcome, result.attempts) == ("ok", 2)
    assert result.sandbox_id != unreachable
    assert server.live_claims == []


# -- creates: lost answers and a full service ------------------------------------------


def test_a_lost_create_answer_is_repeated_with_its_key_and_makes_one_sandbox(
    make_pool, server
) -> None:
    server.faults.lose_create_answer()
    with make_pool(size=1) as pool:
        [result] = pool.map("echo {item}", ["x"])
        assert (result.outcome, result.attempts) == ("ok", 1)
        creates = server.find("POST", "/sandboxes")
        assert len({c.headers["idempotency-key"] for c in creates}) == 1 < len(creates)
        assert server.live_sandboxes == [result.sandbox_id]
    assert server.live_sandboxes == []


def test_a_create_refused_for_capacity_waits_and_is_not_a_failed_attempt(
    make_pool, server
) -> None:
    server.faults.fail_creates(4, status=429, retry_after=0)
    with make_pool(size=1, max_attempts=1) as pool:
        [result] = pool.map("echo {item}", ["x"], timeout=20)
    assert (result.outcome, result.attempts) == ("ok", 1)
    assert server.count("POST", "/sandboxes") == 5


def test_waiting_for_capacity_ends_at_the_task_timeout(make_pool, server) -> None:
    server.faults.fail_creates(100, status=429, retry_after=None)
    with make_pool(size=1) as pool:
        [result] = pool.map("echo {item}", ["x"], timeout=0.3)
    assert result.outcome == "timeout" and "429" in str(result.error)


def test_kubernetes_a_lost_claim_answer_is_adopted_by_its_name(cluster_pool) -> None:
    server, make = cluster_pool
    server.faults.lose_create_answer()
    with make(size=1) as pool:
        [result] = pool.map("echo {item}", ["x"])
        assert (result.outcome, result.attempts) == ("ok", 1)
        assert server.live_claims == [result.sandbox_id]
    assert server.live_claims == []


def test_kubernetes_a_claim_refused_for_capacity_waits(cluster_pool) -> None:
    server, make = cluster_pool
    server.faults.fail_creates(2, status=429, retry_after=0)
    with make(size=1, max_attempts=1) as pool:
        [result] = pool.map("echo {item}", ["x"], timeout=20)
    assert (result.outcome, result.attempts) == ("ok", 1)


def test_kubernetes_labels_go_on_every_claim(cluster_pool) -> None:
    server, make = cluster_pool
    with make(size=2, labels={"run": "nightly-7"}) as pool:
        pool.map("echo {item}", range(2))
    claims = [json.loads(r.body) for r in server.find("POST", CLAIMS)]
    assert claims and all(c["metadata"]["labels"]["run"] == "nightly-7" for c in claims)


# -- Kubernetes: after the command started, and close() ---------------------------------


@pytest.fixture
def hanging_cluster(
    kubernetes_server: Callable[..., KubernetesServer], workspace: Path
) -> Iterator[tuple[KubernetesServer, Commands, Callable[..., SandboxPool]]]:
    """A cluster whose router drops the connection of a command with ``drop`` in it, and
    holds one with ``hang`` until the server closes; ``Commands`` sees every command."""
    commands = Commands()

    def execute(command: str) -> dict[str, Any]:
        answer = commands({"process": {"args": ["/bin/bash", "-l", "-c", command]}})
        if "drop" in command:
            return {"drop": True}
        return {"hang": True} if answer.get("hang") else {"stdout": "ran\n", "exit_code": 0}

    server = kubernetes_server(execute, Cluster(real_router=True))
    backend = cluster_backend(server)
    with pool_maker(K8S_POLICY, backend, workspace) as make:
        yield server, commands, make
    backend.close()
    assert settled(lambda: pool_threads() == []), pool_threads()


def test_kubernetes_a_command_lost_after_it_was_sent_is_unknown_and_never_rerun(
    hanging_cluster,
) -> None:
    server, commands, make = hanging_cluster
    with make(size=1) as pool:
        lost, after = pool.map("echo {item}", ["drop", "fine"])
        assert (lost.outcome, lost.attempts) == ("unknown", 1)
        assert after.outcome == "ok" and after.sandbox_id != lost.sandbox_id
        assert lost.sandbox_id not in server.live_claims
    assert sum("echo drop" in ran for ran in commands.ran) == 1
    assert server.live_claims == []


def test_kubernetes_close_with_tasks_running_ends_them_as_closed_and_deletes_every_claim(
    hanging_cluster,
) -> None:
    server, commands, make = hanging_cluster
    pool = make(size=2, warm=2)
    results: list[TaskResult] = []
    runner = threading.Thread(target=lambda: results.extend(pool.map("hang {item}", [1, 2, 3])))
    runner.start()
    assert commands.hanging.wait(10)
    pool.close()
    runner.join(15)
    assert [r.outcome for r in results] == ["cancelled"] * 3
    assert all("closed" in str(r.error) for r in results)
    assert server.live_claims == []
