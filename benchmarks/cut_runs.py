"""One client's runs of a command whose stream is cut (or stalled), in a worker process.

A run is ``echo >> <marker>; seq 1 LINES; exit 3``: complete when its stdout is every
line in order, its exit code known when it is 3, and run once when the marker holds one
line (on the E2B double: one ``Start`` request). Every connection to envd goes through a
:class:`~piship_remote.testing.cutting_proxy.CuttingProxy`, which resets the command's
answers (``Start``, then each ``Connect``) at 1-3 random points (``cuts``) or, separately,
stops relaying one at a random point until the client gives up (``stall``). Each run's
points are drawn from its seed, fault and index alone, so a run is the same whichever
worker makes it::

    plan = Share(client="ours-sandbox", server="local", fault="cuts", lines=10_000, ...)
    for outcome in run_share(plan):
        outcome.complete, outcome.exit_known, outcome.starts
"""

from __future__ import annotations

import contextlib
import inspect
import random
import shlex
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, Literal

import attrs

from benchmarks.clients import API_KEY, SDK_MISSING, activate_e2b, load_sdk, quietly
from benchmarks.local_service import HOME, USER
from piship_remote.backends.e2b._reattach import MAX_REATTACHES
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.testing import E2bServer
from piship_remote.testing.cutting_proxy import CuttingProxy

__all__ = [
    "DOUBLE_IDLE_PER_MB",
    "EXIT_CODE",
    "IDLE_TIMEOUT",
    "SDK_STALL_TIMEOUT",
    "Client",
    "Fault",
    "Outcome",
    "Server",
    "Share",
    "expected_output",
    "run_share",
]

Fault = Literal["cuts", "stall"]
Client = Literal["ours-sandbox", "e2b-sdk"]
Server = Literal["local", "doubles"]
EXIT_CODE = 3
IDLE_TIMEOUT = 2.0
"""Our ``stream_idle_timeout`` in the stalled runs (the cut ones keep the default)."""
DOUBLE_IDLE_PER_MB = 0.5
"""Added per MB of output on the double, which writes the spool before it answers a
Start's head (seconds for a Start of many MB)."""
SDK_STALL_TIMEOUT = 5.0
"""The SDK has no idle timeout: its command timeout ends a stalled run."""
RUN_TIMEOUT = 300.0
SDK_SANDBOX_LIFETIME = 6 * 3600
COMMAND_STREAMS = "/process.Process/"
"""Only the command's answers (Start, Connect) are cut, not a spool's read-back."""
_FRAME_BYTES = 32 * 1024
_FIRST_POINT = 1000  # past an answer's head and first event


@attrs.frozen
class Share:
    """What one worker runs: ``count`` runs from ``first``, of one client on one server."""

    client: Client
    server: Server
    fault: Fault
    lines: int
    seed: int
    first: int
    count: int
    service_url: str = ""
    service_key: str = ""


@attrs.frozen
class Outcome:
    """One run: what came back, how often the command started, the faults made."""

    complete: bool
    exit_known: bool
    starts: int
    """How often the command started; ``-1`` when that could not be checked."""
    faults: int
    seconds: float
    silent: bool = False
    """Output incomplete and no byte reported missing (ours only)."""


def expected_output(lines: int) -> str:
    return "".join(f"{n}\n" for n in range(1, lines + 1))


