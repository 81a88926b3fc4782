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
more). Not measured here yet: the Kubernetes rows, time to first command from a warm
pool, and the scale curve on the local service.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.clients import API_KEY, SDK_MISSING, activate_e2b, load_sdk, ours_backend
from benchmarks.report import Role, Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context
from piship_remote.pool import SandboxPool

__all__ = ["NAME", "run"]

NAME = "pool"
POOL_TASKS = 64
POOL_SIZE = 8
_DENY = {"required": True, "network": {"mode": "deny"}}
Loop = Callable[[int], None]  # runs that many tasks, POOL_SIZE at a time


def run(context: Context) -> ScenarioResult:
    """One row per client: tasks per second over ``concurrency_rounds`` rounds."""
    began = time.perf_counter()
    tasks = POOL_TASKS if context.size.name != "tiny" else 16
    skipped: list[str] = []
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        loops = _loops(context, stack, skipped)
        for name, (role, loop) in loops.items():
            loop(POOL_SIZE)  # warm-up: imports, first connections, the warm sandboxes
            samples = []
            before = context.loopback.request_count()
            for _ in range(context.size.concurrency_rounds):
                started = time.perf_counter()
                loop(tasks)
                samples.append(tasks / (time.perf_counter() - started))
            done = tasks * context.size.concurrency_rounds
            requests = (context.loopback.request_count() - before) / done
            rows.append(
                summarize(
                    NAME,
                    "loopback",
                    name,
                    role,
                    samples,
                    unit="tasks/s",
                    group=f"{tasks} tasks, {POOL_SIZE} at a time",
                    higher_is_better=True,
                    extra={"requests": round(requests, 2)},
                )
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

    def pool(**options: Any) -> Loop:
        made = SandboxPool(
            _DENY, backend=backend, workspace=workspace, env={}, size=POOL_SIZE,
            progress=False, **options,
        )  # fmt: skip
        stack.callback(made.close)

        def loop(count: int) -> None:
            failed = [r for r in made.map("true", range(count)) if r.outcome != "ok"]
            if failed:
                raise RuntimeError(f"{len(failed)} pool tasks failed: {failed[0].error}")

        return loop

    def per_task(count: int) -> None:
        def one(_: int) -> None:
            with activate_e2b(backend, workspace) as sandbox:
                sandbox.exec("true")

        with ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="bench-loop") as executor:
            list(executor.map(one, range(count)))

    loops: dict[str, tuple[Role, Loop]] = {
        "ours-pool-reuse": ("ours", pool()),
        "ours-pool-fresh-warm": ("ours", pool(warm=POOL_SIZE, reuse=False)),
        "ours-loop-per-task": ("ours", per_task),
    }
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
    def one(_: int) -> None:
        sandbox = _sdk_create(sdk, url)
        try:
            sandbox.commands.run("true")
        finally:
            sandbox.kill()

    def loop(count: int) -> None:
        with ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="bench-sdk") as executor:
            list(executor.map(one, range(count)))

    return loop


def _sdk_reuse(sdk: Any, url: str, stack: contextlib.ExitStack) -> Loop:
    free: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for _ in range(POOL_SIZE):
        sandbox = _sdk_create(sdk, url)
        stack.callback(_quietly, sandbox.kill)
        free.put(sandbox)

    def one(_: int) -> None:
        sandbox = free.get()
        try:
            sandbox.commands.run("true")
        finally:
            free.put(sandbox)

    def loop(count: int) -> None:
        with ThreadPoolExecutor(POOL_SIZE, thread_name_prefix="bench-sdk") as executor:
            list(executor.map(one, range(count)))

    return loop


def _quietly(action: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):
        action()
