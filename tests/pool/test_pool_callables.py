"""A callable task is bounded by its timeout, like a command (DESIGN 1.7).

The callable runs on a ``piship-pool-call-N`` daemon thread. When the timeout (or
``close()``) comes first, the task ends at once: its result says so, its sandbox is
disposed and never handed to another task, and the thread lingers until the callable
returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import CommandTimeout, E2bCompatibleBackend, SandboxPool, TaskResult
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY, exit_as_asked, pool_maker, settled

pytestmark = pytest.mark.timeout(30)
E2bFactory = Callable[..., E2bServer]


def call_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("piship-pool-call-")]


class Stuck:
    """A callable that blocks on item ``"stuck"`` until :attr:`release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.sandboxes: list[str] = []

    def __call__(self, sandbox: Any, item: str) -> str:
        self.sandboxes.append(sandbox.id)
        if item == "stuck":
            self.entered.set()
            assert self.release.wait(20)
        return item


@pytest.fixture
def stuck() -> Iterator[Stuck]:
    task = Stuck()
    yield task
    task.release.set()  # the lingering thread ends with the test
    assert settled(lambda: call_threads() == []), call_threads()


@pytest.fixture
def server(e2b_server: E2bFactory) -> E2bServer:
    return e2b_server(command=exit_as_asked, distinct_ids=True)


@pytest.fixture
def make_pool(server: E2bServer, workspace: Path) -> Iterator[Callable[..., SandboxPool]]:
    backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
    with pool_maker(POLICY, backend, workspace) as make:
        yield make
    backend.close()


def test_a_callable_past_its_timeout_ends_as_timeout_with_its_error(make_pool, stuck) -> None:
    with make_pool(size=1, progress=False) as pool:
        [result] = pool.map(stuck, ["stuck"], timeout=0.3)
    assert result.outcome == "timeout" and result.attempts == 1
    assert isinstance(result.error, CommandTimeout) and str(result.error) == "timeout:0.3"
    assert result.value is None


def test_the_caller_returns_while_the_timed_out_callable_still_runs(make_pool, stuck) -> None:
    with make_pool(size=1, progress=False) as pool:
        [result] = pool.map(stuck, ["stuck"], timeout=0.3)
        assert result.outcome == "timeout" and not stuck.release.is_set()
        [lingering] = call_threads()
        assert lingering.is_alive() and lingering.daemon


def test_a_timed_out_callables_sandbox_is_disposed_not_handed_on(make_pool, stuck, server) -> None:
    with make_pool(size=1, progress=False) as pool:
        timed_out, following = pool.map(stuck, ["stuck", "next"], timeout=0.5)
        assert (timed_out.outcome, following.outcome) == ("timeout", "ok")
        assert following.sandbox_id != timed_out.sandbox_id
        assert timed_out.sandbox_id not in server.live_sandboxes
    assert stuck.sandboxes.count(timed_out.sandbox_id) == 1


def test_a_callable_within_its_timeout_gives_its_value(make_pool) -> None:
    with make_pool(size=2, progress=False) as pool:
        results = pool.map(lambda sandbox, item: item * 2, [1, 2], timeout=10)
    assert [(r.outcome, r.value) for r in results] == [("ok", 2), ("ok", 4)]


def test_callable_tasks_one_after_another_run_on_one_thread(make_pool) -> None:
    def thread_name(sandbox: Any, item: int) -> str:
        return threading.current_thread().name

    with make_pool(size=1, progress=False) as pool:
        names = [result.value for result in pool.map(thread_name, [1, 2, 3])]
    assert len(set(names)) == 1 and names[0].startswith("piship-pool-call-")
    assert settled(lambda: call_threads() == []), call_threads()


def test_close_ends_a_callable_task_that_does_not_return(make_pool, stuck, server) -> None:
    pool = make_pool(size=1, progress=False)
    results: list[TaskResult] = []
    runner = threading.Thread(target=lambda: results.extend(pool.map(stuck, ["stuck"])))
    runner.start()
    assert stuck.entered.wait(10)
    pool.close()
    runner.join(10)
    [result] = results
    assert result.outcome == "cancelled" and "closed" in str(result.error)
    assert server.live_sandboxes == []


def test_a_callable_that_raises_system_exit_gives_its_sandbox_up(make_pool, server) -> None:
    def leave(sandbox: Any, item: str) -> str:
        if item == "exit":
            raise SystemExit(3)
        return sandbox.id

    with make_pool(size=1, progress=False) as pool:
        exited, following = pool.map(leave, ["exit", "next"], timeout=10)
        assert exited.outcome == "unknown" and following.outcome == "ok"
        assert following.value != exited.sandbox_id  # the sandbox was not handed on
        assert exited.sandbox_id not in server.live_sandboxes
