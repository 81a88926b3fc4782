"""Commands whose stream is cut or stalled: how many runs still return complete, ordered
output and a known exit code, with the command started once, per client and server.

Each run is ``seq 1 LINES; exit 3`` whose envd connection goes through
:class:`~piship_remote.testing.cutting_proxy.CuttingProxy` (see :mod:`benchmarks.cut_runs`):

- group ``cuts 1-3``: reset at 1-3 random points of the answer;
- group ``stall``: not relayed past one random point until the client gives up (ours
  after a ``stream_idle_timeout`` of 2 s, on the double 0.5 s more per MB of output,
  since it writes the spool before it answers a Start; the SDK, which has no idle
  timeout, at its 5 s command timeout).

Servers: the local service in a child process (``local``; ours with default settings)
and the E2B double (``doubles``, which keeps nothing: ours with ``resumable=True``).
Clients: ``ours-sandbox`` and the official SDK (``e2b-sdk``, the reference). A row's
samples are the runs' seconds; its notes carry the measure (``complete`` and ``exit
known`` in %, ``not once``: runs whose command did not start exactly once, ``silent``:
ours' incomplete runs that reported nothing missing). Runs are spread over worker
processes (``--size``'s ``cut_workers``; with one, made in this process), each with its
own sandbox and proxy, and progress is printed as they finish, so an interrupted measure
still tells its counts.
The group ``exec true, nothing cut`` is :mod:`benchmarks.cut_exec_cost`.

Through the harness (``--size`` sets runs, lines and workers)::

    python -m benchmarks --only stream_cuts --size small

or on its own, with any counts (the same rows, goals and table)::

    python -m benchmarks.stream_cuts --runs 1000 --lines 2500000 --stall-runs 100 --workers 2
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import math
import multiprocessing
import queue
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from multiprocessing.queues import Queue
from typing import Final

import attrs

from benchmarks.cut_exec_cost import GROUP as EXEC_GROUP
from benchmarks.cut_exec_cost import exec_rows
from benchmarks.cut_runs import Client, Fault, Outcome, Server, Share, expected_output, run_share
from benchmarks.local_service import LocalServiceProcess, unavailable
from benchmarks.report import Goal, Role, Row, ScenarioResult, format_table, summarize, with_ratios
from benchmarks.rounds import Context
from benchmarks.sizes import SIZES, Size

__all__ = ["NAME", "Measure", "cut_goals", "main", "measure", "run"]

NAME = "stream_cuts"
LOCAL: Final = "local"
DOUBLES: Final = "doubles"
GROUPS = {"cuts": "cuts 1-3", "stall": "stall"}
_DISK_MIB = 512
_PHASES: tuple[tuple[Fault, Client, Server], ...] = (
    ("cuts", "ours-sandbox", LOCAL),
    ("cuts", "ours-sandbox", DOUBLES),
    ("cuts", "e2b-sdk", LOCAL),
    ("cuts", "e2b-sdk", DOUBLES),
    ("stall", "ours-sandbox", LOCAL),
    ("stall", "ours-sandbox", DOUBLES),
    ("stall", "e2b-sdk", LOCAL),
)
_PROGRESS_EVERY = 10.0  # seconds between progress lines

_outcomes: Queue[Outcome] | None = None  # a worker process's way back to the parent


@attrs.frozen
class Measure:
    """How much to run: runs per client and server, lines per run, worker processes."""

    runs: int
    lines: int
    stall_runs: int
    workers: int
    exec_rounds: int
    exec_batch: int
    seed: int = 46
    servers: tuple[Server, ...] = (LOCAL, DOUBLES)

    @classmethod
    def of(cls, size: Size) -> Measure:
        return cls(
            runs=size.cut_runs,
            lines=size.cut_lines,
            stall_runs=size.stall_runs,
            workers=size.cut_workers,
            exec_rounds=max(1, size.exec_calls // size.exec_batch),
            exec_batch=size.exec_batch,
        )


def run(context: Context) -> ScenarioResult:
    """The ``--size``'s runs of every client on both servers, and the exec cost."""
    return measure(Measure.of(context.size))


