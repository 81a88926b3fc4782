"""Exec latency: a command that answers at once, over and over, per client.

Measured against the fast loopback server (client costs visible) and against the
werkzeug-based ``E2bServer`` double (the project's test double). Clients: ours
(``Sandbox.exec`` and the bare instance), the official SDK, and the floor — the
same Start request on a kept-alive ``requests`` session. Each row notes how many
requests the server answered per command.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import attrs

from benchmarks.clients import Client, e2b_clients
from benchmarks.report import Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate, timed
from piship_remote.testing import E2bServer

__all__ = ["NAME", "run"]

NAME = "exec_latency"
COMMAND = "true"


def run(context: Context) -> ScenarioResult:
    """Median/p90/p99 latency of ``true`` per client, with the requests each command made.

    Straight to the servers (``rtt_ms`` 0) both the fast server and the werkzeug double
    are measured; behind the delay proxy only the fast server, ``size.rtt_exec_calls``
    times per client.
    """
    began = time.perf_counter()
    rows: list[Row] = []
    skipped: list[str] = []
    loopback = context.loopback
    size = context.size
    if context.rtt_ms:
        rounds = _Rounds(max(1, size.rtt_exec_calls // size.rtt_exec_batch), size.rtt_exec_batch)
        rows, skipped = _measure(context, "loopback", context.url, loopback.request_count, rounds)
    else:
        rounds = _Rounds(max(1, size.exec_calls // size.exec_batch), size.exec_batch)
        with E2bServer() as doubles:
            servers: tuple[tuple[str, str, Callable[[], int]], ...] = (
                ("loopback", context.url, loopback.request_count),
                ("doubles", doubles.url, lambda: len(doubles.requests)),
            )
            for server, url, count in servers:
                found, missing = _measure(context, server, url, count, rounds)
                rows += found
                skipped += [f"{server}: {reason}" for reason in missing]
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(dict.fromkeys(skipped)),
        notes=(
            "requests = requests the server answered per command (counted around each batch, "
            "so a request still in flight when a batch ends counts towards the next one)",
        ),
        seconds=time.perf_counter() - began,
    )


@attrs.frozen
class _Rounds:
    rounds: int
    batch: int


def _measure(
    context: Context, server: str, url: str, count: Callable[[], int], plan: _Rounds
) -> tuple[list[Row], list[str]]:
    requests: dict[str, int] = {}

    def measure(client: Client) -> list[float]:
        before = count()
        samples = [timed(client.run, COMMAND) for _ in range(plan.batch)]
        requests[client.name] = requests.get(client.name, 0) + count() - before
        return samples

    with contextlib.ExitStack() as stack:
        clients, skipped = e2b_clients(url, context.workspace, stack)
        samples = alternate(clients, rounds=plan.rounds, measure=measure)
        rows = [
            summarize(
                NAME,
                server,
                client.name,
                client.role,
                samples[client.name],
                unit="ms",
                extra={"requests": round(requests[client.name] / len(samples[client.name]), 2)},
            )
            for client in clients
            if samples[client.name]
        ]
    return rows, skipped
