"""What tracing costs a command: ``Sandbox.run`` traced against the same run untraced.

Two sandboxes on one backend against the fast loopback server, measured in alternating
rounds: ``untraced`` (the reference) records nothing, as without the ``otel`` extra;
``traced`` sends its spans through the SDK to an exporter that drops them (a
``SimpleSpanProcessor``, so the span's whole cost is on the command's path) and its
metrics to an in-memory reader. The sandboxes are made the way ``activate_sandbox``
makes them, each with its own providers handed in (nothing global is set or patched).
A row's ``ratio_reference`` is the traced median over the untraced one (goal: within
5 %, at most 1.05x).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import attrs

from benchmarks.clients import ours_backend
from benchmarks.report import Role, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate, timed
from piship_remote import E2bCompatibleBackend, Sandbox
from piship_remote.model.policy import SandboxPolicy, resolve_profile
from piship_remote.sandbox._activation_steps import Activation
from piship_remote.telemetry import Telemetry

__all__ = ["NAME", "run"]

NAME = "tracing_cost"
COMMAND = "true"
SDK_MISSING = "needs the otel extra and the SDK: pip install -e '.[otel]' opentelemetry-sdk"
_DENY = {"required": True, "network": {"mode": "deny"}}


@attrs.frozen
class _Client:
    name: str
    role: Role
    sandbox: Sandbox

    def run(self) -> None:
        self.sandbox.run(COMMAND)


def run(context: Context) -> ScenarioResult:
    """Median/p90/p99 latency of ``true`` through ``Sandbox.run``, traced and untraced."""
    began = time.perf_counter()
    try:
        providers = _sdk_providers()
    except ImportError:
        return ScenarioResult(name=NAME, skipped=(SDK_MISSING,), seconds=0.0)
    size = context.size
    with contextlib.ExitStack() as stack:
        for provider in providers:
            stack.callback(provider.shutdown)
        backend = ours_backend(context.url, stack)
        traced = Telemetry.of(backend.id, backend.redactor, *providers)
        clients = [
            _Client("untraced", "reference", _sandbox(backend, context, Telemetry(backend.id))),
            _Client("traced", "ours", _sandbox(backend, context, traced)),
        ]
        for client in clients:
            stack.callback(client.sandbox.dispose)
            client.run()  # warm: connections, the first renewal

        def measure(client: _Client) -> list[float]:
            return [timed(client.run) for _ in range(size.exec_batch)]

        rounds = max(1, size.exec_calls // size.exec_batch)
        samples = alternate(clients, rounds=rounds, measure=measure)
    rows = [
        summarize(NAME, "loopback", c.name, c.role, samples[c.name], unit="ms") for c in clients
    ]
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        notes=("traced: SDK spans to an exporter that drops them, metrics to a memory reader",),
        seconds=time.perf_counter() - began,
    )


def _sandbox(backend: E2bCompatibleBackend, context: Context, telemetry: Telemetry) -> Sandbox:
    """A sandbox as ``activate_sandbox`` makes it, recording to ``telemetry``."""
    policy = SandboxPolicy.from_dict(_DENY)
    profile = resolve_profile(policy, workspace=context.workspace)
    activation = Activation(
        policy,
        profile,
        backend,
        {},
        5.0,
        60.0,
        sandbox_type=Sandbox,
        telemetry=telemetry,
    )
    return activation.run()


def _sdk_providers() -> tuple[Any, Any]:
    """A tracer provider whose spans are exported to nowhere, and a meter provider."""
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
    return tracing, MeterProvider(metric_readers=[InMemoryMetricReader()])
