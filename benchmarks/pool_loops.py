"""What the pool scenarios share: a loop that runs N short tasks, and its throughput rows.

A loop runs ``count`` tasks, :data:`POOL_SIZE` at a time, and raises when one failed::

    loops = {"ours-pool-reuse": ("ours", pool_loop(stack, policy, backend, workspace))}
    rows = throughput_rows(context, "pool", "loopback", loops, counters=lambda: {...})

Every loop is warmed up first (imports, first connections, the warm sandboxes), then
timed for ``concurrency_rounds`` rounds in a rotating order; a row's samples are its
rounds' tasks per second, and each counter (requests the server answered, claims
created) is reported per task.
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.clients import quietly
from benchmarks.report import Role, Row, summarize
from benchmarks.rounds import Context
from piship_remote.backends.base import Backend
from piship_remote.pool import SandboxPool

__all__ = [
    "POOL_SIZE",
    "POOL_TASKS",
    "Loop",
    "PoolLoop",
    "map_true",
    "ours_pool_loops",
    "pool_loop",
    "reuse_loop",
    "task_count",
    "threaded",
    "throughput_rows",
    "wait_ready",
]

POOL_TASKS = 64
POOL_SIZE = 8
TINY_TASKS = 16
_SETTLE_POLL = 0.005
Loop = Callable[[int], None]  # runs that many tasks, POOL_SIZE at a time
Loops = Mapping[str, tuple[Role, Loop]]
Counters = Callable[[], Mapping[str, int]]  # cumulative counts, read around each round


def task_count(context: Context) -> int:
    """Tasks per timed round: :data:`POOL_TASKS`, fewer at ``--size tiny``."""
    return POOL_TASKS if context.size.name != "tiny" else TINY_TASKS


def pool_loop(
    stack: contextlib.ExitStack,
    policy: Mapping[str, Any],
    backend: Backend,
    workspace: str,
    **options: Any,
) -> Loop:
    """``SandboxPool(size=POOL_SIZE, **options).map("true", ...)``, closed by ``stack``."""
    pool = SandboxPool(
        policy, backend=backend, workspace=workspace, env={}, size=POOL_SIZE, progress=False,
        **options,
    )  # fmt: skip
    stack.callback(pool.close)
    return PoolLoop(pool, options.get("warm", 0))


def ours_pool_loops(
    stack: contextlib.ExitStack, policy: Mapping[str, Any], backend: Backend, workspace: str
) -> dict[str, tuple[Role, Loop]]:
    """Our two pool rows on ``backend``: ``ours-pool-reuse`` (sandboxes reused) and
    ``ours-pool-fresh-warm`` (a fresh sandbox per task, :data:`POOL_SIZE` activated ahead)."""
    return {
        "ours-pool-reuse": ("ours", pool_loop(stack, policy, backend, workspace)),
        "ours-pool-fresh-warm": (
            "ours",
            pool_loop(stack, policy, backend, workspace, warm=POOL_SIZE, reuse=False),
        ),
    }


def map_true(pool: SandboxPool, count: int) -> None:
    """``pool.map("true", range(count))``, raising when a task did not end ``ok``."""
    failed = [r for r in pool.map("true", range(count)) if r.outcome != "ok"]
    if failed:
        raise RuntimeError(f"{len(failed)} of {count} pool tasks failed: {failed[0].error}")


class PoolLoop:
    """``pool.map("true", range(count))``; :meth:`settle` waits for the warm refills, so
    the creates a round caused are counted in that round, not in the next client's."""

    def __init__(self, pool: SandboxPool, warm: int) -> None:
        self.pool = pool
        self.warm = warm

    def __call__(self, count: int) -> None:
        map_true(self.pool, count)

    def settle(self) -> None:
        wait_ready(self.pool, self.warm)


def wait_ready(pool: SandboxPool, count: int, timeout: float = 60.0) -> None:
    """Wait until ``pool`` holds ``count`` ready sandboxes (its warm ones refilled)."""
    end = time.monotonic() + timeout
    # The pool has no public readiness signal; its supply's counts are read here.
    while pool._supply.counts()[0] < count:
        if time.monotonic() > end:
            raise RuntimeError(f"the pool did not refill {count} warm sandboxes in {timeout} s")
        time.sleep(_SETTLE_POLL)


def threaded(one: Callable[[], None], prefix: str) -> Loop:
    """``one()`` per task in a ``ThreadPoolExecutor`` of :data:`POOL_SIZE` threads: the
    loop users hand-roll around a single-sandbox client."""

    def loop(count: int) -> None:
        with ThreadPoolExecutor(POOL_SIZE, thread_name_prefix=prefix) as executor:
            for future in [executor.submit(one) for _ in range(count)]:
                future.result()

    return loop


def reuse_loop(create: Callable[[], Any], delete: str, stack: contextlib.ExitStack) -> Loop:
    """:data:`POOL_SIZE` sandboxes from ``create()`` (each deleted by its method ``delete``
    when ``stack`` closes); each task runs ``commands.run("true")`` on a free one: the
    reuse loop users hand-roll around a single-sandbox SDK."""
    free: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for _ in range(POOL_SIZE):
        sandbox = create()
        stack.callback(quietly, getattr(sandbox, delete))
        free.put(sandbox)

    def one() -> None:
        sandbox = free.get()
        try:
            sandbox.commands.run("true")
        finally:
            free.put(sandbox)

    return threaded(one, "bench-reuse")


def throughput_rows(
    context: Context, scenario: str, server: str, loops: Loops, *, counters: Counters
) -> list[Row]:
    """One row per loop: tasks/s per round; each counter per task in the row's extra."""
    tasks = task_count(context)
    for _, loop in loops.values():
        loop(POOL_SIZE)  # warm-up
        _settle(loop)
    samples: dict[str, list[float]] = {name: [] for name in loops}
    counted: dict[str, dict[str, int]] = {name: {} for name in loops}
    names = list(loops)
    for index in range(context.size.concurrency_rounds):
        shift = index % len(names)
        for name in (*names[shift:], *names[:shift]):
            before = counters()
            started = time.perf_counter()
            loops[name][1](tasks)
            samples[name].append(tasks / (time.perf_counter() - started))
            _settle(loops[name][1])
            after = counters()
            for key, value in after.items():
                counted[name][key] = counted[name].get(key, 0) + value - before.get(key, 0)
    done = tasks * context.size.concurrency_rounds
    return [
        summarize(
            scenario,
            server,
            name,
            role,
            samples[name],
            unit="tasks/s",
            group=f"{tasks} tasks, {POOL_SIZE} at a time",
            higher_is_better=True,
            extra={key: round(value / done, 2) for key, value in counted[name].items()},
        )
        for name, (role, _) in loops.items()
    ]


def _settle(loop: Loop) -> None:
    if isinstance(loop, PoolLoop):
        loop.settle()
