"""Profile our client's calls for one command, in this process, under cProfile.

The loopback server runs in its own process (as in ``python -m benchmarks``), so the
profile holds only the client: ``ours-sandbox`` on the E2B backend or on the
Kubernetes backend, running ``--commands`` commands spread over ``--threads``
threads, each thread profiled on its own and the statistics merged::

    python -m benchmarks.profile_run --backend e2b --commands 3000
    python -m benchmarks.profile_run --backend kubernetes --threads 32 --top 40

Printed: profiled microseconds and Python calls per command, own time per command
by file, then the top functions by own time (per command, profiled). cProfile's
overhead inflates every figure alike; compare runs of this script with each other,
never with the benchmark's wall-clock times. ``--cpu`` runs without the profiler
and prints this process's CPU time per command (user + system; the server runs in
its own process) and the commands per second::

    python -m benchmarks.profile_run --backend e2b --threads 32 --commands 6400 --cpu

``--otel traced`` sets OpenTelemetry's SDK as the global providers first, as the
``tracing_cost`` scenario does (spans to an exporter that drops them, metrics in
memory); ``--otel suppressed`` too, but runs the commands under
``suppress_instrumentation`` (that scenario's untraced reference). The difference
between the two is what tracing adds per command::

    python -m benchmarks.profile_run --otel traced --commands 2000
    python -m benchmarks.profile_run --otel suppressed --commands 2000
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.clients import (
    SdkClient,
    activate_e2b,
    activate_kubernetes,
    kubernetes_backend,
    ours_backend,
    sdk_sandbox,
)
from benchmarks.loopback import LoopbackServer
from piship_remote import Sandbox

__all__ = ["cpu_per_command", "main", "profile_commands", "report"]

_COMMAND = "true"
_WARM_UP = 20


def _runner(
    client: str, backend: str, url: str, workspace: str, stack: contextlib.ExitStack
) -> Callable[[str], object]:
    if client == "e2b-sdk":
        if backend != "e2b":
            raise SystemExit("--client e2b-sdk runs on the e2b backend only")
        return SdkClient(sdk_sandbox(url, stack)).run
    return _sandbox(backend, url, workspace, stack).exec


def _sandbox(backend: str, url: str, workspace: str, stack: contextlib.ExitStack) -> Sandbox:
    if backend == "e2b":
        sandbox = activate_e2b(ours_backend(url, stack), workspace)
    else:
        sandbox = activate_kubernetes(kubernetes_backend(url, stack), workspace)
    stack.callback(sandbox.dispose)
    return sandbox


def profile_commands(
    run: Callable[[], object],
    commands: int,
    threads: int,
    scope: Callable[[], contextlib.AbstractContextManager[object]] = contextlib.nullcontext,
) -> pstats.Stats:
    """``run()`` called ``commands`` times over ``threads`` threads, each one profiled,
    each thread in its own ``scope()``."""
    profiles: list[cProfile.Profile] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)
    share, extra = divmod(commands, threads)

    def worker(count: int) -> None:
        profile = cProfile.Profile()
        start.wait()
        with scope():
            profile.enable()
            try:
                for _ in range(count):
                    run()
            finally:
                profile.disable()
                with lock:
                    profiles.append(profile)

    workers = [
        threading.Thread(target=worker, args=(share + (index < extra),), name=f"profile-{index}")
        for index in range(threads)
    ]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    stats = pstats.Stats(profiles[0], stream=io.StringIO())
    for profile in profiles[1:]:
        stats.add(profile)
    return stats


def cpu_per_command(run: Callable[[], object], commands: int, threads: int) -> str:
    """``run()`` ``commands`` times over ``threads`` threads, unprofiled: CPU and rate."""
    share, extra = divmod(commands, threads)
    start = threading.Barrier(threads + 1)

    def worker(count: int) -> None:
        start.wait()
        for _ in range(count):
            run()

    workers = [
        threading.Thread(target=worker, args=(share + (index < extra),), name=f"cpu-{index}")
        for index in range(threads)
    ]
    for thread in workers:
        thread.start()
    before, began = os.times(), time.perf_counter()
    start.wait()
    for thread in workers:
        thread.join()
    after, seconds = os.times(), time.perf_counter() - began
    cpu = (after.user - before.user) + (after.system - before.system)
    return (
        f"# {commands} commands on {threads} thread(s): {cpu / commands * 1e6:.0f} us CPU "
        f"per command (user + system, this process), {commands / seconds:.0f} commands/s"
    )


def _by_file(stats: pstats.Stats, commands: int) -> list[str]:
    files: dict[str, list[float]] = {}
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, _), (_, calls, own, _, _) in raw.items():
        entry = files.setdefault(_short(filename), [0.0, 0.0])
        entry[0] += own
        entry[1] += calls
    ordered = sorted(files.items(), key=lambda item: -item[1][0])
    return [
        f"{own / commands * 1e6:9.1f} us {calls / commands:7.1f} calls  {name}"
        for name, (own, calls) in ordered[:25]
    ]


def _short(filename: str) -> str:
    for marker in ("site-packages/", "piship_remote/", "benchmarks/", "lib/python3"):
        index = filename.find(marker)
        if index >= 0:
            return filename[index:]
    return filename


def _top(stats: pstats.Stats, commands: int, count: int) -> list[str]:
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    ordered = sorted(raw.items(), key=lambda item: -item[1][2])
    lines = []
    for (filename, line, name), (_, calls, own, cumulative, _) in ordered[:count]:
        lines.append(
            f"{own / commands * 1e6:8.1f} us own {cumulative / commands * 1e6:8.1f} us cum "
            f"{calls / commands:6.1f} calls  {_short(filename)}:{line}({name})"
        )
    return lines


def report(stats: pstats.Stats, commands: int, top: int, title: str) -> str:
    """The text this script prints for ``stats`` of ``commands`` commands."""
    total: float = stats.total_tt  # type: ignore[attr-defined]
    calls: int = stats.total_calls  # type: ignore[attr-defined]
    lines = [
        f"# {title}",
        f"# {commands} commands: {total / commands * 1e6:.0f} us profiled and "
        f"{calls / commands:.0f} Python calls per command",
        "# own time by file, per command:",
        *_by_file(stats, commands),
        f"# top {top} functions by own time, per command:",
        *_top(stats, commands, top),
    ]
    return "\n".join(lines)


def _otel_scope(otel: str) -> Callable[[], contextlib.AbstractContextManager[object]]:
    """Set the SDK as the global providers (unless ``none``); the scope commands run in."""
    if otel == "none":
        return contextlib.nullcontext
    from benchmarks.tracing_cost import SDK_MISSING, install_sdk, suppressed

    try:
        install_sdk()
    except ImportError:
        raise SystemExit(SDK_MISSING) from None
    return suppressed if otel == "suppressed" else contextlib.nullcontext


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.profile_run", description=__doc__)
    parser.add_argument("--backend", choices=("e2b", "kubernetes"), default="e2b")
    parser.add_argument(
        "--client",
        choices=("ours-sandbox", "e2b-sdk"),
        default="ours-sandbox",
        help="the official SDK's commands.run instead of ours (e2b only)",
    )
    parser.add_argument("--commands", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--cpu", action="store_true", help="no profiler: CPU per command")
    parser.add_argument("--command", default=_COMMAND, help="e.g. 'bench-sleep 10'")
    parser.add_argument(
        "--otel",
        choices=("none", "traced", "suppressed"),
        default="none",
        help="the OpenTelemetry SDK as the global providers; suppressed: records nothing",
    )
    args = parser.parse_args(argv)
    scope = _otel_scope(args.otel)
    with (
        tempfile.TemporaryDirectory(prefix="piship-profile-") as workspace,
        LoopbackServer() as server,
        contextlib.ExitStack() as stack,
    ):
        execute = _runner(args.client, args.backend, server.url, workspace, stack)
        for _ in range(_WARM_UP):
            execute(_COMMAND)

        def run() -> None:
            execute(args.command)

        if args.cpu:
            print(cpu_per_command(run, args.commands, args.threads))
            return
        stats = profile_commands(run, args.commands, args.threads, scope)
    title = (
        f"{args.client} on {args.backend}, exec({args.command!r}) on benchmarks/loopback.py, "
        f"{args.threads} thread(s), otel {args.otel}"
    )
    print(report(stats, args.commands, args.top, title))


if __name__ == "__main__":
    main()
