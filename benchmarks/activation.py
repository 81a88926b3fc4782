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
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from benchmarks.clients import (
    SDK_MISSING,
    activate_e2b,
    activate_kubernetes,
    kubernetes_backend,
    load_sdk,
    ours_backend,
    sdk_sandbox,
)
from benchmarks.report import Role, Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context
from piship_remote.testing import CLAIMS, E2bServer, KubernetesServer, Recorded

__all__ = ["NAME", "run"]

NAME = "activation"

Activate = Callable[[contextlib.ExitStack], None]


def run(context: Context) -> ScenarioResult:
    """Rows of wall time (ms) with the request count of each activation."""
    began = time.perf_counter()
    workspace = context.workspace
    runs = context.size.activation_runs
    rows: list[Row] = []
    skipped: list[str] = []

    def ours(url: str) -> Activate:
        def activate(stack: contextlib.ExitStack) -> None:
            sandbox = activate_e2b(ours_backend(url, stack), workspace)
            stack.callback(sandbox.dispose)
            sandbox.exec("true")

        return activate

    def sdk(url: str) -> Activate:
        return lambda stack: sdk_sandbox(url, stack).commands.run("true")

    def kubernetes(url: str) -> Activate:
        def activate(stack: contextlib.ExitStack) -> None:
            sandbox = activate_kubernetes(kubernetes_backend(url, stack), workspace)
            stack.callback(sandbox.dispose)
            sandbox.exec("true")

        return activate

    has_sdk = load_sdk() is not None
    if not has_sdk:
        skipped.append(f"e2b-sdk: {SDK_MISSING}")
    loopback = context.loopback
    url = context.url
    with E2bServer() as doubles, KubernetesServer() as cluster:
        cases: list[tuple[str, str, Role, Activate, Callable[[], int]]] = [
            ("loopback", "ours-sandbox", "ours", ours(url), loopback.request_count),
            (
                "kubernetes-loopback",
                "ours-sandbox",
                "ours",
                kubernetes(url),
                loopback.request_count,
            ),
        ]
        if has_sdk:
            cases.append(("loopback", "e2b-sdk", "reference", sdk(url), loopback.request_count))
        if not context.rtt_ms:
            cases += _double_cases(doubles, cluster, ours, kubernetes, sdk if has_sdk else None)
        notes: list[str] = []
        logs = {"doubles": doubles, "kubernetes": cluster}
        for server, client, role, activate, count in cases:
            try:
                with contextlib.ExitStack() as stack:
                    activate(stack)  # warm-up: lazy imports and first connections
                before, claims = count(), cluster.count("POST", CLAIMS)
                seconds, requests = _time(activate, count, runs)
            except Exception as error:
                skipped.append(f"{server} {client}: {type(error).__name__}: {error}")
                continue
            extra: dict[str, float | int | str] = {"requests": requests}
            if server == "kubernetes":
                extra["claims per activation"] = (cluster.count("POST", CLAIMS) - claims) / runs
            rows.append(summarize(NAME, server, client, role, seconds, unit="ms", extra=extra))
            if server in logs:
                first = logs[server].requests[before : before + requests]
                notes.append(f"{server} {client}: " + ", ".join(_line(r) for r in first))
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped),
        notes=tuple(notes),
        seconds=time.perf_counter() - began,
    )


def _double_cases(
    doubles: E2bServer,
    cluster: KubernetesServer,
    ours: Callable[[str], Activate],
    kubernetes: Callable[[str], Activate],
    sdk: Callable[[str], Activate] | None,
) -> list[tuple[str, str, Role, Activate, Callable[[], int]]]:
    """The cases on the in-process werkzeug doubles (measured straight, never proxied)."""

    def on_doubles() -> int:
        return len(doubles.requests)

    def on_cluster() -> int:
        return len(cluster.requests)

    cases: list[tuple[str, str, Role, Activate, Callable[[], int]]] = [
        ("doubles", "ours-sandbox", "ours", ours(doubles.url), on_doubles),
        ("kubernetes", "ours-sandbox", "ours", kubernetes(cluster.url), on_cluster),
    ]
    if sdk is not None:
        cases.append(("doubles", "e2b-sdk", "reference", sdk(doubles.url), on_doubles))
    return cases


def _time(activate: Activate, count: Callable[[], int], runs: int) -> tuple[list[float], int]:
    """Seconds of each run, and the requests of the last one (its teardown excluded)."""
    seconds: list[float] = []
    requests = 0
    for _ in range(runs):
        with contextlib.ExitStack() as stack:
            before = count()
            start = time.perf_counter_ns()
            activate(stack)
            seconds.append((time.perf_counter_ns() - start) / 1e9)
            requests = count() - before
    return seconds, requests


def _line(recorded: Recorded) -> str:
    path = recorded.path.split("?")[0]
    return f"{recorded.method} {path.replace(CLAIMS, '<claims>')}"
