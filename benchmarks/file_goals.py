"""The file targets, checked against the rows of one run at 0 ms and at the 20 ms round trip.

Single-file upload and download at least the official SDK's MB/s and half the raw
socket's; a workspace push within twice its floor (``tar c`` into one raw POST);
resident growth at most 32 MiB while a file of ``--size`` (1 GiB at ``full``) goes up
and comes back::

    goals = file_goals(rows)       # one Goal per target and round trip
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from benchmarks import file_transfer, push
from benchmarks.report import Goal, Row

__all__ = ["ROUND_TRIPS_MS", "file_goals"]

ROUND_TRIPS_MS = (0, 20)
_OURS = "ours-sandbox"


def _goal(
    name: str, measured: float | None, target: str, passes: Callable[[float], bool]
) -> Goal:
    if measured is None or math.isnan(measured):
        return Goal(name, _OURS, None, target, None)
    return Goal(name, _OURS, measured, target, passes(measured))


def file_goals(rows: Iterable[Row]) -> list[Goal]:
    """One goal per file target and round trip (``passed=None`` when not measured)."""
    ours = {
        (row.scenario, row.rtt_ms, row.group): row
        for row in rows
        if row.client == _OURS and row.server == file_transfer.SERVER
    }
    goals: list[Goal] = []
    for rtt in ROUND_TRIPS_MS:
        for direction in ("upload", "download"):
            row = ours.get((file_transfer.NAME, rtt, direction))
            goals.append(
                _goal(
                    f"file {direction} MB/s vs SDK at {rtt} ms RTT",
                    None if row is None else row.ratio_reference,
                    ">= 1.00x",
                    lambda v: v >= 1.0,
                )
            )
            goals.append(
                _goal(
                    f"file {direction} MB/s vs raw socket at {rtt} ms RTT",
                    None if row is None else row.ratio_floor,
                    ">= 0.50x",
                    lambda v: v >= 0.5,
                )
            )
        pushed = ours.get((push.NAME, rtt, ""))
        goals.append(
            _goal(
                f"push vs tar c into one raw POST at {rtt} ms RTT",
                None if pushed is None else pushed.ratio_floor,
                "<= 2.00x",
                lambda v: v <= 2.0,
            )
        )
        memory = ours.get((file_transfer.NAME, rtt, file_transfer.RSS_GROUP))
        goals.append(
            _goal(
                f"RSS growth moving a file up and back at {rtt} ms RTT",
                None if memory is None else memory.median,
                "<= 32 MiB",
                lambda v: v <= 32,
            )
        )
    return goals
