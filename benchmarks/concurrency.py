"""Concurrency: 1, 8 and 32 threads issuing commands on one sandbox and on one claim.

Each command takes ``size.command_ms`` on the server (``bench-sleep`` on the fast
loopback server, for E2B and for Kubernetes as ``kubernetes-loopback``; a handler
that sleeps on the werkzeug ``KubernetesServer``, as ``kubernetes``, which shares
this process's GIL and saturates first), so a client that overlaps its calls well
scales close to the thread count until a CPU saturates.
Reported per client and thread count: latency percentiles, throughput, the requests
the server answered per command, the scaling over one thread, peak thread counts
(Python and OS, the workers included) and, for Kubernetes, the claims created (must
be 1). Behind the delay proxy (``rtt_ms`` > 0) only the fast loopback server is used.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from benchmarks.clients import Client, e2b_clients, kubernetes_clients
from benchmarks.report import Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context
from benchmarks.sampling import ThreadSampler
from piship_remote.testing import CLAIMS, KubernetesServer

__all__ = ["NAME", "run"]

NAME = "concurrency"
E2B_CLIENTS = ("ours-sandbox", "e2b-sdk", "requests-raw")


class _Outcome:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: list[BaseException] = []
        self.lock = threading.Lock()


def run(context: Context) -> ScenarioResult:
    """Rows for E2B (loopback) and Kubernetes (``KubernetesServer``) at each thread count."""
    began = time.perf_counter()
    size = context.size
    rows: list[Row] = []
    skipped: list[str] = []
    loopback = context.loopback
    script = f"bench-sleep {size.command_ms}"
    with contextlib.ExitStack() as stack:
        clients, missing = e2b_clients(context.url, context.workspace, stack, names=E2B_CLIENTS)
        skipped += [f"e2b: {reason}" for reason in missing]
        counters = _Counters(loopback.request_count, lambda: {})
        rows += _sweep(context, "loopback", clients, script, skipped, counters)
    with contextlib.ExitStack() as stack:
        before = loopback.claim_count()
        clients, missing = kubernetes_clients(context.url, context.workspace, stack)
        skipped += [f"kubernetes-loopback: {reason}" for reason in missing]

        def loopback_claims() -> dict[str, float | int | str]:
            return {"claims": loopback.claim_count() - before}

        counters = _Counters(loopback.request_count, loopback_claims)
        rows += _sweep(context, "kubernetes-loopback", clients, script, skipped, counters)
    if not context.rtt_ms:
        rows += _werkzeug_cluster(context, script, skipped)
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(_with_scaling(rows)),
        skipped=tuple(skipped),
        notes=(
            f"every command spends {size.command_ms} ms on the server; each client runs "
            f"{size.concurrency_rounds} alternating rounds per thread count; throughput is "
            "commands/s over all threads and rounds; scaling = throughput / throughput at 1 "
            "thread; requests = requests the server answered per command; claims counts "
            "SandboxClaim creations since the server started (ours-sandbox made them)",
        ),
        seconds=time.perf_counter() - began,
    )


@attrs.frozen
class _Counters:
    """Requests answered so far, and the extra notes of a row, both read after each round."""

    requests: Callable[[], int]
    extra: Callable[[], dict[str, float | int | str]]


def _werkzeug_cluster(context: Context, script: str, skipped: list[str]) -> list[Row]:
    """The Kubernetes backend against the in-process ``KubernetesServer`` double."""
    delay = context.size.command_ms / 1000

    def execute(command: str) -> Mapping[str, Any]:
        time.sleep(delay)
        return {"stdout": "", "exit_code": 0}

    with KubernetesServer(execute) as cluster, contextlib.ExitStack() as stack:
        clients, missing = kubernetes_clients(cluster.url, context.workspace, stack)
        skipped += [f"kubernetes: {reason}" for reason in missing]

        def claims() -> dict[str, float | int | str]:
            return {"claims": cluster.count("POST", CLAIMS)}

        counters = _Counters(lambda: len(cluster.requests), claims)
        return _sweep(context, "kubernetes", clients, script, skipped, counters)


def _sweep(
    context: Context,
    server: str,
    clients: list[Client],
    script: str,
    skipped: list[str],
    counters: _Counters,
) -> list[Row]:
    rows: list[Row] = []
    for index, threads in enumerate(context.size.threads):
        totals = {client.name: _Totals() for client in clients}
        for round_index in range(context.size.concurrency_rounds):
            shift = (index + round_index) % max(1, len(clients))
            for client in (*clients[shift:], *clients[:shift]):
                totals[client.name].add(_measured(client, threads, context, script, counters))
        for client in clients:
            rows.append(_row(server, client, threads, totals[client.name], counters, skipped))
    return rows


@attrs.define
class _Totals:
    """One client's rounds at one thread count, summed."""

    latencies: list[float] = attrs.Factory(list)
    errors: list[BaseException] = attrs.Factory(list)
    seconds: float = 0.0
    requests: int = 0
    commands: int = 0
    peak_python: int = 0
    extra_python: int = 0
    peak_os: int = 0

    def add(self, measured: _Totals) -> None:
        self.latencies += measured.latencies
        self.errors += measured.errors
        self.seconds += measured.seconds
        self.requests += measured.requests
        self.commands += measured.commands
        self.peak_python = max(self.peak_python, measured.peak_python)
        self.extra_python = max(self.extra_python, measured.extra_python)
        self.peak_os = max(self.peak_os, measured.peak_os)


