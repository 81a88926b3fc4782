"""Results: rows of summarised samples, their ratios, the printed table and the JSON file.

>>> row = summarize("exec", "loopback", "ours", "ours", [0.002, 0.001, 0.003], unit="ms")
>>> row.median
2.0
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import attrs
import cattrs

__all__ = [
    "Goal",
    "Machine",
    "Report",
    "Role",
    "Row",
    "ScenarioResult",
    "format_table",
    "percentile",
    "read_rows",
    "summarize",
    "with_ratios",
    "write_json",
]

Role = Literal["ours", "reference", "floor"]
Extra = Mapping[str, "float | int | str"]
_SCALES = {"ms": 1e3, "us": 1e6, "s": 1.0}


def percentile(values: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile by linear interpolation (``nan`` for no values).

    >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5)
    2.5
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@attrs.frozen
class Row:
    """One client's summarised samples in one scenario (and group, e.g. ``threads=8``).

    ``median``/``p90``/``p99`` are in ``unit``; the ratios divide this row's median
    by the reference's and the floor's of the same scenario, server, round trip and
    group. ``rtt_ms`` is the round trip the delay proxy added (0: straight to the server).
    """

    scenario: str
    server: str
    client: str
    role: Role
    unit: str
    n: int
    median: float
    p90: float
    p99: float
    higher_is_better: bool = False
    group: str = ""
    ratio_reference: float | None = None
    ratio_floor: float | None = None
    extra: Extra = attrs.field(factory=dict)
    rtt_ms: int = 0

    @property
    def key(self) -> tuple[str, str, int, str, str]:
        """What identifies this row across runs: scenario, server, RTT, group, client."""
        return (self.scenario, self.server, self.rtt_ms, self.group, self.client)


def summarize(
    scenario: str,
    server: str,
    client: str,
    role: Role,
    samples: Sequence[float],
    *,
    unit: str,
    group: str = "",
    higher_is_better: bool = False,
    extra: Extra | None = None,
) -> Row:
    """A row from raw samples; seconds are scaled to ``unit`` when it is ms/us/s."""
    scale = _SCALES.get(unit, 1.0)
    scaled = [value * scale for value in samples]
    return Row(
        scenario=scenario,
        server=server,
        client=client,
        role=role,
        unit=unit,
        n=len(scaled),
        median=percentile(scaled, 0.5),
        p90=percentile(scaled, 0.9),
        p99=percentile(scaled, 0.99),
        higher_is_better=higher_is_better,
        group=group,
        extra=dict(extra or {}),
    )


def with_ratios(rows: Iterable[Row]) -> tuple[Row, ...]:
    """Each row with its median divided by its reference's and its floor's."""
    rows = tuple(rows)
    anchors: dict[tuple[str, str, int, str, str], float] = {}
    for row in rows:
        if row.role != "ours":
            anchors.setdefault(
                (row.scenario, row.server, row.rtt_ms, row.group, row.role), row.median
            )

    def ratio(row: Row, role: str) -> float | None:
        anchor = anchors.get((row.scenario, row.server, row.rtt_ms, row.group, role))
        if anchor is None or anchor == 0 or math.isnan(anchor) or math.isnan(row.median):
            return None
        return row.median / anchor

    return tuple(
        attrs.evolve(row, ratio_reference=ratio(row, "reference"), ratio_floor=ratio(row, "floor"))
        for row in rows
    )


@attrs.frozen
class ScenarioResult:
    """What one scenario measured, what it skipped (with why) and what to know about it."""

    name: str
    rows: tuple[Row, ...] = ()
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    seconds: float = 0.0
    rtt_ms: int = 0

    @property
    def label(self) -> str:
        """The name, with the round trip when the delay proxy was in front."""
        return f"{self.name}@{self.rtt_ms}ms" if self.rtt_ms else self.name


@attrs.frozen
class Goal:
    """One target of the brief, checked against a row: ``passed`` is ``None`` when unmeasured."""

    name: str
    client: str
    value: float | None
    target: str
    passed: bool | None


@attrs.frozen
class Machine:
    """Where the numbers come from."""

    nproc: int
    cpu_model: str
    platform: str
    python: str
    versions: Mapping[str, str]
    base64_decoder: str = ""  # what decoded the E2B stream's output (pybase64 or binascii)


@attrs.frozen
class Report:
    """The whole run, as written to the JSON file.

    ``load_average`` is the 1/5/15-minute load when the run began and when it ended.
    """

    command: str
    size: str
    machine: Machine
    scenarios: tuple[ScenarioResult, ...]
    goals: tuple[Goal, ...]
    leftover_threads: tuple[str, ...]
    seconds: float
    started: str = ""
    rtts_ms: tuple[int, ...] = (0,)
    load_average: tuple[tuple[float, float, float], ...] = ()


_CONVERTER = cattrs.Converter()
_CONVERTER.register_unstructure_hook(
    float, lambda value: None if math.isnan(value) or math.isinf(value) else value
)


def write_json(report: Report, path: Path) -> None:
    """Write ``report`` as indented JSON (``NaN`` written as ``null``)."""
    text = json.dumps(_CONVERTER.unstructure(report), indent=2)
    path.write_text(text + "\n", encoding="utf-8")


def read_rows(path: Path) -> tuple[Row, ...]:
    """The rows of a JSON report written by :func:`write_json` (older ones included)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    rows: list[Row] = []
    for scenario in data.get("scenarios", []):
        for row in scenario.get("rows", []):
            known = {name: row[name] for name in _ROW_FIELDS if name in row}
            for name in ("median", "p90", "p99"):
                known[name] = _float(row.get(name))
            rows.append(Row(**known))
    return tuple(rows)


