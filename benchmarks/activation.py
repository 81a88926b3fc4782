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

The SDK keeps its HTTP connections for the whole process, so once warmed up its
activations reuse one; the ``new connection`` rows give ours and the SDK, after the
same warm-up, an address neither has a connection to (a delay proxy of its own per
run, 0 ms each way at 0 RTT), as the first activation of a fresh process would.
"""

from __future__ import annotations

import contextlib
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
from benchmarks.proxy import ProxyProcess
from benchmarks.report import Role, Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context
from piship_remote.testing import CLAIMS, E2bServer, KubernetesServer, Recorded

__all__ = ["NAME", "run"]

NAME = "activation"

NEW_CONNECTION = "new connection"

Activate = Callable[[contextlib.ExitStack, str], None]
"""Activate against the service at the URL given, releasing everything on the stack."""


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

    with E2bServer() as doubles, KubernetesServer() as cluster:
        cases = [
            on_loopback("loopback", "ours-sandbox", "ours", ours),
            on_loopback("loopback", "ours-sandbox", "ours", ours, NEW_CONNECTION),
            on_loopback("kubernetes-loopback", "ours-sandbox", "ours", kubernetes),
        ]
        if has_sdk:
            cases.append(on_loopback("loopback", "e2b-sdk", "reference", sdk))
            cases.append(on_loopback("loopback", "e2b-sdk", "reference", sdk, NEW_CONNECTION))
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
    """``NEW_CONNECTION``: each run on an address no client has a connection to yet."""


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
            if case.group == NEW_CONNECTION:
                fresh = ProxyProcess(context.loopback.url, delay_ms=context.rtt_ms / 2)
                url = stack.enter_context(fresh).url
            requests = case.requests()
            connections = case.connections() if case.connections is not None else 0
            start = time.perf_counter_ns()
            case.activate(stack, url)
            seconds.append((time.perf_counter_ns() - start) / 1e9)
            extra["requests"] = case.requests() - requests
            if case.connections is not None:
                extra["connections"] = case.connections() - connections
    return seconds, extra


def _line(recorded: Recorded) -> str:
    path = recorded.path.split("?")[0]
    return f"{recorded.method} {path.replace(CLAIMS, '<claims>')}"
