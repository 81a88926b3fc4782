"""The scale curve: 1, 8 and 32 sandboxes at once on the local service (bubblewrap).

For each level a ``SandboxPool(size=N, warm=N)`` (sandboxes reused) is filled and
warmed up with one map of N tasks; then each round maps ``max(64, 4N)`` short tasks
(``true``) and reports, per level:

- tasks per second (group ``sandboxes=N``);
- the client's CPU per task (group ``sandboxes=N, CPU per task``): this process's CPU
  time (``time.process_time``, every thread) over the round, divided by its tasks. The
  service, its sandboxes and the delay proxy run in child processes and are not in it.

The service runs in a child process with its cap on sandboxes raised to the largest
level (its default is 20), behind a delay proxy of its own at a non-zero round trip.
Goal: CPU per task at 32 sandboxes within 25 % of that at 8.
"""

from __future__ import annotations

import contextlib
import time

from benchmarks.file_transfer import served
from benchmarks.local_service import service_backend, unavailable
from benchmarks.pool_loops import POOL_TASKS, map_true, wait_ready
from benchmarks.report import Row, ScenarioResult, summarize
from benchmarks.rounds import Context
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.pool import SandboxPool

__all__ = ["CLIENT", "CPU_GROUP", "LEVELS", "NAME", "SERVER", "run"]

NAME = "pool_scale"
SERVER = "local"
CLIENT = "ours-pool-reuse"
LEVELS = (1, 8, 32)
CPU_GROUP = "sandboxes={}, CPU per task"
_TINY_PLAN = ((1, 4), (2, 4))  # (sandboxes, tasks per round): only that the scenario runs
_DISK_MIB = 64
_DENY = {"required": True, "network": {"mode": "deny"}}


def run(context: Context) -> ScenarioResult:
    """Per level: a tasks/s row and a client-CPU-per-task row."""
    began = time.perf_counter()
    problem = unavailable()
    if problem is not None:
        return ScenarioResult(NAME, skipped=(f"the local service cannot run here: {problem}",))
    plan = _plan(context)
    rows: list[Row] = []
    with (
        served(context, _DISK_MIB, max_sandboxes=max(level for level, _ in plan)) as (
            service,
            url,
        ),
        contextlib.ExitStack() as stack,
    ):
        backend = service_backend(url, service.api_key, stack)
        for level, tasks in plan:
            rows += _level(context, backend, level, tasks)
    return ScenarioResult(
        name=NAME,
        rows=tuple(rows),
        notes=(
            "SandboxPool(size=N, warm=N) reusing its sandboxes on the local service; "
            "CPU per task = this process's CPU time over a round / its tasks (the service "
            "and the proxy are child processes)",
        ),
        seconds=time.perf_counter() - began,
    )


def _plan(context: Context) -> tuple[tuple[int, int], ...]:
    """(sandboxes, tasks per round) for each level."""
    if context.size.name == "tiny":
        return _TINY_PLAN
    return tuple((level, max(POOL_TASKS, 4 * level)) for level in LEVELS)


def _level(context: Context, backend: E2bCompatibleBackend, level: int, tasks: int) -> list[Row]:
    rates: list[float] = []
    cpu_per_task: list[float] = []
    with SandboxPool(
        _DENY, backend=backend, workspace=context.workspace, env={}, size=level, warm=level,
        progress=False,
    ) as pool:  # fmt: skip
        wait_ready(pool, level, timeout=120.0)
        map_true(pool, level)  # warm-up
        for _ in range(context.size.concurrency_rounds):
            cpu, started = time.process_time(), time.perf_counter()
            map_true(pool, tasks)
            rates.append(tasks / (time.perf_counter() - started))
            cpu_per_task.append((time.process_time() - cpu) / tasks)
    group = f"sandboxes={level}"
    return [
        summarize(
            NAME, SERVER, CLIENT, "ours", rates, unit="tasks/s", group=group,
            higher_is_better=True, extra={"tasks": tasks},
        ),
        summarize(
            NAME, SERVER, CLIENT, "ours", cpu_per_task, unit="ms",
            group=CPU_GROUP.format(level), extra={"tasks": tasks},
        ),
    ]  # fmt: skip
