"""OpenTelemetry's SDK for the telemetry tests: in-memory spans and metrics, and the sweep.

The global tracer and meter providers can be set once per process, so they are set
once (``otel_sdk``, session-wide; a plugin of ``conftest.py``, so that every module shares
it) and each test starts from an empty exporter (``otel``). Without the SDK the tests
that need it skip, naming what to install.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from tests.support.optional_peers import install_hint

__all__ = ["Recorded", "otel", "otel_sdk", "total"]

SDK_HINT = install_hint("otel") + " opentelemetry-sdk"


class Recorded:
    """What the SDK received: finished spans and the metrics read so far."""

    def __init__(self, exporter: Any, reader: Any, ended: threading.Condition) -> None:
        self._exporter = exporter
        self._reader = reader
        self._ended = ended

    def spans(self, name: str | None = None) -> list[Any]:
        """The finished spans (named ``name``), in the order they ended."""
        spans = list(self._exporter.get_finished_spans())
        return [s for s in spans if name is None or s.name == name]

    def wait_for(self, name: str, timeout: float) -> list[Any]:
        """The finished spans named ``name``, once there is one (none after ``timeout``)."""
        with self._ended:
            self._ended.wait_for(lambda: self.spans(name), timeout)
        return self.spans(name)

    def metrics(self) -> dict[str, Any]:
        """Each metric of the ``piship_remote`` scope by name (its unit and data points)."""
        data = self._reader.get_metrics_data()
        found: dict[str, Any] = {}
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                if scope.scope.name == "piship_remote":
                    found.update({metric.name: metric for metric in scope.metrics})
        return found

    def points(self, name: str) -> list[Any]:
        metric = self.metrics().get(name)
        return [] if metric is None else list(metric.data.data_points)

    def texts(self) -> Iterator[str]:
        """Every text an exporter would send: names, attribute keys and values, statuses."""
        for span in self.spans():
            yield span.name
            yield span.status.description or ""
            yield from _attribute_texts(span.attributes)
            for event in span.events:
                yield event.name
                yield from _attribute_texts(event.attributes)
        for metric in self.metrics().values():
            yield metric.name
            for point in metric.data.data_points:
                yield from _attribute_texts(point.attributes)

    def clear(self) -> None:
        self._exporter.clear()


def _attribute_texts(attributes: Any) -> Iterable[str]:
    for key, value in (attributes or {}).items():
        yield key
        yield str(value)


@pytest.fixture(scope="session")
def otel_sdk() -> tuple[Any, Any, threading.Condition]:
    """The SDK as the global tracer and meter providers (once per process), and a
    condition notified whenever a span ends."""
    pytest.importorskip("opentelemetry.sdk", reason=SDK_HINT)
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    ended = threading.Condition()

    class Notifying(SimpleSpanProcessor):
        def on_end(self, span: ReadableSpan) -> None:
            super().on_end(span)
            with ended:
                ended.notify_all()

    exporter = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(Notifying(exporter))
    trace.set_tracer_provider(tracing)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return exporter, reader, ended


@pytest.fixture
def otel(otel_sdk: tuple[Any, Any, threading.Condition], secret_sweep: Any) -> Iterator[Recorded]:
    """The spans and metrics of this test (spans cleared first; metrics are cumulative),
    handed to the suite's secret sweep at the end."""
    recorded = Recorded(*otel_sdk)
    recorded.clear()
    yield recorded
    secret_sweep.exported.extend(recorded.texts())
    recorded.clear()


def total(recorded: Recorded, name: str, **labels: Any) -> float:
    """The sum of ``name``'s points whose attributes include ``labels`` (a histogram's count)."""
    wanted = {key.replace("__", "."): value for key, value in labels.items()}
    found = 0.0
    for point in recorded.points(name):
        if all(point.attributes.get(key) == value for key, value in wanted.items()):
            found += point.count if hasattr(point, "count") else point.value
    return found