_ROW_FIELDS = tuple(field.name for field in attrs.fields(Row))


def _float(value: object) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


_COLUMNS = (
    "scenario",
    "server",
    "rtt",
    "group",
    "client",
    "n",
    "median",
    "p90",
    "p99",
    "unit",
    "x ref",
    "x floor",
    "notes",
)


def format_table(scenarios: Iterable[ScenarioResult], goals: Iterable[Goal]) -> str:
    """One plain-text table of every row, then the skipped parts and the goals."""
    lines: list[tuple[str, ...]] = [_COLUMNS]
    skipped: list[str] = []
    notes: list[str] = []
    for scenario in scenarios:
        lines.extend(_cells(row) for row in scenario.rows)
        skipped.extend(f"{scenario.label}: {reason}" for reason in scenario.skipped)
        notes.extend(f"{scenario.label}: {note}" for note in scenario.notes)
    widths = [max(len(line[i]) for line in lines) for i in range(len(_COLUMNS) - 1)]
    text = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
        + "  "
        + line[-1]
        for line in lines
    ]
    text.insert(1, "-" * len(text[0]))
    if skipped:
        text += ["", "skipped:"] + [f"  {line}" for line in skipped]
    if notes:
        text += ["", "notes:"] + [f"  {line}" for line in notes]
    text += ["", "goals:"] + [f"  {_goal_line(goal)}" for goal in goals]
    return "\n".join(line.rstrip() for line in text)


def _cells(row: Row) -> tuple[str, ...]:
    notes = ", ".join(f"{key}={_number(value)}" for key, value in row.extra.items())
    return (
        row.scenario,
        row.server,
        f"{row.rtt_ms} ms",
        row.group,
        f"{row.client} ({row.role})",
        str(row.n),
        _number(row.median),
        _number(row.p90),
        _number(row.p99),
        row.unit,
        _ratio(row.ratio_reference),
        _ratio(row.ratio_floor),
        notes,
    )


def _number(value: float | int | str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "-"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _goal_line(goal: Goal) -> str:
    verdict = {True: "PASS", False: "FAIL", None: "n/a "}[goal.passed]
    value = "-" if goal.value is None else _number(goal.value)
    return f"[{verdict}] {goal.name} ({goal.client}): {value} (target {goal.target})"
