"""The reliability suite's session summary: how many fault-matrix cells passed."""

from __future__ import annotations

import pytest

MATRIX_TEST = "test_fault_matrix.py::test_cell["


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print ``fault matrix: <passed>/<total> cells passed`` when the matrix ran."""
    outcomes: dict[str, str] = {}
    for category, reports in terminalreporter.stats.items():
        for report in reports:
            nodeid = getattr(report, "nodeid", "")
            if MATRIX_TEST not in nodeid:
                continue
            if category in ("failed", "error"):
                outcomes[nodeid] = "failed"
            elif category in ("xfailed", "xpassed", "skipped"):
                outcomes.setdefault(nodeid, category)
            elif category == "passed" and getattr(report, "when", "") == "call":
                outcomes.setdefault(nodeid, "passed")
    if not outcomes:
        return
    counts = {name: sum(v == name for v in outcomes.values()) for name in set(outcomes.values())}
    total = len(outcomes)
    extra = ", ".join(
        f"{counts[k]} {k}" for k in ("xfailed", "failed", "skipped", "xpassed") if counts.get(k)
    )
    line = f"fault matrix: {counts.get('passed', 0)}/{total} cells passed"
    terminalreporter.write_sep("-", line + (f" ({extra})" if extra else ""))
