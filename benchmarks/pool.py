"""Many sandboxes: ``pool.map`` against the loops users write around the official SDK.

Each client runs ``POOL_TASKS`` short tasks (``true``), ``POOL_SIZE`` at a time, on the
fast loopback server (E2B), and its throughput (tasks/s) is one sample per round:

- ``ours-pool-reuse``: ``SandboxPool(size=8).map`` (sandboxes reused, as users will);
- ``ours-pool-fresh-warm``: ``SandboxPool(size=8, warm=8, reuse=False)``: a fresh sandbox
  per task, activated ahead;
- ``ours-loop-per-task``: ``activate_sandbox`` → ``exec`` → ``dispose`` per task in a
  ``ThreadPoolExecutor``, what the pool replaces;
- ``e2b-sdk-per-task`` (the reference): ``Sandbox.create`` → ``commands.run`` → ``kill``
  per task in a ``ThreadPoolExecutor``, the way the SDK's users hand-roll it;
- ``e2b-sdk-reuse`` (in the floor column): eight SDK sandboxes made first, each task run on
  a free one: the SDK's hand-rolled reuse loop.

So a row's ``ratio_reference`` is its throughput over the SDK's create-per-task loop
(goal for reuse: 3x or more) and ``ratio_floor`` over the SDK's reuse loop (goal: 1.0x or
more). The Kubernetes rows are :mod:`benchmarks.pool_kubernetes`, time to first command
:mod:`benchmarks.pool_first_command`, the scale curve :mod:`benchmarks.pool_scale`.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from benchmarks.clients import API_KEY, SDK_MISSING, activate_e2b, load_sdk, ours_backend
from benchmarks.pool_loops import Loop, ours_pool_loops, reuse_loop, threaded, throughput_rows
from benchmarks.report import Role, ScenarioResult, with_ratios
from benchmarks.rounds import Context

__all__ = ["NAME", "SERVER", "run"]

NAME = "pool"
SERVER = "loopback"
_DENY = {"required": True, "network": {"mode": "deny"}}


def run(context: Context) -> ScenarioResult:
    """One row per client: tasks per second over ``concurrency_rounds`` rounds."""
    began = time.perf_counter()
    skipped: list[str] = []
    with contextlib.ExitStack() as stack:
        loops = _loops(context, stack, skipped)
        rows = throughput_rows(
            context,
            NAME,
            SERVER,
            loops,
            counters=lambda: {"requests": context.loopback.request_count()},
        )
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped),
        notes=(
            "throughput of short tasks (true); requests = requests the server answered per "
            "task, creates and deletes included; reference = the official SDK's create-per-task "
            "ThreadPoolExecutor loop, floor column = the SDK's hand-rolled reuse loop",
        ),
        seconds=time.perf_counter() - began,
    )


def _loops(
    context: Context, stack: contextlib.ExitStack, skipped: list[str]
) -> dict[str, tuple[Role, Loop]]:
    backend = ours_backend(context.url, stack)
    workspace = context.workspace

    def per_task() -> None:
        with activate_e2b(backend, workspace) as sandbox:
            sandbox.exec("true")

    loops = ours_pool_loops(stack, _DENY, backend, workspace)
    loops["ours-loop-per-task"] = ("ours", threaded(per_task, "bench-loop"))
    sdk = load_sdk()
    if sdk is None:
        skipped.append(f"e2b-sdk loops: {SDK_MISSING}")
        return loops
    loops["e2b-sdk-per-task"] = ("reference", _sdk_per_task(sdk, context.url))
    loops["e2b-sdk-reuse"] = ("floor", _sdk_reuse(sdk, context.url, stack))
    return loops


def _sdk_create(sdk: Any, url: str) -> Any:
    return sdk.Sandbox.create(api_key=API_KEY, api_url=url, sandbox_url=url, validate_api_key=False)


def _sdk_per_task(sdk: Any, url: str) -> Loop:
    def one() -> None:
        sandbox = _sdk_create(sdk, url)
        try:
            sandbox.commands.run("true")
        finally:
            sandbox.kill()

    return threaded(one, "bench-sdk")


def _sdk_reuse(sdk: Any, url: str, stack: contextlib.ExitStack) -> Loop:
    return reuse_loop(lambda: _sdk_create(sdk, url), "kill", stack)
