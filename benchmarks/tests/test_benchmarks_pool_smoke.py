"""The pool scenarios run at ``--size tiny``, straight and behind the delay proxy, with their rows.

No timing is asserted: only that each scenario ran at 0 and 20 ms, produced the rows
of every client it compares (the official Kubernetes client's when it is installed),
and that its goals are listed. The scale curve needs the local service (bubblewrap);
without it the test says why.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
POOL_SCENARIOS = ("pool_kubernetes", "pool_first_command", "pool_scale")
NO_LOCAL_SERVICE = "the local service cannot run here"


@pytest.fixture(scope="module")
def pool_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "pool.json"
    arguments = ["--size", "tiny", "--report-only", "--only", ",".join(POOL_SCENARIOS)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *arguments, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    report: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return report


def _scenarios(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    found = [scenario for scenario in report["scenarios"] if scenario["name"] == name]
    assert {scenario["rtt_ms"] for scenario in found} == {0, 20}, name
    for scenario in found:
        assert not [s for s in scenario["skipped"] if s.startswith("the scenario failed")]
    return found


def _clients(scenario: dict[str, Any]) -> set[str]:
    return {row["client"] for row in scenario["rows"]}


@pytest.mark.timeout(120)
def test_kubernetes_pool_rows_compare_the_pool_with_the_official_clients_loops(
    pool_report: dict[str, Any],
) -> None:
    official = {"k8s-client-per-task", "k8s-client-reuse"}
    for scenario in _scenarios(pool_report, "pool_kubernetes"):
        assert {"ours-pool-reuse", "ours-pool-fresh-warm"} <= _clients(scenario)
        if importlib.util.find_spec("k8s_agent_sandbox") is None:
            assert any("k8s-client" in reason for reason in scenario["skipped"])
        else:
            assert official <= _clients(scenario)
        for row in scenario["rows"]:
            assert row["unit"] == "tasks/s" and row["extra"]["requests"] >= 1


@pytest.mark.timeout(120)
def test_first_command_rows_set_the_pool_against_one_exec(pool_report: dict[str, Any]) -> None:
    for scenario in _scenarios(pool_report, "pool_first_command"):
        rows = {row["client"]: row for row in scenario["rows"]}
        assert set(rows) == {
            "ours-sandbox",
            "ours-pool-lease",
            "ours-pool-map",
            "ours-pool-fresh-warm",
        }
        assert rows["ours-sandbox"]["role"] == "reference"
        assert rows["ours-pool-map"]["ratio_reference"] is not None


@pytest.mark.timeout(120)
def test_scale_rows_give_throughput_and_cpu_per_task_per_level(
    pool_report: dict[str, Any],
) -> None:
    for scenario in _scenarios(pool_report, "pool_scale"):
        reasons = [r for r in scenario["skipped"] if r.startswith(NO_LOCAL_SERVICE)]
        if reasons:
            pytest.skip(reasons[0])
        units = {row["group"]: row["unit"] for row in scenario["rows"]}
        assert units == {
            "sandboxes=1": "tasks/s",
            "sandboxes=1, CPU per task": "ms",
            "sandboxes=2": "tasks/s",
            "sandboxes=2, CPU per task": "ms",
        }


@pytest.mark.timeout(120)
def test_pool_goals_are_listed(pool_report: dict[str, Any]) -> None:
    names = {goal["name"] for goal in pool_report["goals"]}
    assert {
        "Kubernetes pool tasks/s vs the official Kubernetes client's create-per-task loop "
        "at 20 ms RTT",
        "first command from a warm pool vs one exec at 20 ms RTT",
        "client CPU per task, 32 sandboxes over 8, at 0 ms RTT",
    } <= names
