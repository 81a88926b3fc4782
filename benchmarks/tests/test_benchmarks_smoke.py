"""The benchmark harness runs end to end at ``--size tiny`` and writes its JSON report.

No timing is asserted: only that every scenario ran (the round-trip ones also behind
the delay proxy), the report has its keys, nothing was left running, and the exit
status follows the goals. Without the official SDK its parts are skipped with a reason.
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
SCENARIOS = {
    "exec_latency",
    "stream_throughput",
    "concurrency",
    "cancellation",
    "memory",
    "activation",
    "file_transfer",
    "push",
    "pool",
    "pool_kubernetes",
    "pool_first_command",
    "pool_scale",
    "tracing_cost",
    "template_python_start",
    "sandboxd",
    "stream_cuts",
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
    "rtt_ms",
}
ROUND_TRIP_SCENARIOS = {"exec_latency", "concurrency", "activation", "pool", "pool_kubernetes"}
FILE_SCENARIOS = {"file_transfer", "push"}  # measured at every round trip too
# also at every round trip; their rows count no requests, pool_scale needs the local service
POOL_SCENARIOS = {"pool_first_command", "pool_scale"}
TRACING_SCENARIOS = {"tracing_cost"}  # at every round trip; skipped without the otel SDK
SANDBOXD_SCENARIOS = {"sandboxd"}  # skipped without the sandboxd extra
NO_LOCAL_SERVICE = "the local service cannot run here"


def _bench(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "--size", "tiny", *arguments],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    done = _bench("--json", str(out), "--report-only")
    assert done.returncode == 0, done.stderr[-2000:] + done.stdout[-2000:]
    report: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return report


@pytest.mark.timeout(180)
def test_tiny_run_writes_the_report_keys(tiny_report: dict[str, Any]) -> None:
    assert set(tiny_report) >= {
        "command",
        "size",
        "machine",
        "scenarios",
        "goals",
        "leftover_threads",
        "seconds",
        "started",
        "rtts_ms",
        "load_average",
    }
    assert tiny_report["size"] == "tiny"
    assert {"nproc", "cpu_model", "python", "versions"} <= set(tiny_report["machine"])


@pytest.mark.timeout(180)
def test_every_scenario_ran_and_has_rows(tiny_report: dict[str, Any]) -> None:
    scenarios = {s["name"]: s for s in tiny_report["scenarios"]}
    assert set(scenarios) == SCENARIOS
    for scenario in scenarios.values():
        assert not [s for s in scenario["skipped"] if s.startswith("the scenario failed")]
        local = FILE_SCENARIOS | {"pool_scale", "template_python_start", "stream_cuts"}
        if scenario["name"] in local and _without_local_service(scenario):
            continue
        if scenario["name"] in TRACING_SCENARIOS and _without_otel_sdk(scenario):
            continue
        if scenario["name"] in SANDBOXD_SCENARIOS and _without_sandboxd_extra(scenario):
            continue
        assert scenario["rows"], scenario["name"]
        for row in scenario["rows"]:
            assert set(row) == ROW_KEYS


@pytest.mark.timeout(180)
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


@pytest.mark.timeout(180)
def test_pool_rows_compare_the_pool_with_the_sdks_hand_rolled_loops(
    tiny_report: dict[str, Any],
) -> None:
    pool = next(s for s in tiny_report["scenarios"] if s["name"] == "pool")
    clients = {row["client"] for row in pool["rows"]}
    assert {"ours-pool-reuse", "ours-pool-fresh-warm", "ours-loop-per-task"} <= clients
    if importlib.util.find_spec("e2b") is None:
        assert any("e2b-sdk" in reason for reason in pool["skipped"])
    else:
        assert {"e2b-sdk-per-task", "e2b-sdk-reuse"} <= clients


@pytest.mark.timeout(180)
def test_no_harness_thread_is_left_running(tiny_report: dict[str, Any]) -> None:
    assert not [name for name in tiny_report["leftover_threads"] if name.startswith("piship-")]


@pytest.mark.timeout(180)
def test_goals_are_listed(tiny_report: dict[str, Any]) -> None:
    names = {goal["name"] for goal in tiny_report["goals"]}
    assert {
        "exec p50 vs SDK at 20 ms RTT",
        "activation to first result vs SDK create+run at 20 ms RTT, kept connections",
        "activation to first result vs SDK create+run at 20 ms RTT, new connection",
        "exec p50 vs SDK",
        "32 threads commands/s vs SDK",
        "stream MB/s vs SDK",
        "stream MB/s vs raw socket",
        "RSS growth while streaming",
        *(
            f"{what} at {rtt} ms RTT"
            for rtt in (0, 20)
            for what in (
                "exec p50 traced (SDK, exporter dropping spans) vs untraced",
                "file upload MB/s vs SDK",
                "file upload MB/s vs raw socket",
                "file download MB/s vs SDK",
                "file download MB/s vs raw socket",
                "push vs tar c into one raw POST",
                "RSS growth moving a file up and back",
                "first command from a warm pool vs one exec",
                "client CPU per task, 32 sandboxes over 8,",
            )
        ),
        *(
            f"{what} create-per-task loop at 20 ms RTT"
            for what in (
                "pool tasks/s vs the SDK's",
                "Kubernetes pool tasks/s vs the official Kubernetes client's",
            )
        ),
        "pool tasks/s vs the SDK's reuse loop at 20 ms RTT",
        "python3 start in a local template sandbox vs the host",
        *(
            f"{group}: complete, ordered, exit code known, {server} (%)"
            for server in ("local service", "E2B double, resumable=True")
            for group in ("cuts 1-3", "stall")
        ),
        "cut or stalled commands not started exactly once",
        "exec p50 with nothing cut vs before the reattach machinery",
    } == names


def _without_local_service(scenario: dict[str, Any]) -> bool:
    return any(reason.startswith(NO_LOCAL_SERVICE) for reason in scenario["skipped"])


def _without_otel_sdk(scenario: dict[str, Any]) -> bool:
    return any("otel extra" in reason for reason in scenario["skipped"])


def _without_sandboxd_extra(scenario: dict[str, Any]) -> bool:
    return any("sandboxd extra" in reason for reason in scenario["skipped"])


def _ran_on_the_local_service(report: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The report's ``name`` scenarios that ran; the test is skipped, with the report's
    reason, when none could (no local service here: bubblewrap missing)."""
    found = [scenario for scenario in report["scenarios"] if scenario["name"] == name]
    assert found, f"the report has no {name} scenario"
    ran = [scenario for scenario in found if not _without_local_service(scenario)]
    if not ran:
        reasons = [r for r in found[0]["skipped"] if r.startswith(NO_LOCAL_SERVICE)]
        pytest.skip(f"{name}: {reasons[0]}")
    return ran


