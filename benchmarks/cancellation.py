"""Cancellation: from a timeout's deadline to the kill reaching the service, and to the raise.

Each run starts ``bench-hang <id>`` on the fast loopback server, which keeps the
stream open and notes (on ``CLOCK_MONOTONIC``, shared with this process) when the
kill for ``<id>`` arrives. Clients:

- ``ours-sandbox``: ``Sandbox.exec(..., timeout=T)`` must raise ``CommandTimeout``;
- ``ours-instance``: the bare instance's ``exec(cancel=event)``, a plain
  ``threading.Event`` set at the deadline by another thread;
- ``e2b-sdk``: ``commands.run(..., timeout=T)``; the SDK sends no SendSignal but
  ``Connect-Timeout-Ms``, so its "kill" is the server's own deadline firing (as
  envd's would) and only its time to raise compares;
- ``requests-raw`` (floor): another thread POSTs SendSignal at the deadline on its
  own kept-alive session while the caller reads the stream until it ends.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Iterator

from benchmarks.clients import (
    Client,
    OursInstance,
    OursSandbox,
    RawRequests,
    SdkClient,
    e2b_clients,
    pooled_session,
    start_body,
    start_headers,
)
from benchmarks.loopback import LoopbackServer
from benchmarks.report import Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate
from piship_remote.model.errors import CommandCancelled, CommandTimeout

__all__ = ["NAME", "run"]

NAME = "cancellation"
TO_SIGNAL = "to SendSignal"
TO_RAISE = "to raise"


class _Runner:
    """Runs one hung command per call for every client; keeps the two delays per client."""

    def __init__(self, server: LoopbackServer, timeout: float) -> None:
        self.server = server
        self.timeout = timeout
        self.ids = itertools.count(1)
        self.signal_delays: dict[str, list[float]] = {}
        self.failures: list[str] = []
        self.signaller = pooled_session()

    def measure(self, client: Client) -> list[float]:
        run_id = f"{client.name}-{next(self.ids)}"
        start = time.monotonic_ns()
        deadline = start + int(self.timeout * 1e9)
        try:
            self._cancel(client, run_id, deadline)
        except Exception as error:
            self.failures.append(f"{client.name}: {type(error).__name__}: {error}")
        raised = time.monotonic_ns()
        arrival = self.server.signal_arrival(run_id)
        if arrival is None:
            self.failures.append(f"{client.name}: no kill reached the server for {run_id}")
        else:
            self.signal_delays.setdefault(client.name, []).append((arrival[0] - deadline) / 1e9)
        return [(raised - deadline) / 1e9]

    def _cancel(self, client: Client, run_id: str, deadline: int) -> None:
        script = f"bench-hang {run_id}"
        if isinstance(client, OursSandbox):
            with contextlib.suppress(CommandTimeout):
                client.sandbox.exec(script, timeout=self.timeout)
                raise RuntimeError("no CommandTimeout")
        elif isinstance(client, OursInstance):
            event = threading.Event()
            with _at(deadline, event.set), contextlib.suppress(CommandCancelled):
                client.instance.exec(client.request(script), cancel=event)
                raise RuntimeError("no CommandCancelled")
        elif isinstance(client, SdkClient):
            try:
                client.sdk.commands.run(script, timeout=self.timeout)
            except Exception as error:
                if "timed out" not in str(error).lower() and "deadline" not in str(error).lower():
                    raise
            else:
                raise RuntimeError("no TimeoutException")
        elif isinstance(client, RawRequests):
            self._raw(client, run_id, script, deadline)

    def _raw(self, client: RawRequests, run_id: str, script: str, deadline: int) -> None:
        def kill() -> None:
            self.signaller.post(
                client.url.replace("/Start", "/SendSignal"),
                json={"process": {"tag": run_id}, "signal": "SIGNAL_SIGKILL"},
                headers={"X-Access-Token": start_headers()["X-Access-Token"]},
                timeout=10,
            ).close()

        body = start_body(script, tag=run_id)
        with (
            _at(deadline, kill),
            client.session.post(
                client.url, data=body, headers=client.headers, stream=True, timeout=60
            ) as response,
        ):
            for _ in response.iter_content(None):
                pass


@contextlib.contextmanager
def _at(deadline_ns: int, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` on a ``piship-bench-deadline`` thread at ``deadline_ns`` (monotonic)."""

    def wait_then_act() -> None:
        remaining = (deadline_ns - time.monotonic_ns()) / 1e9
        if remaining > 0:
            time.sleep(remaining)
        action()

    thread = threading.Thread(target=wait_then_act, name="piship-bench-deadline", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def run(context: Context) -> ScenarioResult:
    """p50/p90/p99 of both delays per client over ``size.cancel_runs`` runs."""
    began = time.perf_counter()
    size = context.size
    runner = _Runner(context.loopback, size.cancel_timeout)
    rows: list[Row] = []
    with contextlib.ExitStack() as stack:
        stack.callback(runner.signaller.close)
        clients, skipped = e2b_clients(context.url, context.workspace, stack)
        raised = alternate(clients, rounds=size.cancel_runs, measure=runner.measure)
        for client in clients:
            rows.append(
                summarize(
                    NAME,
                    "loopback",
                    client.name,
                    client.role,
                    runner.signal_delays.get(client.name, []),
                    unit="ms",
                    group=TO_SIGNAL,
                )
            )
            rows.append(
                summarize(
                    NAME,
                    "loopback",
                    client.name,
                    client.role,
                    raised[client.name],
                    unit="ms",
                    group=TO_RAISE,
                )
            )
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped + sorted(set(runner.failures))[:10]),
        notes=(
            f"timeout {size.cancel_timeout * 1000:.0f} ms; delays are measured from the "
            "deadline; e2b-sdk's 'to SendSignal' is the server's own Connect-Timeout-Ms deadline "
            "(the SDK sends no kill), so that row is not comparable",
        ),
        seconds=time.perf_counter() - began,
    )
