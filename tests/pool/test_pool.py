"""``SandboxPool``: tasks over many sandboxes, on the E2B double (DESIGN 1.7)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import E2bCompatibleBackend, PiShipError, SandboxPool, TaskResult
from piship_remote.model.errors import SANDBOX_UNAVAILABLE
from piship_remote.testing import E2bServer
from tests.support.pool import POLICY, exit_as_asked, pool_maker, pool_threads, script, settled

pytestmark = pytest.mark.timeout(30)
E2bFactory = Callable[..., E2bServer]


@pytest.fixture
def server(e2b_server: E2bFactory) -> E2bServer:
    return e2b_server(command=exit_as_asked, distinct_ids=True)


@pytest.fixture
def backend(server: E2bServer) -> Iterator[E2bCompatibleBackend]:
    with E2bCompatibleBackend(endpoint=server.url, envd_url=server.url) as backend:
        yield backend


@pytest.fixture
def make_pool(
    backend: E2bCompatibleBackend, workspace: Path
) -> Iterator[Callable[..., SandboxPool]]:
    with pool_maker(POLICY, backend, workspace) as make:
        yield make


def test_the_pool_and_its_result_are_public_names() -> None:
    import piship_remote

    assert "SandboxPool" in piship_remote.__all__ and "TaskResult" in piship_remote.__all__
    assert piship_remote.SandboxPool is SandboxPool


def test_map_gives_one_result_per_item_in_item_order(make_pool) -> None:
    with make_pool(size=3) as pool:
        results = pool.map("echo item-{item}", range(7))
    assert [r.item for r in results] == list(range(7))
    assert [r.outcome for r in results] == ["ok"] * 7
    assert all(f"item-{r.item}" in r.value.stdout for r in results)


def test_a_non_zero_exit_is_failed_with_its_result_and_never_retried(make_pool, server) -> None:
    with make_pool(size=2) as pool:
        [result] = pool.map("exit-with-{item}", [3])
    assert (result.outcome, result.value.exit_code, result.attempts) == ("failed", 3, 1)
    assert len([s for s in _starts(server) if "exit-with-3" in s]) == 1


def test_a_callable_task_gets_the_sandbox_and_its_value_is_the_result(make_pool) -> None:
    with make_pool(size=2) as pool:
        results = pool.map(lambda sandbox, item: (item, sandbox.id), ["a", "b"])
    assert [r.value[0] for r in results] == ["a", "b"]
    assert all(r.value[1] == r.sandbox_id for r in results)


def test_a_callable_that_raises_is_failed_once(make_pool) -> None:
    calls: list[int] = []

    def task(sandbox: Any, item: int) -> None:
        calls.append(item)
        raise ValueError(f"bad item {item}")

    with make_pool(size=2) as pool:
        [result] = pool.map(task, [1])
    assert result.outcome == "failed" and isinstance(result.error, ValueError)
    assert calls == [1] and result.attempts == 1


def test_imap_yields_each_result_as_it_finishes(make_pool) -> None:
    release = threading.Event()

    def task(sandbox: Any, item: str) -> str:
        if item == "slow":
            assert release.wait(10)
        return item

    with make_pool(size=2) as pool:
        results = pool.imap(task, ["slow", "fast"])
        first = next(results)
        release.set()
        rest = list(results)
    assert first.item == "fast" and [r.item for r in rest] == ["slow"]


def test_no_more_than_size_sandboxes_exist_at_once(make_pool, server) -> None:
    most = 0
    lock = threading.Lock()

    def task(sandbox: Any, item: int) -> None:
        nonlocal most
        with lock:
            most = max(most, len(server.live_sandboxes))

    with make_pool(size=3, reuse=False) as pool:
        results = pool.map(task, range(12))
    assert [r.outcome for r in results] == ["ok"] * 12
    assert 1 <= most <= 3


def test_warm_sandboxes_are_activated_at_construction_and_refilled(make_pool, server) -> None:
    pool = make_pool(size=3, warm=2)
    assert settled(lambda: len(server.live_sandboxes) == 2)
    with pool.sandbox() as leased:
        assert settled(lambda: len(server.live_sandboxes) == 3)
        assert leased.id in server.live_sandboxes


def test_without_reuse_every_task_gets_a_fresh_sandbox_disposed_after(make_pool, server) -> None:
    with make_pool(size=2, reuse=False) as pool:
        results = pool.map("echo {item}", range(4))
        ids = [r.sandbox_id for r in results]
        assert len(set(ids)) == 4
        assert settled(lambda: not set(ids) & set(server.live_sandboxes))


def test_with_reuse_a_sandbox_serves_task_after_task(make_pool) -> None:
    with make_pool(size=1) as pool:
        results = pool.map("echo {item}", range(3))
    assert len({r.sandbox_id for r in results}) == 1


def test_reset_runs_in_a_sandbox_before_it_is_reused(make_pool, server) -> None:
    with make_pool(size=1, reset="reset-the-sandbox") as pool:
        pool.map("echo {item}", range(2))
    order = [s for s in _starts(server) if s in ("echo 0", "reset-the-sandbox", "echo 1")]
    assert order[:3] == ["echo 0", "reset-the-sandbox", "echo 1"]


def test_a_failed_reset_disposes_the_sandbox(make_pool, server) -> None:
    with make_pool(size=1, reset="exit-with-1") as pool:
        first, second = pool.map("echo {item}", range(2))
    assert first.sandbox_id != second.sandbox_id
    assert first.sandbox_id not in server.live_sandboxes


def test_a_leased_sandbox_goes_back_to_the_pool(make_pool) -> None:
    with make_pool(size=1) as pool:
        with pool.sandbox() as first:
            first_id = first.id
        with pool.sandbox() as second:
            assert second.id == first_id


def test_a_lease_that_waits_too_long_says_the_pool_had_none(make_pool) -> None:
    with make_pool(size=1) as pool, pool.sandbox():
        with pytest.raises(PiShipError) as raised, pool.sandbox(timeout=0.1):
            pass
    assert raised.value.code == SANDBOX_UNAVAILABLE and "pool" in str(raised.value)


def test_a_task_waiting_past_its_timeout_for_a_sandbox_times_out(make_pool) -> None:
    with make_pool(size=1) as pool, pool.sandbox():
        [result] = pool.map("echo {item}", [1], timeout=0.1)
    assert result.outcome == "timeout" and result.attempts == 1


def test_close_is_idempotent_and_leaves_no_sandbox_and_no_thread(make_pool, server) -> None:
    pool = make_pool(size=3, warm=3)
    assert settled(lambda: len(server.live_sandboxes) == 3)
    pool.map("echo {item}", range(5))
    pool.close()
    pool.close()
    assert server.live_sandboxes == []
    assert settled(lambda: pool_threads() == []), pool_threads()


def test_close_ends_a_running_task_with_an_error_that_says_closed(
    e2b_server: E2bFactory, workspace: Path
) -> None:
    started = threading.Event()

    def hang(start: dict[str, Any]) -> dict[str, Any]:
        started.set()
        return {"hang": True}

    server = e2b_server(command=hang, distinct_ids=True)
    backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
    pool = SandboxPool(POLICY, backend=backend, workspace=workspace, env={}, size=1)
    results: list[TaskResult] = []
    runner = threading.Thread(target=lambda: results.extend(pool.map("sleep {item}", [60])))
    runner.start()
    assert started.wait(10)
    pool.close()  # returns without waiting for the task
    runner.join(10)
    [result] = results
    assert result.outcome == "cancelled" and "closed" in str(result.error)
    assert server.live_sandboxes == []
    backend.close()


def test_map_after_close_is_refused(make_pool) -> None:
    pool = make_pool(size=1)
    pool.close()
    with pytest.raises(PiShipError, match="closed"):
        pool.map("echo {item}", [1])


def test_map_may_be_called_from_several_threads_at_once(make_pool) -> None:
    outcomes: list[list[str]] = []
    with make_pool(size=2) as pool:

        def call(first: int) -> None:
            outcomes.append([r.outcome for r in pool.map("echo {item}", range(first, first + 4))])

        callers = [threading.Thread(target=call, args=(n * 10,)) for n in range(3)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join(20)
    assert outcomes == [["ok"] * 4] * 3


def test_map_calls_run_on_the_same_task_thread(make_pool) -> None:
    def task_threads() -> list[str]:
        return [name for name in pool_threads() if name.startswith("piship-pool-task-")]

    with make_pool(size=1) as pool:
        pool.map("echo {item}", [1])
        first = task_threads()
        pool.map("echo {item}", [2])
        assert len(first) == 1 and task_threads() == first


def test_pool_threads_are_named_and_daemon(make_pool) -> None:
    pool = make_pool(size=2, warm=1)
    names = {t.name: t.daemon for t in threading.enumerate() if t.name.startswith("piship-pool")}
    assert names and all(names.values())
    pool.close()


def _starts(server: E2bServer) -> list[str]:
    """The script of every command the double was asked to start, in order."""
    found = []
    for request in server.requests:
        if request.path == "/process.Process/Start":
            body = request.body[5:]  # one Connect envelope: flags and length first
            found.append(script(json.loads(body)))
    return found


def test_labels_go_into_every_e2b_sandboxs_metadata(make_pool, server) -> None:
    with make_pool(size=2, reuse=False, labels={"run": "nightly-7"}) as pool:
        pool.map("echo {item}", range(3))
    creates = [json.loads(r.body) for r in server.requests if r.path == "/sandboxes"]
    assert len(creates) == 3
    assert all(body["metadata"]["run"] == "nightly-7" for body in creates)
    assert all(body["metadata"]["created-by"] == "piship" for body in creates)


def test_a_label_a_service_would_refuse_is_a_config_error(make_pool) -> None:
    with pytest.raises(PiShipError) as raised:
        make_pool(labels={"run id": "x"})
    assert raised.value.code == "CONFIG_INVALID"


def test_the_create_throttle_gives_each_create_the_next_slot() -> None:
    from piship_remote.pool._throttle import CreateThrottle

    throttle = CreateThrottle(rate=10.0, clock=lambda: 100.0)
    stop = threading.Event()
    assert throttle.wait_turn(stop, deadline=None)  # slot 100.0: at once
    assert throttle.wait_turn(stop, deadline=None)  # slot 100.1: after 0.1 s
    assert not throttle.wait_turn(stop, deadline=100.15)  # slot 100.2 is past the deadline


def test_max_create_rate_spaces_the_pools_creates(make_pool) -> None:
    import time

    started = time.monotonic()
    with make_pool(size=3, reuse=False, max_create_rate=10.0) as pool:
        results = pool.map("echo {item}", range(3))
    assert [r.outcome for r in results] == ["ok"] * 3
    assert time.monotonic() - started >= 0.2  # three creates, 0.1 s apart at least


@pytest.mark.parametrize(
    "options",
    [{"size": 0}, {"size": 2, "warm": 3}, {"max_attempts": 0}, {"max_create_rate": 0}],
)
def test_impossible_sizes_and_rates_are_config_errors(make_pool, options) -> None:
    with pytest.raises(PiShipError) as raised:
        make_pool(**options)
    assert raised.value.code == "CONFIG_INVALID"


def test_the_api_key_travels_only_in_its_header(e2b_server: E2bFactory, workspace: Path) -> None:
    from piship_remote.testing import leaks

    key = "pool-api-key-SENTINEL"
    server = e2b_server(api_key=key, distinct_ids=True)
    backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url, credential=lambda: key)
    with backend, SandboxPool(POLICY, backend=backend, workspace=workspace, env={}) as pool:
        assert [r.outcome for r in pool.map("echo {item}", range(3))] == ["ok"] * 3
    assert leaks(server.requests, key, ["x-api-key"]) == []


def test_a_maps_commands_start_no_thread_to_watch_its_cancel(make_pool) -> None:
    with make_pool(size=2) as pool:
        results = pool.map("echo item-{item}", range(4))
        watchers = [t.name for t in threading.enumerate() if t.name == "piship-cancel-watch"]
    assert [r.outcome for r in results] == ["ok"] * 4
    assert watchers == []
