"""Commands whose stream is cut: how many runs still return complete, ordered output and
a known exit code, per client, and what following a stream costs when nothing is cut.

Each run is a command printing numbered lines (``seq 1 LINES; exit 3``) whose stream is
cut 1-3 times at random points: by :class:`~piship_remote.testing.cutting_proxy.CuttingProxy`
in front of the local service's envd (ours, default settings; the official SDK), or by the
E2B double's own ``faults.cut_streams_after`` (ours with ``resumable=True``; the double
keeps nothing and loses up to 4 kB of stdout per cut). A run counts when its stdout is
exactly the lines in order and its exit code is 3. Run from the repository root::

    python -m benchmarks.stream_cuts --runs 1000 --lines 2500000       # ~20 MB per run
    python -m benchmarks.stream_cuts --p50 200                          # exec("true") p50

``--p50`` times ``Sandbox.exec("true")`` on the local service with nothing cut; run it
with the library before the change on ``PYTHONPATH`` for the baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

EXIT_CODE = 3


def expected_lines(lines: int) -> str:
    return "".join(f"{n}\n" for n in range(1, lines + 1))


def describe(result: Any, expected: str) -> str:
    """Where a result's output parts from what was expected."""
    got = result.stdout
    pairs = enumerate(zip(got, expected, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(got), len(expected)))
    return (
        f"exit {result.exit_code}, missing {result.missing}, {len(got)}/{len(expected)} "
        f"bytes, first difference at {at}: {got[at - 20 : at + 20]!r}"
    )


