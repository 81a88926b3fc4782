"""The brief's targets, checked against the rows of a run.

>>> [goal.name for goal in evaluate(())][:1]
['exec p50 vs SDK']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from benchmarks.report import Goal, Row, ScenarioResult

__all__ = ["evaluate"]

_OURS = ("ours-sandbox", "ours-instance")


def _find(rows: list[Row], scenario: str, server: str, client: str, group: str = "") -> Row | None:
    for row in rows:
        if (row.scenario, row.server, row.client, row.group) == (scenario, server, client, group):
            return row
    return None


def _goal(
    name: str,
    client: str,
    row: Row | None,
    value: Callable[[Row], float | None],
    target: str,
    passes: Callable[[float], bool],
) -> Goal:
    measured = value(row) if row is not None else None
    if measured is None or math.isnan(measured):
        return Goal(name, client, None, target, None)
    return Goal(name, client, measured, target, passes(measured))


def _extra(key: str) -> Callable[[Row], float | None]:
    def read(row: Row) -> float | None:
        value = row.extra.get(key)
        return float(value) if isinstance(value, int | float) else None

    return read


def evaluate(scenarios: Iterable[ScenarioResult]) -> tuple[Goal, ...]:
    """One goal per target and client of ours (unmeasured ones have ``passed=None``)."""
    rows = [row for scenario in scenarios for row in scenario.rows]
    goals: list[Goal] = []
    for client in _OURS:
        goals.append(
            _goal(
                "exec p50 vs SDK",
                client,
                _find(rows, "exec_latency", "loopback", client),
                lambda r: r.ratio_reference,
                "<= 0.80x",
                lambda v: v <= 0.8,
            )
        )
    for client in _OURS:
        row = _find(rows, "stream_throughput", "loopback", client)
        goals.append(
            _goal(
                "stream MB/s vs SDK",
                client,
                row,
                lambda r: r.ratio_reference,
                ">= 2.00x",
                lambda v: v >= 2.0,
            )
        )
        goals.append(
            _goal(
                "stream MB/s vs raw socket",
                client,
                row,
                lambda r: r.ratio_floor,
                ">= 0.50x",
                lambda v: v >= 0.5,
            )
        )
    for client in _OURS:
        goals.append(
            _goal(
                "cancel p99 to SendSignal",
                client,
                _find(rows, "cancellation", "loopback", client, "to SendSignal"),
                lambda r: r.p99,
                "<= 50 ms",
                lambda v: v <= 50,
            )
        )
        goals.append(
            _goal(
                "cancel p99 to raise",
                client,
                _find(rows, "cancellation", "loopback", client, "to raise"),
                lambda r: r.p99,
                "<= 100 ms",
                lambda v: v <= 100,
            )
        )
    for client in _OURS:
        goals.append(
            _goal(
                "RSS growth while streaming",
                client,
                _find(rows, "memory", "loopback", client),
                lambda r: r.median,
                "<= 32 MiB",
                lambda v: v <= 32,
            )
        )
    goals.append(
        _goal(
            "RSS growth, slow on_data",
            "ours-sandbox-slow",
            _find(rows, "memory", "loopback", "ours-sandbox-slow", "slow on_data"),
            lambda r: r.median,
            "<= 32 MiB",
            lambda v: v <= 32,
        )
    )
    for server in ("loopback", "kubernetes-loopback", "kubernetes"):
        goals.append(
            _goal(
                f"32 threads vs 1 ({server})",
                "ours-sandbox",
                _find(rows, "concurrency", server, "ours-sandbox", "threads=32"),
                _extra("scaling"),
                ">= 4.00x",
                lambda v: v >= 4.0,
            )
        )
    for server in ("kubernetes-loopback", "kubernetes"):
        goals.append(
            _goal(
                f"claims created ({server})",
                "ours-sandbox",
                _find(rows, "concurrency", server, "ours-sandbox", "threads=32"),
                _extra("claims"),
                "== 1",
                lambda v: v == 1,
            )
        )
    return tuple(goals)
