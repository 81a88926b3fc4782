"""Activation: requests and wall time from nothing to the first command's result.

Behind the delay proxy (``rtt_ms`` > 0) only the fast loopback server is measured
(E2B for ours and the SDK, and the Kubernetes backend); the werkzeug doubles are
measured straight. Each case runs once untimed first (lazy imports, the first
connection to a server).

Ours: backend construction, ``activate_sandbox`` (health, create, readiness check)
and ``Sandbox.exec("true")``. Reference: the official SDK's ``Sandbox.create`` and
``commands.run("true")``. E2B runs on the fast loopback server and on the
``E2bServer`` double; Kubernetes on ``KubernetesServer`` with a 50 ms readiness poll
(the double answers "not ready" to the first poll of every claim) and on the fast
loopback server (ready at once).

The SDK keeps its HTTP connections for the whole process and ours for the backend's
life, so the kept rows reuse, after the warm-up, the SDK's process-wide pool and one
backend of ours for every run. The ``new connection`` rows give ours (a new backend)
and the SDK an address neither has a connection to (a delay proxy of its own per run,
0 ms each way at 0 RTT). The ``fresh process`` rows go further, as a new user's first
activation: each run is a child process (``python -m benchmarks.activation --child
ours|sdk``) that has imported everything but made no request before, on a proxy of
its own; the child times from the backend's construction (the SDK's
``Sandbox.create``) to the first command's result.

The delay proxy charges a new TCP connection its handshake (one round trip before
the first bytes reach the server), so every client pays for the connections it opens.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import attrs

from benchmarks.clients import (
    SDK_MISSING,
    activate_e2b,
    activate_kubernetes,
    kubernetes_backend,
    load_sdk,
    ours_backend,
    sdk_sandbox,
)
from benchmarks.loopback import ROOT, readline_within
from benchmarks.proxy import ProxyProcess
from benchmarks.report import Role, Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.testing import CLAIMS, E2bServer, KubernetesServer, Recorded

__all__ = ["NAME", "run"]

NAME = "activation"

NEW_CONNECTION = "new connection"
FRESH_PROCESS = "fresh process"
_CHILD_TIMEOUT = 60.0
_GO = "go"

Activate = Callable[[contextlib.ExitStack, str], "float | None"]
"""Activate against the service at the URL given, releasing everything on the stack;
the seconds it took when it timed itself (in a child process), else ``None``."""


def run(context: Context) -> ScenarioResult:
    """Rows of wall time (ms) with the request count of each activation."""
    began = time.perf_counter()
    workspace = context.workspace
    runs = context.size.activation_runs
    rows: list[Row] = []
    skipped: list[str] = []

    def ours(stack: contextlib.ExitStack, url: str) -> None:
        sandbox = activate_e2b(ours_backend(url, stack), workspace)
        stack.callback(sandbox.dispose)
        sandbox.exec("true")

    kept_backends = contextlib.ExitStack()
    backends: dict[str, E2bCompatibleBackend] = {}

    def ours_kept(stack: contextlib.ExitStack, url: str) -> None:
        if url not in backends:
            backends[url] = ours_backend(url, kept_backends)
        sandbox = activate_e2b(backends[url], workspace)
        stack.callback(sandbox.dispose)
        sandbox.exec("true")

    def sdk(stack: contextlib.ExitStack, url: str) -> None:
        sdk_sandbox(url, stack).commands.run("true")

    def kubernetes(stack: contextlib.ExitStack, url: str) -> None:
        sandbox = activate_kubernetes(kubernetes_backend(url, stack), workspace)
        stack.callback(sandbox.dispose)
        sandbox.exec("true")

    has_sdk = load_sdk() is not None
    if not has_sdk:
        skipped.append(f"e2b-sdk: {SDK_MISSING}")
    loopback = context.loopback
    url = context.url

    def on_loopback(
        server: str, client: str, role: Role, activate: Activate, group: str = ""
    ) -> _Case:
        return _Case(
            server,
            client,
            role,
            activate,
            url,
            loopback.request_count,
            loopback.connection_count,
            group,
        )

    with E2bServer() as doubles, KubernetesServer() as cluster, kept_backends:
        cases = [
            on_loopback("loopback", "ours-sandbox", "ours", ours_kept),
            on_loopback("loopback", "ours-sandbox", "ours", ours, NEW_CONNECTION),
            on_loopback("loopback", "ours-sandbox", "ours", _in_child("ours"), FRESH_PROCESS),
            on_loopback("kubernetes-loopback", "ours-sandbox", "ours", kubernetes),
        ]
        if has_sdk:
            cases.append(on_loopback("loopback", "e2b-sdk", "reference", sdk))
            cases.append(on_loopback("loopback", "e2b-sdk", "reference", sdk, NEW_CONNECTION))
            cases.append(
                on_loopback("loopback", "e2b-sdk", "reference", _in_child("sdk"), FRESH_PROCESS)
            )
        if not context.rtt_ms:
            cases += _double_cases(doubles, cluster, ours, kubernetes, sdk if has_sdk else None)
        notes: list[str] = [
            "requests and connections: what the server answered and accepted during the last "
            "activation (connections only on the loopback server)"
        ]
        logs = {"doubles": doubles, "kubernetes": cluster}
        for case in cases:
            try:
                with contextlib.ExitStack() as stack:
                    case.activate(stack, case.url)  # warm-up: lazy imports, first connections
                before, claims = case.requests(), cluster.count("POST", CLAIMS)
                seconds, extra = _time(case, runs, context)
            except Exception as error:
                skipped.append(f"{case.server} {case.client}: {type(error).__name__}: {error}")
                continue
            if case.server == "kubernetes":
                extra["claims per activation"] = (cluster.count("POST", CLAIMS) - claims) / runs
            rows.append(
                summarize(
                    NAME,
                    case.server,
                    case.client,
                    case.role,
                    seconds,
                    unit="ms",
                    group=case.group,
                    extra=extra,
                )
            )
            if case.server in logs and not case.group:
                first = logs[case.server].requests[before : before + int(extra["requests"])]
                notes.append(f"{case.server} {case.client}: " + ", ".join(_line(r) for r in first))
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped),
        notes=tuple(notes),
        seconds=time.perf_counter() - began,
    )


@attrs.frozen
class _Case:
    """One client activating on one server, with the counters read around each run."""

    server: str
    client: str
    role: Role
    activate: Activate
    url: str
    requests: Callable[[], int]
    connections: Callable[[], int] | None = None
    group: str = ""
    """``NEW_CONNECTION``: each run on an address no client has a connection to yet;
    ``FRESH_PROCESS``: the same, from a process that has made no request before."""


def _double_cases(
    doubles: E2bServer,
    cluster: KubernetesServer,
    ours: Activate,
    kubernetes: Activate,
    sdk: Activate | None,
) -> list[_Case]:
    """The cases on the in-process werkzeug doubles (measured straight, never proxied)."""

    def on_doubles() -> int:
        return len(doubles.requests)

    def on_cluster() -> int:
        return len(cluster.requests)

    cases = [
        _Case("doubles", "ours-sandbox", "ours", ours, doubles.url, on_doubles),
        _Case("kubernetes", "ours-sandbox", "ours", kubernetes, cluster.url, on_cluster),
    ]
    if sdk is not None:
        cases.append(_Case("doubles", "e2b-sdk", "reference", sdk, doubles.url, on_doubles))
    return cases


def _time(
    case: _Case, runs: int, context: Context
) -> tuple[list[float], dict[str, float | int | str]]:
    """Seconds of each run, and the requests (and connections) of the last one.

    The counters are read before the teardown, so the teardown's requests are not counted.
    A ``NEW_CONNECTION`` run goes through a delay proxy of its own, started untimed.
    """
    seconds: list[float] = []
    extra: dict[str, float | int | str] = {}
    for _ in range(runs):
        with contextlib.ExitStack() as stack:
            url = case.url
            if case.group in (NEW_CONNECTION, FRESH_PROCESS):
                fresh = ProxyProcess(context.loopback.url, delay_ms=context.rtt_ms / 2)
                url = stack.enter_context(fresh).url
            requests = case.requests()
            connections = case.connections() if case.connections is not None else 0
            start = time.perf_counter_ns()
            timed = case.activate(stack, url)
            seconds.append((time.perf_counter_ns() - start) / 1e9 if timed is None else timed)
            extra["requests"] = case.requests() - requests
            if case.connections is not None:
                extra["connections"] = case.connections() - connections
    return seconds, extra


def _in_child(client: str) -> Activate:
    """Activate in a fresh child process, which reports the seconds it took.

    The child imports everything, says it is ready, and on ``go`` times one activation
    and its first command; the counters are read while it waits to tear down.
    """

    def activate(stack: contextlib.ExitStack, url: str) -> float:
        child = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.activation", "--child", client, "--url", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        stack.callback(_reap, child)
        assert child.stdin is not None and child.stdout is not None
        if readline_within(child.stdout, _CHILD_TIMEOUT) != "ready":
            raise RuntimeError(f"the {client} child did not start")
        child.stdin.write(f"{_GO}\n")
        child.stdin.flush()
        answer = readline_within(child.stdout, _CHILD_TIMEOUT)
        try:
            return float(answer)
        except ValueError:
            raise RuntimeError(f"the {client} child failed: {answer!r}") from None

    return activate


def _reap(child: subprocess.Popen[str]) -> None:
    """Let the child tear down (its stdin closes) and wait for it."""
    if child.stdin is not None:
        with contextlib.suppress(OSError):
            child.stdin.close()
    try:
        child.wait(_CHILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    if child.stdout is not None:
        child.stdout.close()


def _child(client: str, url: str) -> None:
    """One first activation in this process: print its seconds, tear down at EOF."""
    load_sdk()  # imported before the clock starts, as for ours
    with tempfile.TemporaryDirectory() as workspace, contextlib.ExitStack() as stack:
        print("ready", flush=True)
        if sys.stdin.readline().strip() != _GO:
            return
        try:
            start = time.perf_counter_ns()
            if client == "sdk":
                sdk_sandbox(url, stack).commands.run("true")
            else:
                sandbox = activate_e2b(ours_backend(url, stack), workspace)
                stack.callback(sandbox.dispose)
                sandbox.exec("true")
            seconds = (time.perf_counter_ns() - start) / 1e9
        except Exception as error:
            print(f"{type(error).__name__}: {error}", flush=True)
            return
        print(seconds, flush=True)
        sys.stdin.read()  # the parent has read its counters: tear down


def _main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.activation")
    parser.add_argument("--child", choices=("ours", "sdk"), required=True)
    parser.add_argument("--url", required=True)
    args = parser.parse_args()
    _child(args.child, args.url)


def _line(recorded: Recorded) -> str:
    path = recorded.path.split("?")[0]
    return f"{recorded.method} {path.replace(CLAIMS, '<claims>')}"


if __name__ == "__main__":
    _main()