def _measured(
    client: Client, threads: int, context: Context, script: str, counters: _Counters
) -> _Totals:
    per_thread = context.size.commands_per_thread
    before = counters.requests()
    outcome, seconds, sampler, baseline = _round(client, threads, per_thread, script)
    return _Totals(
        latencies=outcome.latencies,
        errors=outcome.errors,
        seconds=seconds,
        requests=counters.requests() - before,
        commands=threads * per_thread,
        peak_python=sampler.peak_python,
        extra_python=sampler.peak_python - baseline - threads,
        peak_os=sampler.peak_os,
    )


def _row(
    server: str,
    client: Client,
    threads: int,
    totals: _Totals,
    counters: _Counters,
    skipped: list[str],
) -> Row:
    if totals.errors:
        first = totals.errors[0]
        skipped.append(
            f"{server} {client.name} threads={threads}: {len(totals.errors)} failures, "
            f"first {type(first).__name__}: {first}"
        )
    return summarize(
        NAME,
        server,
        client.name,
        client.role,
        totals.latencies,
        unit="ms",
        group=f"threads={threads}",
        extra={
            "per_s": len(totals.latencies) / totals.seconds if totals.seconds else 0.0,
            "requests": round(totals.requests / max(1, totals.commands), 2),
            "peak_py_threads": totals.peak_python,
            "extra_py_threads": totals.extra_python,
            "peak_os_threads": totals.peak_os,
            **counters.extra(),
        },
    )


def _round(
    client: Client, threads: int, per_thread: int, script: str
) -> tuple[_Outcome, float, ThreadSampler, int]:
    outcome = _Outcome()
    barrier = threading.Barrier(threads + 1)

    def work() -> None:
        barrier.wait()
        for _ in range(per_thread):
            start = time.perf_counter_ns()
            try:
                client.run(script)
            except Exception as error:
                with outcome.lock:
                    outcome.errors.append(error)
                continue
            with outcome.lock:
                outcome.latencies.append((time.perf_counter_ns() - start) / 1e9)

    baseline = threading.active_count()
    workers = [
        threading.Thread(target=work, name=f"piship-bench-worker-{i}", daemon=True)
        for i in range(threads)
    ]
    with ThreadSampler() as sampler:
        for worker in workers:
            worker.start()
        barrier.wait()
        start = time.perf_counter()
        for worker in workers:
            worker.join()
        seconds = time.perf_counter() - start
    return outcome, seconds, sampler, baseline


def _with_scaling(rows: list[Row]) -> list[Row]:
    single = {
        (row.server, row.client): row.extra["per_s"] for row in rows if row.group == "threads=1"
    }
    scaled: list[Row] = []
    for row in rows:
        base = single.get((row.server, row.client))
        per_s = row.extra["per_s"]
        if isinstance(base, float) and base > 0 and isinstance(per_s, float):
            row = attrs.evolve(row, extra={**row.extra, "scaling": per_s / base})
        scaled.append(row)
    return scaled