def measure(plan: Measure) -> ScenarioResult:
    """Every row of the scenario for ``plan`` (see the module's docstring)."""
    began = time.perf_counter()
    problem = unavailable()
    if problem is not None:
        return ScenarioResult(NAME, skipped=(f"the local service cannot run here: {problem}",))
    rows: list[Row] = []
    skipped: list[str] = []
    with LocalServiceProcess(disk_mib=_DISK_MIB) as service:
        if plan.exec_rounds > 0:
            cost, missing = exec_rows(
                NAME, LOCAL, service.url, service.api_key, plan.exec_rounds, plan.exec_batch
            )
            rows += cost
            skipped += missing
        for fault, client, server in _PHASES:
            runs = plan.runs if fault == "cuts" else plan.stall_runs
            if runs <= 0 or server not in plan.servers:
                continue
            share = Share(
                client=client,
                server=server,
                fault=fault,
                lines=plan.lines,
                seed=plan.seed,
                first=0,
                count=runs,
                service_url=service.url,
                service_key=service.api_key,
            )
            outcomes, failure = _spread(share, plan.workers)
            if failure is not None:
                skipped.append(f"{_label(share)}: {len(outcomes)}/{runs} runs, then {failure}")
            if outcomes:
                rows.append(_row(share, outcomes))
    size_mb = len(expected_output(plan.lines)) / 1e6
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped),
        notes=(
            f"`seq 1 {plan.lines}; exit 3` ({size_mb:.3g} MB of stdout) per run; runs per "
            f"row: cuts {plan.runs}, stall {plan.stall_runs}; over {plan.workers} worker "
            "process(es); the median is seconds per run; complete = stdout whole and in "
            "order, exit known = exit code 3 returned, not once = runs whose command did not "
            "start exactly once, unchecked = runs whose start count could not be read, silent = "
            "incomplete with nothing reported missing",
            "local: ours with default settings (stalls: stream_idle_timeout 2 s, on the double "
            "+0.5 s per MB; the service replays from its ring); doubles: "
            "ours with resumable=True (the double keeps nothing); the SDK has no idle timeout, "
            "so its command timeout (5 s) ends a stalled run",
            "exec true, nothing cut: this library against the one before the reattach "
            "machinery, each in its own child process, alternating rounds",
        ),
        seconds=time.perf_counter() - began,
    )


def _label(share: Share) -> str:
    return f"{share.client}/{share.server}/{share.fault}"


def _row(share: Share, outcomes: Sequence[Outcome]) -> Row:
    runs = len(outcomes)
    extra: dict[str, float | int | str] = {
        "runs": runs,
        "complete": round(100 * sum(o.complete for o in outcomes) / runs, 2),
        "exit_known": round(100 * sum(o.exit_known for o in outcomes) / runs, 2),
        "not_once": sum(o.starts not in (1, -1) for o in outcomes),
        "unchecked": sum(o.starts == -1 for o in outcomes),
        share.fault: sum(o.faults for o in outcomes),
        "MB": round(len(expected_output(share.lines)) / 1e6, 3),
    }
    if share.client == "ours-sandbox":
        extra["silent"] = sum(o.silent for o in outcomes)
    role: Role = "ours" if share.client == "ours-sandbox" else "reference"
    return summarize(
        NAME,
        share.server,
        share.client,
        role,
        [o.seconds for o in outcomes],
        unit="s",
        group=GROUPS[share.fault],
        extra=extra,
    )


