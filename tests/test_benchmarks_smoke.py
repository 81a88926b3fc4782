"""The benchmark harness runs end to end at ``--size tiny`` and writes its JSON report.

No timing is asserted: only that every scenario ran, the report has its keys, and
nothing was left running. Without the official SDK its parts are skipped with a reason.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = {
    "exec_latency",
    "stream_throughput",
    "concurrency",
    "cancellation",
    "memory",
    "activation",
}
ROW_KEYS = {
    "scenario",
    "server",
    "client",
    "role",
    "unit",
    "n",
    "median",
    "p90",
    "p99",
    "higher_is_better",
    "group",
    "ratio_reference",
    "ratio_floor",
    "extra",
}


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--size", "tiny", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    report: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return report


@pytest.mark.timeout(120)
def test_tiny_run_writes_the_report_keys(tiny_report: dict[str, Any]) -> None:
    assert set(tiny_report) >= {
        "command",
        "size",
        "machine",
        "scenarios",
        "goals",
        "leftover_threads",
        "seconds",
    }
    assert tiny_report["size"] == "tiny"
    assert {"nproc", "cpu_model", "python", "versions"} <= set(tiny_report["machine"])


@pytest.mark.timeout(120)
def test_every_scenario_ran_and_has_rows(tiny_report: dict[str, Any]) -> None:
    scenarios = {s["name"]: s for s in tiny_report["scenarios"]}
    assert set(scenarios) == SCENARIOS
    for scenario in scenarios.values():
        assert not [s for s in scenario["skipped"] if s.startswith("the scenario failed")]
        assert scenario["rows"], scenario["name"]
        for row in scenario["rows"]:
            assert set(row) == ROW_KEYS


@pytest.mark.timeout(120)
def test_the_sdk_is_compared_or_skipped_with_a_reason(tiny_report: dict[str, Any]) -> None:
    exec_latency = next(s for s in tiny_report["scenarios"] if s["name"] == "exec_latency")
    clients = {row["client"] for row in exec_latency["rows"]}
    if importlib.util.find_spec("e2b") is None:
        assert any(
            "e2b-sdk" in reason and "not installed" in reason for reason in exec_latency["skipped"]
        )
    else:
        assert "e2b-sdk" in clients
    assert "requests-raw" in clients


@pytest.mark.timeout(120)
def test_no_harness_thread_is_left_running(tiny_report: dict[str, Any]) -> None:
    assert not [name for name in tiny_report["leftover_threads"] if name.startswith("piship-")]


@pytest.mark.timeout(120)
def test_goals_are_listed(tiny_report: dict[str, Any]) -> None:
    names = {goal["name"] for goal in tiny_report["goals"]}
    assert {"exec p50 vs SDK", "stream MB/s vs SDK", "claims created (kubernetes)"} <= names
