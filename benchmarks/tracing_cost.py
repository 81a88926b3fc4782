"""What tracing costs a command: ``Sandbox.run`` traced against the same run untraced.

Measured in a child process of its own, because it sets OpenTelemetry's global tracer
and meter providers (the SDK, spans to an exporter that drops them through a
``SimpleSpanProcessor``, so a span's whole cost is on the command's path; metrics to an
in-memory reader), which would trace every scenario after it. In that one process two
sandboxes on the fast loopback server run ``true`` in alternating rounds: ``traced``
(the SDK records the command's span, its lease renewal's span, the metrics and the
``traceparent``) and ``untraced`` (the reference), whose batches run under
OpenTelemetry's ``suppress_instrumentation`` context, where the library records
nothing. A row's ``ratio_reference`` is the traced median over the untraced one. The goal
(within 5 %, at most 1.05x) is checked at both round trips: at 20 ms, and straight to the
loopback server, where a command takes a few hundred microseconds, so the SDK's own cost
per span and measurement shows as it is.

    python -m benchmarks.tracing_cost URL WORKSPACE ROUNDS BATCH   # the child: JSON samples
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from benchmarks.clients import ours_backend
from benchmarks.report import Role, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate, timed
from piship_remote import Sandbox, activate_sandbox

__all__ = ["NAME", "install_sdk", "run", "suppressed"]

NAME = "tracing_cost"
COMMAND = "true"
SDK_MISSING = "needs the otel extra and the SDK: pip install -e '.[otel]' opentelemetry-sdk"
_DENY = {"required": True, "network": {"mode": "deny"}}
_ROLES: dict[str, Role] = {"untraced": "reference", "traced": "ours"}


def run(context: Context) -> ScenarioResult:
    """Median/p90/p99 latency of ``true`` through ``Sandbox.run``, traced and untraced."""
    began = time.perf_counter()
    size = context.size
    if context.rtt_ms:
        rounds, batch = max(1, size.rtt_exec_calls // size.rtt_exec_batch), size.rtt_exec_batch
    else:
        rounds, batch = max(1, size.exec_calls // size.exec_batch), size.exec_batch
    child = [context.url, context.workspace, str(rounds), str(batch)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.tracing_cost", *child],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the tracing_cost child failed: {done.stderr.strip()[-2000:]}")
    found = json.loads(done.stdout)
    if "skipped" in found:
        return ScenarioResult(name=NAME, skipped=(found["skipped"],), seconds=0.0)
    rows = [
        summarize(NAME, "loopback", name, _ROLES[name], samples, unit="ms")
        for name, samples in found["samples"].items()
    ]
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        notes=(
            "traced: the SDK, spans to an exporter that drops them, metrics to a memory reader;"
            " untraced: the same process under suppress_instrumentation",
        ),
        seconds=time.perf_counter() - began,
    )


@attrs.define  # not frozen: rounds.Named wants a plain ``name`` attribute
class _Client:
    name: str
    sandbox: Sandbox
    scope: Callable[[], contextlib.AbstractContextManager[object]]

    def batch(self, calls: int) -> list[float]:
        with self.scope():
            return [timed(self.sandbox.run, COMMAND) for _ in range(calls)]


def _measure(url: str, workspace: str, rounds: int, batch: int) -> dict[str, Any]:
    """The child: set the SDK as the global providers, then time both clients."""
    try:
        install_sdk()
    except ImportError:
        return {"skipped": SDK_MISSING}
    with contextlib.ExitStack() as stack:
        backend = ours_backend(url, stack)
        clients = []
        for name, scope in (("untraced", suppressed), ("traced", contextlib.nullcontext)):
            sandbox = activate_sandbox(_DENY, backend=backend, workspace=workspace, env={})
            stack.callback(sandbox.dispose)
            client = _Client(name, sandbox, scope)
            client.batch(2)  # warm: the connections, the first renewal
            clients.append(client)
        samples = alternate(clients, rounds=rounds, measure=lambda c: c.batch(batch))
    return {"samples": samples}


@contextlib.contextmanager
def suppressed() -> Iterator[object]:
    from opentelemetry import context

    token = context.attach(context.set_value(context._SUPPRESS_INSTRUMENTATION_KEY, True))
    try:
        yield None
    finally:
        context.detach(token)


def install_sdk() -> None:
    """The SDK as the global providers: spans exported to nowhere, metrics kept in memory."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(Dropped()))
    trace.set_tracer_provider(tracing)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))


if __name__ == "__main__":
    url, workspace, rounds, batch = sys.argv[1:5]
    print(json.dumps(_measure(url, workspace, int(rounds), int(batch))))
