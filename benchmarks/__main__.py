"""``python -m benchmarks``: run the scenarios, print one table, write the JSON report.

python -m benchmarks --size tiny --json /tmp/bench.json --only exec_latency,memory
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks import (
    activation,
    cancellation,
    concurrency,
    exec_latency,
    memory,
    stream_throughput,
)
from benchmarks.goals import evaluate
from benchmarks.loopback import LoopbackServer
from benchmarks.machine import describe
from benchmarks.report import Report, ScenarioResult, format_table, write_json
from benchmarks.rounds import Context
from benchmarks.sizes import SIZES

__all__ = ["SCENARIOS", "main"]

Scenario = Callable[[Context], ScenarioResult]

SCENARIOS: dict[str, Scenario] = {
    exec_latency.NAME: exec_latency.run,
    stream_throughput.NAME: stream_throughput.run,
    concurrency.NAME: concurrency.run,
    cancellation.NAME: cancellation.run,
    memory.NAME: memory.run,
    activation.NAME: activation.run,
}


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--json", type=Path, default=Path("benchmarks-results.json"))
    parser.add_argument(
        "--only", default="", help=f"comma-separated scenarios out of {', '.join(SCENARIOS)}"
    )
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(unknown)}")
    args.scenarios = chosen or list(SCENARIOS)
    return args


def _run_one(name: str, context: Context) -> ScenarioResult:
    print(f"running {name} ...", file=sys.stderr, flush=True)
    began = time.perf_counter()
    try:
        return SCENARIOS[name](context)
    except Exception as error:  # one broken scenario must not hide the others
        return ScenarioResult(
            name=name,
            skipped=(f"the scenario failed: {type(error).__name__}: {error}",),
            seconds=time.perf_counter() - began,
        )


def _leftover_threads() -> tuple[str, ...]:
    """Threads still alive besides the main one, after a short grace period."""
    deadline = time.monotonic() + 2.0
    while True:
        others = [t for t in threading.enumerate() if t is not threading.main_thread()]
        if not others or time.monotonic() >= deadline:
            return tuple(sorted(t.name for t in others))
        time.sleep(0.01)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen scenarios; 0 when every one ran (goals are reported, not enforced)."""
    args = _parse(argv)
    began = time.perf_counter()
    size = SIZES[args.size]
    results: list[ScenarioResult] = []
    with (
        tempfile.TemporaryDirectory(prefix="piship-bench-") as workspace,
        LoopbackServer() as server,
    ):
        context = Context(size=size, loopback=server, workspace=workspace)
        for name in args.scenarios:
            results.append(_run_one(name, context))
    goals = evaluate(results)
    arguments = sys.argv[1:] if argv is None else list(argv)
    report = Report(
        command=shlex.join(["python", "-m", "benchmarks", *arguments]),
        size=size.name,
        machine=describe(),
        scenarios=tuple(results),
        goals=goals,
        leftover_threads=_leftover_threads(),
        seconds=time.perf_counter() - began,
    )
    print(format_table(results, goals))
    if report.leftover_threads:
        print(f"\nleftover threads: {', '.join(report.leftover_threads)}")
    write_json(report, args.json)
    print(f"\nwrote {args.json} in {report.seconds:.1f} s")
    broken = [r for r in results if any(s.startswith("the scenario failed") for s in r.skipped)]
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
