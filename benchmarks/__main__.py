"""``python -m benchmarks``: run the scenarios, print one table, write the JSON report.

python -m benchmarks --size tiny --json /tmp/bench.json --only exec_latency,memory
python -m benchmarks --size small --rtt 0,20 --compare /tmp/baseline.json
python -m benchmarks --size full --results benchmarks/RESULTS.md

Round-trip scenarios run once per ``--rtt`` value: straight to the loopback server
at 0, behind the delay proxy (half the round trip each way) otherwise; the others
run at 0 only. The exit status is 1 when a goal failed (``--report-only``: never
for goals) or when a scenario itself broke.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

from benchmarks.compare import compare, format_changes
from benchmarks.goals import evaluate
from benchmarks.loopback import LoopbackServer
from benchmarks.machine import describe
from benchmarks.proxy import at_rtt
from benchmarks.report import (
    Goal,
    Report,
    ScenarioResult,
    format_table,
    read_rows,
    write_json,
)
from benchmarks.results import write_results
from benchmarks.rounds import Context
from benchmarks.scenarios import SCENARIOS
from benchmarks.sizes import SIZES

__all__ = ["SCENARIOS", "exit_status", "main"]

BROKEN = "the scenario failed"


def _round_trips(text: str) -> tuple[int, ...]:
    try:
        values = tuple(dict.fromkeys(int(part) for part in text.split(",") if part.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of milliseconds: {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"round trips must be 0 or more ms: {text!r}")
    return values


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--json", type=Path, default=Path("benchmarks-results.json"))
    parser.add_argument(
        "--only", default="", help=f"comma-separated scenarios out of {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--rtt",
        type=_round_trips,
        default=(0, 20),
        help="comma-separated round trips in ms for the round-trip scenarios (default 0,20)",
    )
    parser.add_argument(
        "--compare", type=Path, metavar="BASELINE.json", help="print each row's change"
    )
    parser.add_argument("--results", type=Path, metavar="RESULTS.md", help="write the page")
    parser.add_argument("--report-only", action="store_true", help="exit 0 even when a goal fails")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(unknown)}")
    if args.compare is not None and not args.compare.is_file():
        parser.error(f"no baseline at {args.compare}")
    args.scenarios = chosen or list(SCENARIOS)
    return args


def _run_one(name: str, context: Context) -> ScenarioResult:
    label = f"{name} at {context.rtt_ms} ms RTT" if context.rtt_ms else name
    print(f"running {label} ...", file=sys.stderr, flush=True)
    began = time.perf_counter()
    try:
        result = SCENARIOS[name].run(context)
    except Exception as error:  # one broken scenario must not hide the others
        result = ScenarioResult(
            name=name,
            skipped=(f"{BROKEN}: {type(error).__name__}: {error}",),
            seconds=time.perf_counter() - began,
        )
    rows = tuple(attrs.evolve(row, rtt_ms=context.rtt_ms) for row in result.rows)
    return attrs.evolve(result, rows=rows, rtt_ms=context.rtt_ms)


def _run_all(
    names: Sequence[str],
    rtts: Sequence[int],
    server: LoopbackServer,
    workspace: str,
    size_name: str,
) -> list[ScenarioResult]:
    results: list[ScenarioResult] = []
    for rtt in rtts:
        chosen = [name for name in names if rtt == 0 or SCENARIOS[name].round_trips]
        if not chosen:
            continue
        with at_rtt(server.url, rtt) as url:
            context = Context(
                size=SIZES[size_name], loopback=server, workspace=workspace, url=url, rtt_ms=rtt
            )
            results += [_run_one(name, context) for name in chosen]
    return results


def exit_status(
    results: Iterable[ScenarioResult], goals: Iterable[Goal], *, report_only: bool
) -> int:
    """1 when a scenario broke, or a goal failed and goals count; else 0."""
    if any(reason.startswith(BROKEN) for result in results for reason in result.skipped):
        return 1
    if not report_only and any(goal.passed is False for goal in goals):
        return 1
    return 0


def _leftover_threads() -> tuple[str, ...]:
    """Threads still alive besides the main one, after a short grace period."""
    deadline = time.monotonic() + 2.0
    while True:
        others = [t for t in threading.enumerate() if t is not threading.main_thread()]
        if not others or time.monotonic() >= deadline:
            return tuple(sorted(t.name for t in others))
        time.sleep(0.01)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen scenarios; see :func:`exit_status` for what the status means."""
    args = _parse(argv)
    began = time.perf_counter()
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="piship-bench-") as workspace,
        LoopbackServer() as server,
    ):
        results = _run_all(args.scenarios, args.rtt, server, workspace, args.size)
    goals = evaluate(results)
    arguments = sys.argv[1:] if argv is None else list(argv)
    report = Report(
        command=shlex.join(["python", "-m", "benchmarks", *arguments]),
        size=args.size,
        machine=describe(),
        scenarios=tuple(results),
        goals=goals,
        leftover_threads=_leftover_threads(),
        seconds=time.perf_counter() - began,
        started=started,
        rtts_ms=tuple(args.rtt),
        load_average=(load_before, os.getloadavg()),
    )
    table = format_table(results, goals)
    print(f"base64 decoder (ours): {report.machine.base64_decoder}\n")
    print(table)
    if report.leftover_threads:
        print(f"\nleftover threads: {', '.join(report.leftover_threads)}")
    if args.compare is not None:
        rows = [row for result in results for row in result.rows]
        print(f"\nagainst {args.compare}:\n")
        print(format_changes(compare(rows, read_rows(args.compare))))
    write_json(report, args.json)
    print(f"\nwrote {args.json} in {report.seconds:.1f} s")
    if args.results is not None:
        write_results(report, table, args.results)
        print(f"wrote {args.results}")
    status = exit_status(results, goals, report_only=args.report_only)
    if status and not args.report_only:
        print("exit status 1: a goal failed or a scenario broke (--report-only to only report)")
    return status


if __name__ == "__main__":
    sys.exit(main())
