"""The benchmarks' verdicts: changes against a baseline, the exit status, the results page."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.__main__ import exit_status
from benchmarks.compare import compare, format_changes
from benchmarks.machine import describe
from benchmarks.report import Goal, Report, Row, ScenarioResult, read_rows, summarize, write_json
from benchmarks.results import write_results


def _row(median_ms: float, *, client: str = "ours-sandbox", higher: bool = False) -> Row:
    unit = "MB/s" if higher else "ms"
    samples = [median_ms] if higher else [median_ms / 1000]
    return summarize(
        "exec_latency", "loopback", client, "ours", samples, unit=unit, higher_is_better=higher
    )


def _verdicts(now: list[Row], then: list[Row]) -> list[str]:
    return [change.verdict for change in compare(now, then)]


def test_a_slower_latency_is_a_regression_and_a_faster_one_is_better() -> None:
    assert _verdicts([_row(2.0)], [_row(1.0)]) == ["REGRESSION"]
    assert _verdicts([_row(1.0)], [_row(2.0)]) == ["better"]
    assert _verdicts([_row(1.05)], [_row(1.0)]) == ["same"]


def test_for_throughput_less_is_the_regression() -> None:
    assert _verdicts([_row(50.0, higher=True)], [_row(100.0, higher=True)]) == ["REGRESSION"]
    assert _verdicts([_row(200.0, higher=True)], [_row(100.0, higher=True)]) == ["better"]


def test_rows_in_one_run_only_are_new_or_gone() -> None:
    now = [_row(1.0, client="a")]
    then = [_row(1.0, client="b")]
    assert _verdicts(now, then) == ["new", "gone"]


def test_baseline_rows_of_scenarios_not_run_now_are_left_out() -> None:
    stream = summarize("stream_throughput", "loopback", "ours-sandbox", "ours", [1.0], unit="MB/s")
    assert _verdicts([_row(1.0)], [_row(1.0), stream]) == ["same"]


def test_the_change_table_shows_ratio_percent_and_the_regression_count() -> None:
    text = format_changes(compare([_row(3.0)], [_row(2.0)]))
    assert "1.50" in text and "+50%" in text and "REGRESSION" in text
    assert "1 regression(s)" in text


def test_a_baseline_round_trips_through_its_json_file(tmp_path: Path) -> None:
    row = _row(1.5)
    path = tmp_path / "report.json"
    write_json(_report((ScenarioResult("exec_latency", rows=(row,)),), ()), path)
    assert read_rows(path) == (row,)


def _report(scenarios: tuple[ScenarioResult, ...], goals: tuple[Goal, ...]) -> Report:
    return Report(
        command="python -m benchmarks --size tiny",
        size="tiny",
        machine=describe(),
        scenarios=scenarios,
        goals=goals,
        leftover_threads=(),
        seconds=1.0,
        started="2026-12-03T00:00:00+00:00",
        rtts_ms=(0, 20),
        load_average=((0.5, 0.4, 0.3), (0.6, 0.4, 0.3)),
    )


FAILED = Goal("exec p50 vs SDK", "ours-sandbox", 1.5, "<= 1.00x", False)
PASSED = Goal("exec p50 vs SDK", "ours-sandbox", 0.9, "<= 1.00x", True)
UNMEASURED = Goal("exec p50 vs SDK", "ours-sandbox", None, "<= 1.00x", None)


@pytest.mark.parametrize(
    ("goals", "report_only", "status"),
    [
        ((PASSED, UNMEASURED), False, 0),
        ((PASSED, FAILED), False, 1),
        ((PASSED, FAILED), True, 0),
    ],
)
def test_the_exit_status_follows_the_goals_unless_report_only(
    goals: tuple[Goal, ...], report_only: bool, status: int
) -> None:
    assert exit_status((), goals, report_only=report_only) == status


def test_a_broken_scenario_fails_the_run_even_when_only_reporting() -> None:
    broken = ScenarioResult("memory", skipped=("the scenario failed: OSError: boom",))
    assert exit_status((broken,), (), report_only=True) == 1


def test_the_results_page_records_the_run_and_keeps_hand_written_notes(tmp_path: Path) -> None:
    page = tmp_path / "RESULTS.md"
    page.write_text("# old page\n\nold table\n\n## Notes\n\nwhy a goal is missed\n", "utf-8")
    write_results(_report((), (FAILED,)), "THE TABLE", page)
    text = page.read_text(encoding="utf-8")
    assert "old table" not in text
    assert "THE TABLE" in text and "python -m benchmarks --size tiny" in text
    assert "0.50, 0.40, 0.30 at the start" in text and "round trips 0 ms, 20 ms" in text
    assert text.endswith("## Notes\n\nwhy a goal is missed\n")
