"""``--compare BASELINE.json``: each row's change against a saved run, regressions marked.

Rows are matched on scenario, server, round trip, group and client. A row whose
median moved the wrong way by more than :data:`THRESHOLD` (10 %; lower is better
except for rows marked ``higher_is_better``) is a ``REGRESSION``, one that
moved the right way by as much is ``better``::

    print(format_changes(compare(current_rows, read_rows(Path("base.json")))))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import attrs

from benchmarks.report import Row

__all__ = ["THRESHOLD", "Change", "compare", "format_changes"]

THRESHOLD = 0.10

RowKey = tuple[str, str, int, str, str]


@attrs.frozen
class Change:
    """One row's median now against the baseline's; ``ratio`` is now / baseline."""

    key: RowKey
    unit: str
    before: float | None
    after: float | None
    ratio: float | None
    verdict: str
    """``REGRESSION``, ``better``, ``same``, ``new`` (not in the baseline) or ``gone``."""


def _verdict(ratio: float | None, higher_is_better: bool) -> str:
    if ratio is None:
        return "same"
    worse = ratio < 1 - THRESHOLD if higher_is_better else ratio > 1 + THRESHOLD
    better = ratio > 1 + THRESHOLD if higher_is_better else ratio < 1 - THRESHOLD
    return "REGRESSION" if worse else "better" if better else "same"


def _number(value: float) -> float | None:
    return None if math.isnan(value) else value


def _change(now: Row | None, then: Row | None) -> Change:
    shown = now if now is not None else then
    assert shown is not None
    before = None if then is None else _number(then.median)
    after = None if now is None else _number(now.median)
    ratio = None if before is None or after is None or before == 0 else after / before
    if then is None:
        verdict = "new"
    elif now is None:
        verdict = "gone"
    else:
        verdict = _verdict(ratio, shown.higher_is_better)
    return Change(shown.key, shown.unit, before, after, ratio, verdict)


def compare(current: Iterable[Row], baseline: Iterable[Row]) -> tuple[Change, ...]:
    """Every row of either run, in the current run's order, then the baseline's leftovers.

    Baseline rows of a scenario and round trip this run did not measure (``--only``,
    ``--rtt``) are left out rather than reported ``gone``.
    """
    now = {row.key: row for row in current}
    measured = {(key[0], key[2]) for key in now}
    then = {row.key: row for row in baseline if (row.scenario, row.rtt_ms) in measured}
    keys = [*now, *(key for key in then if key not in now)]
    return tuple(_change(now.get(key), then.get(key)) for key in keys)


_HEAD = ("scenario", "server", "rtt", "group", "client", "unit", "baseline", "now", "x", "change")


def _cells(change: Change) -> tuple[str, ...]:
    scenario, server, rtt, group, client = change.key
    return (
        scenario,
        server,
        f"{rtt} ms",
        group,
        client,
        change.unit,
        _value(change.before),
        _value(change.after),
        "-" if change.ratio is None else f"{change.ratio:.2f}",
        "-" if change.ratio is None else f"{(change.ratio - 1) * 100:+.0f}%",
    )


def _value(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def format_changes(changes: Sequence[Change]) -> str:
    """A plain-text table of the changes, the verdict last, and a count of regressions."""
    lines = [_HEAD, *(_cells(change) for change in changes)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(_HEAD))]
    verdicts = ["", *(change.verdict for change in changes)]
    text = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        + f"  {verdict}"
        for line, verdict in zip(lines, verdicts, strict=True)
    ]
    text.insert(1, "-" * len(text[0]))
    regressions = sum(change.verdict == "REGRESSION" for change in changes)
    text.append(f"\n{regressions} regression(s) beyond {THRESHOLD:.0%} against the baseline")
    return "\n".join(line.rstrip() for line in text)