def cut_points(rng: random.Random, lines: int) -> list[int]:
    """1-3 byte counts within one stream's answer (its base64 is about 4/3 of the text)."""
    wire = len(expected_lines(lines)) * 4 // 3
    count = rng.randint(1, 3)
    return [rng.randint(1000, max(1001, wire // (count + 1))) for _ in range(count)]


@contextlib.contextmanager
def local_sandbox(envd_url: Callable[[Any], str] | None = None) -> Iterator[tuple[Any, Any]]:
    """(service, sandbox) on a local service; ``envd_url(service)`` routes envd elsewhere."""
    from piship_remote import activate_sandbox
    from piship_remote.local import LocalE2bService

    with LocalE2bService() as service, tempfile.TemporaryDirectory() as workspace:
        options = {} if envd_url is None else {"envd_url": envd_url(service)}
        backend = service.backend(**options)
        policy = {"required": True}
        with activate_sandbox(policy, backend=backend, workspace=workspace, env={}) as box:
            yield service, box


def ours_local(runs: int, lines: int, rng: random.Random) -> tuple[int, int]:
    from piship_remote.testing.cutting_proxy import CuttingProxy

    good = cuts = 0
    expected = expected_lines(lines)
    with contextlib.ExitStack() as stack:
        proxies: list[CuttingProxy] = []

        def through_proxy(service: Any) -> str:
            proxies.append(stack.enter_context(CuttingProxy(service.envd_url)))
            return proxies[0].url

        _, sandbox = stack.enter_context(local_sandbox(through_proxy))
        for _ in range(runs):
            proxies[0].plan(cut_points(rng, lines))
            before = proxies[0].cuts
            try:
                result = sandbox.run(f"seq 1 {lines}; exit {EXIT_CODE}", output_limit=None)
                complete = result.exit_code == EXIT_CODE and result.stdout == expected
                good += complete
                if not complete:
                    print(f"  ours/local incomplete: {describe(result, expected)}", file=sys.stderr)
            except Exception as error:  # a run that failed counts as not good
                print(f"  ours/local run failed: {error}", file=sys.stderr)
            cuts += proxies[0].cuts - before
    return good, cuts


def ours_double_resumable(runs: int, lines: int, rng: random.Random) -> tuple[int, int]:
    from piship_remote import E2bCompatibleBackend, activate_sandbox
    from piship_remote.testing import E2bServer

    expected = expected_lines(lines)
    good = cuts = 0
    server = E2bServer(command=lambda start: {"stdout": expected, "exit_code": EXIT_CODE})
    with server, tempfile.TemporaryDirectory() as workspace:
        backend = E2bCompatibleBackend(endpoint=server.url, envd_url=server.url)
        policy = {"required": True}
        with activate_sandbox(policy, backend=backend, workspace=workspace, env={}) as box:
            for _ in range(runs):
                points = [p * 3 // 4 for p in cut_points(rng, lines)]  # bytes of output
                server.faults.cut_streams_after(*points, unheard=rng.randint(0, 4096))
                cuts += len(points)
                try:
                    result = box.run("numbers", resumable=True, output_limit=None)
                    good += result.exit_code == EXIT_CODE and result.stdout == expected
                except Exception as error:
                    print(f"  ours/double run failed: {error}", file=sys.stderr)
                server.faults.clear()
    return good, cuts


def official_sdk(runs: int, lines: int, rng: random.Random) -> tuple[int, int] | str:
    try:
        from e2b import Sandbox as SdkSandbox
    except ImportError:
        return "skipped: the official e2b SDK is not installed (pip install -e .[interop])"
    from piship_remote.local import LocalE2bService
    from piship_remote.testing.cutting_proxy import CuttingProxy

    expected = expected_lines(lines)
    good = cuts = 0
    with LocalE2bService() as service, CuttingProxy(service.envd_url) as proxy:
        sandbox = SdkSandbox.create(
            api_key=service.api_key, api_url=service.url, sandbox_url=proxy.url
        )
        try:
            for _ in range(runs):
                proxy.plan(cut_points(rng, lines))
                before = proxy.cuts
                try:
                    result = sandbox.commands.run(f"seq 1 {lines}; exit {EXIT_CODE}")
                    good += result.exit_code == EXIT_CODE and result.stdout == expected
                except Exception as error:
                    exit_code = getattr(error, "exit_code", None)
                    stdout = getattr(error, "stdout", None)
                    good += exit_code == EXIT_CODE and stdout == expected
                cuts += proxy.cuts - before
        finally:
            sandbox.kill()
    return good, cuts


def exec_p50(samples: int) -> float:
    with local_sandbox() as (_, sandbox):
        for _ in range(10):
            sandbox.exec("true")
        times = []
        for _ in range(samples):
            start = time.perf_counter()
            sandbox.exec("true")
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stream_cuts")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--double-lines", type=int, default=None, help="default: --lines")
    parser.add_argument("--seed", type=int, default=46)
    parser.add_argument("--p50", type=int, default=0, help="only time exec('true'), N samples")
    args = parser.parse_args(argv)
    if args.p50:
        print(f"exec('true') p50 on the local service: {exec_p50(args.p50) * 1000:.2f} ms "
              f"({args.p50} samples)")
        return 0
    size = len(expected_lines(args.lines))
    print(f"{args.runs} runs of `seq 1 {args.lines}` ({size / 1e6:.1f} MB), 1-3 cuts each")
    double_lines = args.double_lines or args.lines
    seed = args.seed
    rows: list[tuple[str, tuple[int, int] | str]] = [
        ("ours, local service (default)", ours_local(args.runs, args.lines, random.Random(seed))),
        (f"ours, E2B double, resumable=True ({double_lines} lines)",
         ours_double_resumable(args.runs, double_lines, random.Random(seed))),
        ("official e2b SDK, local service",
         official_sdk(args.runs, args.lines, random.Random(seed))),
    ]  # fmt: skip
    for name, outcome in rows:
        if isinstance(outcome, str):
            print(f"{name:58} {outcome}")
            continue
        good, cuts = outcome
        print(f"{name:58} {good}/{args.runs} complete, in order, exit code known "
              f"({100 * good / args.runs:.1f} %), {cuts} cuts made")
    return 0


if __name__ == "__main__":
    sys.exit(main())