def _shares(share: Share, workers: int) -> list[Share]:
    """``share``'s runs split into at most ``workers`` contiguous parts."""
    parts = max(1, min(workers, share.count))
    bounds = [share.count * part // parts for part in range(parts + 1)]
    return [
        attrs.evolve(share, first=low, count=high - low) for low, high in itertools.pairwise(bounds)
    ]


def _spread(share: Share, workers: int) -> tuple[list[Outcome], str | None]:
    """The outcomes of ``share``'s runs made by worker processes, and what broke a worker."""
    if workers <= 1:
        return _in_process(share)
    context = multiprocessing.get_context("spawn")
    results: Queue[Outcome] = context.Queue()
    outcomes: list[Outcome] = []
    progress = _Progress(_label(share), share.count)
    parts = _shares(share, workers)
    with concurrent.futures.ProcessPoolExecutor(
        max_workers=len(parts), mp_context=context, initializer=_start, initargs=(results,)
    ) as pool:
        futures = [pool.submit(_work, part) for part in parts]
        while len(outcomes) < share.count:
            try:
                outcomes.append(results.get(timeout=1.0))
            except queue.Empty:
                if all(future.done() for future in futures) and results.empty():
                    break
                continue
            progress.show(outcomes)
    progress.show(outcomes, last=True)
    failures = [str(f.exception()) for f in futures if f.exception() is not None]
    return outcomes, (failures[0] if failures else None)


def _in_process(share: Share) -> tuple[list[Outcome], str | None]:
    """One worker's runs made here (no process to start)."""
    outcomes: list[Outcome] = []
    progress = _Progress(_label(share), share.count)
    try:
        for outcome in run_share(share):
            outcomes.append(outcome)
            progress.show(outcomes)
    except Exception as error:  # the rows keep what was measured before it broke
        return outcomes, str(error)
    finally:
        progress.show(outcomes, last=True)
    return outcomes, None


def _start(results: Queue[Outcome]) -> None:
    global _outcomes
    _outcomes = results


def _work(share: Share) -> int:
    assert _outcomes is not None
    made = 0
    for outcome in run_share(share):
        _outcomes.put(outcome)
        made += 1
    return made


class _Progress:
    """Prints the counts so far now and then, so an interrupted run still tells them."""

    def __init__(self, label: str, total: int) -> None:
        self._label = label
        self._total = total
        self._shown = time.monotonic()

    def show(self, outcomes: Sequence[Outcome], *, last: bool = False) -> None:
        now = time.monotonic()
        if not last and now - self._shown < _PROGRESS_EVERY:
            return
        self._shown = now
        print(f"  {NAME} {self._label}: {_counts(outcomes)} of {self._total}", file=sys.stderr,
              flush=True)  # fmt: skip


def _counts(outcomes: Iterable[Outcome]) -> str:
    done = list(outcomes)
    return (
        f"{len(done)} runs, {sum(o.complete for o in done)} complete+ordered, "
        f"{sum(o.exit_known for o in done)} exit code known, "
        f"{sum(o.starts not in (1, -1) for o in done)} not started once, "
        f"{sum(o.starts == -1 for o in done)} unchecked, {sum(o.faults for o in done)} "
        "faults"
    )


def cut_goals(rows: Iterable[Row]) -> list[Goal]:
    """Ours: every run complete, ordered, with its exit code, on both servers under cuts
    and stalls; no command started twice; exec with nothing cut within 5 % of before."""
    ours = {
        (row.server, row.group): row
        for row in rows
        if row.scenario == NAME and row.client == "ours-sandbox"
    }
    goals: list[Goal] = []
    for server, how in ((LOCAL, "local service"), (DOUBLES, "E2B double, resumable=True")):
        for group in GROUPS.values():
            row = ours.get((server, group))
            value = (
                None if row is None else min(_number(row, "complete"), _number(row, "exit_known"))
            )
            goals.append(_goal(f"{group}: complete, ordered, exit code known, {how} (%)", value,
                               "= 100", lambda v: v >= 100))  # fmt: skip
    measured = [row for (_, group), row in ours.items() if group in GROUPS.values()]
    twice = sum(_number(row, "not_once") for row in measured) if measured else None
    goals.append(_goal("cut or stalled commands not started exactly once", twice, "= 0",
                       lambda v: v == 0))  # fmt: skip
    cost = ours.get((LOCAL, EXEC_GROUP))
    goals.append(_goal("exec p50 with nothing cut vs before the reattach machinery",
                       None if cost is None else cost.ratio_reference, "<= 1.05x",
                       lambda v: v <= 1.05))  # fmt: skip
    return goals


def _number(row: Row, key: str) -> float:
    value = row.extra.get(key)
    return float(value) if isinstance(value, int | float) else math.nan


def _goal(name: str, value: float | None, target: str, passes: Callable[[float], bool]) -> Goal:
    if value is None or math.isnan(value):
        return Goal(name, "ours-sandbox", None, target, None)
    return Goal(name, "ours-sandbox", value, target, passes(value))


def _servers(parser: argparse.ArgumentParser, text: str) -> tuple[Server, ...]:
    chosen = tuple(name.strip() for name in text.split(",") if name.strip())
    known: dict[str, Server] = {LOCAL: LOCAL, DOUBLES: DOUBLES}
    if not chosen or set(chosen) - set(known):
        parser.error(f"--servers takes local and/or doubles, not {text!r}")
    return tuple(known[name] for name in chosen)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.stream_cuts``: the scenario with chosen counts."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stream_cuts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    base = Measure.of(SIZES["small"])
    parser.add_argument("--runs", type=int, default=base.runs, help="cut runs per row")
    parser.add_argument("--lines", type=int, default=base.lines, help="lines per run")
    parser.add_argument("--stall-runs", type=int, default=base.stall_runs)
    parser.add_argument("--workers", type=int, default=base.workers)
    parser.add_argument("--servers", default=",".join(base.servers), help="local,doubles")
    parser.add_argument("--exec-rounds", type=int, default=base.exec_rounds, help="0: none")
    parser.add_argument("--exec-batch", type=int, default=base.exec_batch)
    parser.add_argument("--seed", type=int, default=base.seed)
    args = parser.parse_args(argv)
    plan = Measure(
        runs=args.runs, lines=args.lines, stall_runs=args.stall_runs, workers=args.workers,
        exec_rounds=args.exec_rounds, exec_batch=args.exec_batch, seed=args.seed,
        servers=_servers(parser, args.servers),
    )  # fmt: skip
    result = measure(plan)
    goals = cut_goals(result.rows)
    print(format_table([result], goals))
    broken = bool(result.skipped) and not result.rows
    return 1 if broken or any(goal.passed is False for goal in goals) else 0


if __name__ == "__main__":
    sys.exit(main())
