"""Time to first command from a warm pool, against one ``exec`` on an active sandbox.

On the fast loopback server (E2B; behind the delay proxy at a non-zero round trip),
each sample is the time from asking for the work to the first command's result:

- ``ours-sandbox`` (the reference): ``Sandbox.exec("true")`` on a sandbox activated
  before; the one round trip a command cannot avoid;
- ``ours-pool-lease``: ``with pool.sandbox() as sandbox: sandbox.exec("true")`` on a pool
  with a ready sandbox (``warm=1``), up to the command's result;
- ``ours-pool-map``: ``pool.map(task, [item])`` on that pool, up to the moment the
  command's result is back inside the task (the map's own return comes after);
- ``ours-pool-fresh-warm``: the same on a ``reuse=False, warm=1`` pool: a fresh sandbox
  activated ahead; between samples the pool is given the time to refill it.

Clients take turns in alternating rounds. Goal: each pool row at most 1.2x the
reference (``x ref``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import attrs

from benchmarks.clients import activate_e2b, ours_backend
from benchmarks.pool_loops import wait_ready
from benchmarks.report import Role, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate
from piship_remote.pool import SandboxPool
from piship_remote.sandbox.activation import Sandbox

__all__ = ["NAME", "SERVER", "run"]

NAME = "pool_first_command"
SERVER = "loopback"
_DENY = {"required": True, "network": {"mode": "deny"}}


@attrs.define  # not frozen: rounds.Named wants a plain ``name`` attribute
class _Client:
    name: str
    role: Role
    first_command: Callable[[], float]  # seconds from asking to the first command's result


def run(context: Context) -> ScenarioResult:
    """One row per client: time to the first command's result, in ms."""
    began = time.perf_counter()
    samples_per_client = context.size.rtt_exec_calls
    with contextlib.ExitStack() as stack:
        clients = _clients(context, stack)
        for client in clients:
            client.first_command()  # warm-up: first connections, the warm sandbox
        samples = alternate(
            clients, rounds=samples_per_client, measure=lambda c: [c.first_command()]
        )
    rows = [
        summarize(NAME, SERVER, client.name, client.role, samples[client.name], unit="ms")
        for client in clients
    ]
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        notes=(
            "time from asking for the work to the first command's result (true); reference = "
            "one exec on a sandbox activated before; the pools hold one ready sandbox",
        ),
        seconds=time.perf_counter() - began,
    )


def _clients(context: Context, stack: contextlib.ExitStack) -> list[_Client]:
    backend = ours_backend(context.url, stack)
    workspace = context.workspace
    sandbox = activate_e2b(backend, workspace)
    stack.callback(sandbox.dispose)

    def pool(**options: Any) -> SandboxPool:
        made = SandboxPool(
            _DENY, backend=backend, workspace=workspace, env={}, size=1, warm=1,
            progress=False, **options,
        )  # fmt: skip
        stack.callback(made.close)
        return made

    reused, fresh = pool(), pool(reuse=False)
    return [
        _Client("ours-sandbox", "reference", lambda: _timed_exec(sandbox)),
        _Client("ours-pool-lease", "ours", lambda: _leased(reused)),
        _Client("ours-pool-map", "ours", lambda: _mapped(reused)),
        _Client("ours-pool-fresh-warm", "ours", lambda: _mapped(fresh)),
    ]


def _timed_exec(sandbox: Sandbox) -> float:
    started = time.perf_counter()
    _check(sandbox.exec("true").exit_code)
    return time.perf_counter() - started


def _leased(pool: SandboxPool) -> float:
    wait_ready(pool, 1)
    started = time.perf_counter()
    with pool.sandbox() as sandbox:
        _check(sandbox.exec("true").exit_code)
        return time.perf_counter() - started


def _mapped(pool: SandboxPool) -> float:
    wait_ready(pool, 1)

    def task(sandbox: Sandbox, _: object) -> float:
        _check(sandbox.exec("true").exit_code)
        return time.perf_counter()

    started = time.perf_counter()
    [result] = pool.map(task, [0])
    if result.outcome != "ok":
        raise RuntimeError(f"the pool task ended {result.outcome}: {result.error}")
    answered: float = result.value
    return answered - started


def _check(exit_code: int | None) -> None:
    if exit_code != 0:
        raise RuntimeError(f"true exited {exit_code}")
