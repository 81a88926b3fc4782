"""Exec latency: a command that answers at once, over and over, per client.

Measured against the fast loopback server (client costs visible) and against the
werkzeug-based ``E2bServer`` double (the project's test double). Clients: ours
(``Sandbox.exec`` and the bare instance), the official SDK, and the floor — the
same Start request on a kept-alive ``requests`` session.
"""

from __future__ import annotations

import contextlib
import time

from benchmarks.clients import e2b_clients
from benchmarks.report import Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate, timed
from piship_remote.testing import E2bServer

__all__ = ["NAME", "run"]

NAME = "exec_latency"
COMMAND = "true"


def run(context: Context) -> ScenarioResult:
    """Median/p90/p99 latency of ``true`` for each client on both servers."""
    began = time.perf_counter()
    rows: list[Row] = []
    skipped: list[str] = []
    with E2bServer() as doubles:
        for server, url in (("loopback", context.loopback.url), ("doubles", doubles.url)):
            found, missing = _measure(context, server, url)
            rows += found
            skipped += [f"{server}: {reason}" for reason in missing]
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(dict.fromkeys(skipped)),
        notes=(
            "ours-* do two requests per command (renew POST /sandboxes/<id>/timeout, then "
            "Start); the SDK and the floor do one",
        ),
        seconds=time.perf_counter() - began,
    )


def _measure(context: Context, server: str, url: str) -> tuple[list[Row], list[str]]:
    size = context.size
    with contextlib.ExitStack() as stack:
        clients, skipped = e2b_clients(url, context.workspace, stack)
        samples = alternate(
            clients,
            rounds=max(1, size.exec_calls // size.exec_batch),
            measure=lambda client: [timed(client.run, COMMAND) for _ in range(size.exec_batch)],
        )
        rows = [
            summarize(NAME, server, client.name, client.role, samples[client.name], unit="ms")
            for client in clients
        ]
    return rows, skipped
