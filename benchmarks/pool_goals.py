"""The pool targets, checked against the rows of one run.

At the 20 ms round trip, 64 short tasks 8 at a time: on E2B the pool reusing its
sandboxes at least 3x the official SDK's create-per-task loop and at least its
hand-rolled reuse loop, fresh-with-warm at least the create-per-task loop; on the
Kubernetes double reuse at least 3x and fresh-with-warm at least 1x the official
client's create-per-task loop. At 0 and 20 ms: the first command from a warm pool
within 1.2x one ``exec``, and the client's CPU per task at 32 sandboxes within 25 % of
that at 8::

    goals = pool_goals(rows)       # one Goal per target, client and round trip
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from benchmarks import pool, pool_first_command, pool_kubernetes, pool_scale
from benchmarks.pool_loops import POOL_SIZE, POOL_TASKS
from benchmarks.report import Goal, Row

__all__ = ["pool_goals"]

ROUND_TRIP_MS = 20
ROUND_TRIPS_MS = (0, 20)
_BATCH = f"{POOL_TASKS} tasks, {POOL_SIZE} at a time"
_FIRST_COMMAND = ("ours-pool-lease", "ours-pool-map", "ours-pool-fresh-warm")
_FLAT = 0.25


def _goal(
    name: str, client: str, measured: float | None, target: str, passes: Callable[[float], bool]
) -> Goal:
    if measured is None or math.isnan(measured):
        return Goal(name, client, None, target, None)
    return Goal(name, client, measured, target, passes(measured))


def _at_least(bound: float) -> tuple[str, Callable[[float], bool]]:
    return f">= {bound:.2f}x", lambda value: value >= bound


def pool_goals(rows: Iterable[Row]) -> list[Goal]:
    """One goal per pool target (``passed=None`` when not measured)."""
    found = {row.key: row for row in rows}

    def ratio(scenario: str, server: str, client: str, floor: bool = False) -> float | None:
        row = found.get((scenario, server, ROUND_TRIP_MS, _BATCH, client))
        if row is None:
            return None
        return row.ratio_floor if floor else row.ratio_reference

    at = f"at {ROUND_TRIP_MS} ms RTT"
    sdk, official = "the SDK's", "the official Kubernetes client's"
    checks = (
        (f"pool tasks/s vs {sdk} create-per-task loop {at}", "ours-pool-reuse",
         ratio(pool.NAME, pool.SERVER, "ours-pool-reuse"), 3.0),
        (f"pool tasks/s vs {sdk} reuse loop {at}", "ours-pool-reuse",
         ratio(pool.NAME, pool.SERVER, "ours-pool-reuse", floor=True), 1.0),
        (f"pool tasks/s vs {sdk} create-per-task loop {at}", "ours-pool-fresh-warm",
         ratio(pool.NAME, pool.SERVER, "ours-pool-fresh-warm"), 1.0),
        (f"Kubernetes pool tasks/s vs {official} create-per-task loop {at}", "ours-pool-reuse",
         ratio(pool_kubernetes.NAME, pool_kubernetes.SERVER, "ours-pool-reuse"), 3.0),
        (f"Kubernetes pool tasks/s vs {official} create-per-task loop {at}",
         "ours-pool-fresh-warm",
         ratio(pool_kubernetes.NAME, pool_kubernetes.SERVER, "ours-pool-fresh-warm"), 1.0),
    )  # fmt: skip
    goals = [_goal(name, client, value, *_at_least(bound)) for name, client, value, bound in checks]
    for rtt in ROUND_TRIPS_MS:
        for client in _FIRST_COMMAND:
            row = found.get((pool_first_command.NAME, pool_first_command.SERVER, rtt, "", client))
            goals.append(
                _goal(
                    f"first command from a warm pool vs one exec at {rtt} ms RTT",
                    client,
                    None if row is None else row.ratio_reference,
                    "<= 1.20x",
                    lambda value: value <= 1.2,
                )
            )
        goals.append(
            _goal(
                f"client CPU per task, 32 sandboxes over 8, at {rtt} ms RTT",
                pool_scale.CLIENT,
                _cpu_growth(found, rtt),
                f"{1 - _FLAT:.2f}x to {1 + _FLAT:.2f}x",
                lambda value: abs(value - 1) <= _FLAT,
            )
        )
    return goals


def _cpu_growth(found: dict[tuple[str, str, int, str, str], Row], rtt: int) -> float | None:
    def cpu(level: int) -> float | None:
        key = (pool_scale.NAME, pool_scale.SERVER, rtt, pool_scale.CPU_GROUP.format(level))
        row = found.get((*key, pool_scale.CLIENT))
        return None if row is None else row.median

    eight, thirty_two = cpu(8), cpu(32)
    if not eight or thirty_two is None:
        return None
    return thirty_two / eight