@pytest.mark.timeout(180)
def test_file_transfer_rows_compare_ours_the_sdk_and_the_socket_both_ways(
    tiny_report: dict[str, Any],
) -> None:
    for scenario in _ran_on_the_local_service(tiny_report, "file_transfer"):
        assert not [s for s in scenario["skipped"] if "differs" in s]
        rows = {(row["group"], row["client"]): row for row in scenario["rows"]}
        clients = {"ours-sandbox", "socket-raw"} | (
            {"e2b-sdk"} if importlib.util.find_spec("e2b") is not None else set()
        )
        for direction in ("upload", "download"):
            assert {client for group, client in rows if group == direction} == clients
            assert rows[(direction, "ours-sandbox")]["unit"] == "MB/s"
            assert rows[(direction, "ours-sandbox")]["ratio_floor"] is not None
        assert rows[("RSS upload+download", "ours-sandbox")]["unit"] == "MiB"


@pytest.mark.timeout(180)
def test_push_rows_compare_ours_with_tar_into_one_post(tiny_report: dict[str, Any]) -> None:
    for scenario in _ran_on_the_local_service(tiny_report, "push"):
        assert not scenario["skipped"]  # every pushed file arrived
        clients = {row["client"]: row for row in scenario["rows"]}
        assert set(clients) == {"ours-sandbox", "tar-post-raw"}
        assert clients["ours-sandbox"]["ratio_floor"] is not None


@pytest.mark.timeout(180)
def test_round_trip_scenarios_ran_straight_and_behind_the_proxy(
    tiny_report: dict[str, Any],
) -> None:
    assert tiny_report["rtts_ms"] == [0, 20]
    ran = {(s["name"], s["rtt_ms"]) for s in tiny_report["scenarios"]}
    every_rtt = ROUND_TRIP_SCENARIOS | FILE_SCENARIOS | POOL_SCENARIOS | TRACING_SCENARIOS
    assert {(name, 20) for name in every_rtt} <= ran
    assert not {(name, 20) for name in SCENARIOS - every_rtt} & ran
    for scenario in tiny_report["scenarios"]:  # a skipped scenario has no rows (tested above)
        assert {row["rtt_ms"] for row in scenario["rows"]} <= {scenario["rtt_ms"]}


@pytest.mark.timeout(180)
def test_requests_are_counted_per_command_and_per_activation(
    tiny_report: dict[str, Any],
) -> None:
    for scenario in tiny_report["scenarios"]:
        if scenario["name"] in ROUND_TRIP_SCENARIOS:
            for row in scenario["rows"]:
                assert row["extra"]["requests"] >= 1, (scenario["name"], row["client"])


@pytest.mark.timeout(180)
def test_a_failed_goal_makes_the_exit_status_1_unless_report_only(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    done = _bench("--only", "exec_latency", "--rtt", "0", "--json", str(out))
    goals = json.loads(out.read_text(encoding="utf-8"))["goals"]
    failed = [goal for goal in goals if goal["passed"] is False]
    assert done.returncode == (1 if failed else 0), done.stdout[-2000:]


@pytest.mark.timeout(180)
def test_compare_and_results_page_in_one_run(tiny_report: dict[str, Any], tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps(tiny_report), encoding="utf-8")
    page = tmp_path / "RESULTS.md"
    page.write_text("# old\n\n## Notes\n\nkept by hand\n", encoding="utf-8")
    done = _bench(
        "--only",
        "exec_latency",
        "--rtt",
        "0",
        "--json",
        str(tmp_path / "run.json"),
        "--compare",
        str(baseline),
        "--results",
        str(page),
        "--report-only",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"against {baseline}" in done.stdout
    assert "regression(s) beyond 10%" in done.stdout
    text = page.read_text(encoding="utf-8")
    assert "--compare" in text and "load average" in text and "exec_latency" in text
    decoder = tiny_report["machine"]["base64_decoder"]
    assert decoder.startswith("pybase64 ")  # a plain install's decoder
    assert f"base64 decoder (ours): {decoder}" in done.stdout
    assert f"- base64 decoder (ours): {decoder}" in text
    assert text.rstrip().endswith("## Notes\n\nkept by hand")