def fault_points(rng: random.Random, fault: Fault, output_bytes: int) -> list[int]:
    """Byte counts of an answer (base64 makes it about 4/3 of the output): 1-3 cuts that
    all land before the end, or one stall."""
    wire = output_bytes * 4 // 3
    count = 1 if fault == "stall" else rng.randint(1, 3)
    top = max(_FIRST_POINT + 1, wire // (count + 1))
    return [rng.randint(_FIRST_POINT, top) for _ in range(count)]


def run_share(share: Share) -> Iterator[Outcome]:
    """The share's runs, one outcome each, on one sandbox (created here, removed after)."""
    expected = expected_output(share.lines)
    with contextlib.ExitStack() as stack:
        target = _local(share, stack) if share.server == "local" else _double(expected, stack)
        client = _ours_sandbox if share.client == "ours-sandbox" else _sdk
        runner = client(share, target, stack)
        for index in range(share.first, share.first + share.count):
            rng = random.Random(f"{share.seed}-{share.fault}-{index}")
            marker = f"{HOME}/.started-{index}"
            command = f"echo . >> {marker}; seq 1 {share.lines}; exit {EXIT_CODE}"
            target.arm()
            points = fault_points(rng, share.fault, len(expected))
            target.proxy.plan(points, stall=share.fault == "stall", path=COMMAND_STREAMS)
            cuts, starts, began = target.proxy.cuts, target.starts(), time.perf_counter()
            complete, exit_known, silent = runner.measured(command, expected)
            seconds = time.perf_counter() - began
            target.proxy.plan([])
            if target.counts_starts:
                starts = target.starts() - starts
            else:
                starts = _marker_lines(runner, marker)
            yield Outcome(
                complete=complete,
                exit_known=exit_known,
                starts=starts,
                faults=target.proxy.cuts - cuts,
                seconds=seconds,
                silent=silent,
            )


def _marker_lines(runner: _Runner, marker: str) -> int:
    """How often the command started (``-1``: the check itself failed)."""
    try:
        return len(runner.read(f"cat {shlex.quote(marker)} 2>/dev/null").splitlines())
    except Exception:  # a client that broke on the check must not end the share
        return -1


@attrs.define
class _Target:
    """Where the runs go: envd behind ``proxy``; ``starts`` counts ``Start`` requests
    where the server can (``counts_starts``), else the marker file does."""

    endpoint: str
    api_key: str
    proxy: CuttingProxy
    arm: Callable[[], None] = lambda: None
    starts: Callable[[], int] = lambda: 0
    counts_starts: bool = False


@attrs.frozen
class _Runner:
    """A client's way to run the measured command (complete, exit code known, silent
    gap) and a check's stdout."""

    measured: Callable[[str, str], tuple[bool, bool, bool]]
    read: Callable[[str], str]


def _local(share: Share, stack: contextlib.ExitStack) -> _Target:
    proxy = stack.enter_context(CuttingProxy(share.service_url))
    return _Target(share.service_url, share.service_key, proxy)


def _double(expected: str, stack: contextlib.ExitStack) -> _Target:
    output = expected.encode()
    chunks = [output[at : at + _FRAME_BYTES] for at in range(0, len(output), _FRAME_BYTES)]
    answer = {"chunks": chunks, "exit_code": EXIT_CODE}  # in envd's 32 KiB data events
    double = stack.enter_context(E2bServer(command=lambda start: answer))
    proxy = stack.enter_context(CuttingProxy(double.url))
    past_the_end = [len(expected.encode()) + 1] * (MAX_REATTACHES + 1)

    def arm() -> None:
        # The double follows only commands armed with a cut: points past the end arm
        # each Start and Connect without cutting, so the proxy's faults are the only ones.
        double.faults.clear()
        double.faults.cut_streams_after(*past_the_end)

    def starts() -> int:
        return sum(request.path.endswith("/Start") for request in double.requests)

    return _Target(double.url, API_KEY, proxy, arm, starts, counts_starts=True)


def _idle_timeout(share: Share) -> float:
    if share.fault == "stall" and share.server == "doubles":
        return IDLE_TIMEOUT + DOUBLE_IDLE_PER_MB * len(expected_output(share.lines)) / 1e6
    if share.fault == "stall":
        return IDLE_TIMEOUT
    return float(inspect.signature(E2bCompatibleBackend).parameters["stream_idle_timeout"].default)


def _ours_sandbox(share: Share, target: _Target, stack: contextlib.ExitStack) -> _Runner:
    key = target.api_key
    backend = E2bCompatibleBackend(
        endpoint=target.endpoint, envd_url=target.proxy.url, credential=lambda: key,
        workdir=HOME, user=USER, stream_idle_timeout=_idle_timeout(share),
    )  # fmt: skip
    stack.callback(backend.close)
    workspace = stack.enter_context(tempfile.TemporaryDirectory(prefix="piship-bench-cuts-"))
    sandbox = activate_e2b(backend, workspace)
    stack.callback(sandbox.dispose)
    resumable = share.server == "doubles"  # the double keeps nothing: the spool has it

    def measured(command: str, expected: str) -> tuple[bool, bool, bool]:
        try:
            result = sandbox.run(
                command, output_limit=None, timeout=RUN_TIMEOUT, resumable=resumable
            )
        except Exception:  # an unknown outcome (or any failure) counts as neither
            return False, False, False
        complete = result.stdout == expected
        silent = not complete and not any(result.missing.values())
        return complete, result.exit_code == EXIT_CODE, silent

    def read(check: str) -> str:
        return str(sandbox.run(check, timeout=RUN_TIMEOUT).stdout)

    return _Runner(measured, read)


def _sdk(share: Share, target: _Target, stack: contextlib.ExitStack) -> _Runner:
    sdk = load_sdk()
    if sdk is None:
        raise RuntimeError(SDK_MISSING)
    # The SDK does not renew a sandbox: its lifetime must outlast the share's runs.
    sandbox = sdk.Sandbox.create(
        api_key=target.api_key, api_url=target.endpoint, sandbox_url=target.proxy.url,
        validate_api_key=False, timeout=SDK_SANDBOX_LIFETIME,
    )  # fmt: skip
    stack.callback(quietly, sandbox.kill)
    timeout = SDK_STALL_TIMEOUT if share.fault == "stall" else RUN_TIMEOUT

    def measured(command: str, expected: str) -> tuple[bool, bool, bool]:
        try:
            result: Any = sandbox.commands.run(command, timeout=timeout)
        except Exception as error:  # a non-zero exit raises, with the result's fields
            result = error
        stdout, exit_code = getattr(result, "stdout", None), getattr(result, "exit_code", None)
        return stdout == expected, exit_code == EXIT_CODE, False

    def read(check: str) -> str:
        return str(sandbox.commands.run(check, timeout=60).stdout)

    return _Runner(measured, read)
