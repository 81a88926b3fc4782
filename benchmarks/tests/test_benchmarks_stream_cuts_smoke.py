"""The ``stream_cuts`` scenario at ``--size tiny`` through the harness, and on its own with
two worker processes: every client's row on both servers, cuts and stalls, the exec cost
rows and the goals. No timing and no fraction is asserted: only that the runs were made,
counted and reported. Without the local service (bubblewrap) the scenario says why.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cut_exec_cost import GROUP as EXEC_GROUP
from benchmarks.local_service import unavailable
from benchmarks.sizes import SIZES

ROOT = Path(__file__).resolve().parents[2]
TINY = SIZES["tiny"]

pytestmark = pytest.mark.skipif(
    unavailable() is not None, reason=f"the local service cannot run here: {unavailable()}"
)


def _run(arguments: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "cuts.json"
    done = _run(
        ["benchmarks", "--size", "tiny", "--report-only", "--only", "stream_cuts",
         "--json", str(out)]
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    report: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    (found,) = report["scenarios"]
    found["goals"] = report["goals"]
    return found


def _rows(scenario: dict[str, Any], group: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["server"], r["client"]): r for r in scenario["rows"] if r["group"] == group}


@pytest.mark.timeout(180)
def test_cut_rows_count_every_run_of_every_client_on_both_servers(
    scenario: dict[str, Any],
) -> None:
    rows = _rows(scenario, "cuts 1-3")
    clients = {("local", "ours-sandbox"), ("doubles", "ours-sandbox")}
    clients |= {("local", "e2b-sdk"), ("doubles", "e2b-sdk")}
    assert set(rows) == clients
    for row in rows.values():
        assert row["n"] == row["extra"]["runs"] == TINY.cut_runs
        assert {"complete", "exit_known", "not_once", "cuts", "MB"} <= set(row["extra"])


@pytest.mark.timeout(180)
def test_stall_rows_count_every_stalled_run(scenario: dict[str, Any]) -> None:
    rows = _rows(scenario, "stall")
    assert set(rows) == {
        ("local", "ours-sandbox"),
        ("doubles", "ours-sandbox"),
        ("local", "e2b-sdk"),
    }
    for row in rows.values():
        assert row["extra"]["runs"] == TINY.stall_runs
        assert row["extra"]["stall"] == TINY.stall_runs  # one stall per run


@pytest.mark.timeout(180)
def test_exec_cost_sets_this_library_against_the_one_before_the_reattach(
    scenario: dict[str, Any],
) -> None:
    rows = _rows(scenario, EXEC_GROUP)
    assert rows[("local", "ours-sandbox")]["ratio_reference"] is not None
    assert rows[("local", "ours-before-reattach")]["role"] == "reference"


@pytest.mark.timeout(180)
def test_the_goals_are_listed(scenario: dict[str, Any]) -> None:
    names = [goal["name"] for goal in scenario["goals"]]
    assert "exec p50 with nothing cut vs before the reattach machinery" in names
    assert "cut or stalled commands not started exactly once" in names


@pytest.mark.timeout(180)
def test_on_its_own_the_runs_spread_over_workers_and_progress_is_printed() -> None:
    done = _run(
        ["benchmarks.stream_cuts", "--runs", "3", "--lines", "3000", "--stall-runs", "0",
         "--workers", "2", "--exec-rounds", "1", "--exec-batch", "2"]
    )  # fmt: skip
    assert "ours-sandbox/local/cuts: 3 runs, " in done.stderr
    ours_local = [line for line in done.stdout.splitlines() if "cuts 1-3" in line]
    assert any(" local " in line and "runs=3" in line for line in ours_local), done.stdout
