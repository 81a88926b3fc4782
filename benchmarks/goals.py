"""The targets the harness checks, against the rows of one run.

At a 20 ms round trip (the delay proxy, 10 ms each way): exec p50 at most 1.1x the
official SDK's, and activation to the first result at most 0.8x the SDK's
create-plus-first-command (both once the SDK's process-wide connection pool is warm,
and on a new connection). Straight to the loopback server: exec p50 through
``Sandbox.exec`` at most the SDK's, 32 threads on one sandbox at least the SDK's
commands/s, streams at least 2.5x the SDK's and 0.6x the raw socket's MB/s, and
resident memory growth at most 32 MiB however much is streamed (1 GiB at ``--size full``).
With the ``otel`` extra, a traced command's p50 at most 1.05x an untraced one's, both
straight to the loopback server and at 20 ms. A Python's start in a local template
sandbox at most 1.2x the same Python's on the host (the image's ``.pyc`` files valid).
The file targets are in :mod:`benchmarks.file_goals`, the pool's in :mod:`benchmarks.pool_goals`,
the cut streams' in :func:`benchmarks.stream_cuts.cut_goals`.

>>> [goal.name for goal in evaluate(())][:1]
['exec p50 vs SDK at 20 ms RTT']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from benchmarks.activation import NEW_CONNECTION
from benchmarks.file_goals import file_goals
from benchmarks.pool_goals import pool_goals
from benchmarks.report import Goal, Row, ScenarioResult
from benchmarks.stream_cuts import cut_goals
from benchmarks.template_python import NAME as TEMPLATE_PYTHON
from benchmarks.template_python import SERVER as TEMPLATE_SERVER

__all__ = ["ROUND_TRIP_MS", "evaluate"]

ROUND_TRIP_MS = 20
"""The round trip the round-trip goals are checked at."""

_OURS = ("ours-sandbox", "ours-instance")
_MEMORY = (("ours-sandbox", ""), ("ours-instance", ""), ("ours-sandbox-slow", "slow on_data"))


class _Rows:
    def __init__(self, rows: Sequence[Row]) -> None:
        self._rows = {row.key: row for row in rows}

    def find(
        self,
        scenario: str,
        client: str,
        *,
        rtt_ms: int = 0,
        group: str = "",
        server: str = "loopback",
    ) -> Row | None:
        return self._rows.get((scenario, server, rtt_ms, group, client))


def _goal(
    name: str,
    client: str,
    measured: float | None,
    target: str,
    passes: Callable[[float], bool],
) -> Goal:
    if measured is None or math.isnan(measured):
        return Goal(name, client, None, target, None)
    return Goal(name, client, measured, target, passes(measured))


def _per_s(row: Row | None) -> float | None:
    value = None if row is None else row.extra.get("per_s")
    return float(value) if isinstance(value, int | float) else None


def _throughput_ratio(ours: Row | None, sdk: Row | None) -> float | None:
    mine, theirs = _per_s(ours), _per_s(sdk)
    if mine is None or not theirs:
        return None
    return mine / theirs


def _reference(row: Row | None) -> float | None:
    return None if row is None else row.ratio_reference


def evaluate(scenarios: Iterable[ScenarioResult]) -> tuple[Goal, ...]:
    """One goal per target and client of ours (unmeasured ones have ``passed=None``)."""
    flat = [row for scenario in scenarios for row in scenario.rows]
    rows = _Rows(flat)
    at = ROUND_TRIP_MS
    goals = [
        _goal(
            f"exec p50 vs SDK at {at} ms RTT",
            client,
            _reference(rows.find("exec_latency", client, rtt_ms=at)),
            "<= 1.10x",
            lambda v: v <= 1.1,
        )
        for client in _OURS
    ]
    for group, kept in (("", "kept connections"), (NEW_CONNECTION, NEW_CONNECTION)):
        goals.append(
            _goal(
                f"activation to first result vs SDK create+run at {at} ms RTT, {kept}",
                "ours-sandbox",
                _reference(rows.find("activation", "ours-sandbox", rtt_ms=at, group=group)),
                "<= 0.80x",
                lambda v: v <= 0.8,
            )
        )
    goals.append(
        _goal(
            "exec p50 vs SDK",
            "ours-sandbox",
            _reference(rows.find("exec_latency", "ours-sandbox")),
            "<= 1.00x",
            lambda v: v <= 1.0,
        )
    )
    threads = "threads=32"
    goals.append(
        _goal(
            "32 threads commands/s vs SDK",
            "ours-sandbox",
            _throughput_ratio(
                rows.find("concurrency", "ours-sandbox", group=threads),
                rows.find("concurrency", "e2b-sdk", group=threads),
            ),
            ">= 1.00x",
            lambda v: v >= 1.0,
        )
    )
    stream = rows.find("stream_throughput", "ours-sandbox")
    goals.append(
        _goal(
            "stream MB/s vs SDK", "ours-sandbox", _reference(stream), ">= 2.50x", lambda v: v >= 2.5
        )
    )
    goals.append(
        _goal(
            "stream MB/s vs raw socket",
            "ours-sandbox",
            None if stream is None else stream.ratio_floor,
            ">= 0.60x",
            lambda v: v >= 0.6,
        )
    )
    for client, group in _MEMORY:
        row = rows.find("memory", client, group=group)
        goals.append(
            _goal(
                "RSS growth while streaming",
                client,
                None if row is None else row.median,
                "<= 32 MiB",
                lambda v: v <= 32,
            )
        )
    goals.extend(
        _goal(
            f"exec p50 traced (SDK, exporter dropping spans) vs untraced at {rtt} ms RTT",
            "traced",
            _reference(rows.find("tracing_cost", "traced", rtt_ms=rtt)),
            "<= 1.05x",
            lambda v: v <= 1.05,
        )
        for rtt in (0, at)
    )
    goals.append(
        _goal(
            "python3 start in a local template sandbox vs the host",
            "template",
            _reference(rows.find(TEMPLATE_PYTHON, "template", server=TEMPLATE_SERVER)),
            "<= 1.20x",
            lambda v: v <= 1.2,
        )
    )
    goals.extend(file_goals(flat))
    goals.extend(pool_goals(flat))
    goals.extend(cut_goals(flat))
    return tuple(goals)
