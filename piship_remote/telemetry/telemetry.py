"""What one backend, activation, sandbox or pool records: spans and metrics, or nothing.

    telemetry = Telemetry.load("e2b", redactor)
    with telemetry.span(names.PUSH_SPAN, sandbox_id) as span:
        ...
    telemetry.transferred(4096, "upload")

:meth:`Telemetry.load` imports ``opentelemetry`` (the ``otel`` extra). Without it the
object it returns does nothing and nothing more is imported. With it, spans and metrics
go to the global tracer and meter providers the application configured (none
configured: OpenTelemetry's own no-op). The tracer and instruments are held here, made
once per object, so no module keeps any state.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from piship_remote.model.redact import Redactor, redaction
from piship_remote.telemetry import names
from piship_remote.telemetry._api import OtelApi
from piship_remote.telemetry._instruments import Instruments
from piship_remote.telemetry.context import traceparent_of
from piship_remote.telemetry.spans import (
    AttributeValue,
    Ended,
    LiveSpan,
    NoSpan,
    StartedSpan,
    clean_attributes,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Tracer, TracerProvider

__all__ = ["NO_SPAN", "Telemetry"]

NO_SPAN = NoSpan()
_T = TypeVar("_T")


class Telemetry:
    """The spans and metrics of one part of the library, for the backend ``backend``."""

    __slots__ = (
        "_api",
        "_attributes",
        "_instruments",
        "_last_id",
        "_redactor",
        "_tracer",
        "backend",
    )

    def __init__(
        self,
        backend: str,
        redactor: Redactor | None = None,
        tracer: Tracer | None = None,
        instruments: Instruments | None = None,
    ) -> None:
        self.backend = backend
        self._redactor = redactor
        self._tracer = tracer
        self._instruments = instruments
        self._api = OtelApi.load() if tracer is not None else None
        self._attributes = clean_attributes({names.BACKEND: backend}, redactor)
        self._last_id = ("", "")  # the last sandbox id seen, and its redacted form

    @classmethod
    def load(cls, backend: str, redactor: Redactor | None = None) -> Telemetry:
        """Spans and metrics to the global providers when ``opentelemetry`` is installed,
        else one that does nothing."""
        try:
            from opentelemetry import metrics, trace
        except ImportError:
            return cls(backend, redactor)
        return cls.of(backend, redactor, trace.get_tracer_provider(), metrics.get_meter_provider())

    @classmethod
    def of(
        cls,
        backend: str,
        redactor: Redactor | None,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider,
    ) -> Telemetry:
        """Spans and metrics to the given providers (the ``otel`` extra must be installed)."""
        version = _version()
        tracer = tracer_provider.get_tracer(names.SCOPE, version)
        instruments = Instruments(meter_provider.get_meter(names.SCOPE, version))
        return cls(backend, redactor, tracer, instruments)

    @property
    def enabled(self) -> bool:
        """Whether anything is recorded (the ``otel`` extra is installed)."""
        return self._tracer is not None

    @property
    def recording(self) -> bool:
        """Enabled, and not suppressed: OpenTelemetry's ``suppress_instrumentation`` context
        (``opentelemetry.instrumentation.utils``) turns this library's spans and metrics off
        for a block, as it does every instrumentation's."""
        api = self._api
        return api is not None and not api.get_value(api.suppressed)

    def trace_headers(self) -> dict[str, str]:
        """:func:`~piship_remote.telemetry.context.trace_headers`, by the calls held here."""
        api = self._api
        return {} if api is None else traceparent_of(api.current_span())

    def span(
        self,
        name: str,
        sandbox_id: str | None = None,
        attributes: Mapping[str, AttributeValue | None] | None = None,
        *,
        ended: Ended | None = None,
        command: bool = False,
    ) -> LiveSpan | NoSpan:
        """A span named ``name``, current on this thread during the ``with`` block, with
        the backend, ``sandbox_id`` and ``attributes`` (names from :mod:`names`).
        ``ended`` is told its duration and outcome; ``command``: a failure after the command
        was sent is ``unknown``."""
        if not self.recording:
            return NO_SPAN
        assert self._tracer is not None and self._api is not None
        clean = self._clean(sandbox_id, attributes)
        tracer, redactor = self._tracer, self._redactor
        return LiveSpan(self._api, tracer, name, clean, redactor, ended=ended, command=command)

    def started(
        self, name: str, sandbox_id: str | None = None, *, ended: Ended | None = None
    ) -> StartedSpan | None:
        """A span begun here and ended by :meth:`StartedSpan.finish`, possibly on another
        thread; ``None`` without the extra."""
        if not self.recording:
            return None
        assert self._tracer is not None
        clean = self._clean(sandbox_id, None)
        return StartedSpan(self._tracer, name, clean, ended=ended)

    def transfer(
        self,
        name: str,
        direction: str,
        move: Callable[[], _T],
        size: Callable[[_T], int],
        sandbox_id: Callable[[], str | None] | None = None,
    ) -> _T:
        """``move()`` in a span named ``name``, with the bytes ``size`` finds it moved
        (counted in ``piship.transfer.io``); ``sandbox_id`` is asked only when recording."""
        if not self.recording:
            return move()
        given = sandbox_id() if sandbox_id is not None else None
        with self.span(name, given, {names.DIRECTION: direction}) as span:
            result = move()
            moved = size(result)
            span.set(names.BYTES, moved)
        self.transferred(moved, direction)
        return result

    # -- metrics ---------------------------------------------------------------------

    def activation_ended(self, seconds: float, outcome: str, failure: str | None) -> None:
        """Record an activation's duration."""
        if self._instruments is not None:
            self._instruments.activation_duration.record(seconds, self._labels(outcome, failure))

    def command_ended(self, seconds: float, outcome: str, failure: str | None) -> None:
        """Record a command's duration and count its outcome."""
        if self._instruments is not None:
            labels = self._labels(outcome, failure)
            self._instruments.command_duration.record(seconds, labels)
            self._instruments.command_outcomes.add(1, labels)

    def pool_task_ended(self, seconds: float, outcome: str, failure: str | None) -> None:
        """Record a pool task's duration."""
        if self._instruments is not None:
            self._instruments.pool_task_duration.record(seconds, self._labels(outcome, failure))

    def create_refused(self, status: int) -> None:
        """Count a create the service refused for capacity (HTTP ``status``)."""
        if self._instruments is not None and self.recording:
            labels: dict[str, AttributeValue] = {
                names.BACKEND: self.backend,
                names.HTTP_STATUS: status,
            }
            self._instruments.create_refusals.add(1, labels)

    def create_retried(self) -> None:
        """Count a create sent again after a refusal."""
        if self._instruments is not None and self.recording:
            self._instruments.create_retries.add(1, {names.BACKEND: self.backend})

    def transferred(self, size: int, direction: str) -> None:
        """Count ``size`` bytes moved in ``direction`` (``upload`` or ``download``)."""
        if self._instruments is not None and size > 0 and self.recording:
            labels: dict[str, AttributeValue] = {
                names.BACKEND: self.backend,
                names.DIRECTION: direction,
            }
            self._instruments.transfer_io.add(size, labels)

    def sandbox_active(self, change: int) -> None:
        """A sandbox activated (``+1``) or disposed or detached (``-1``)."""
        if self._instruments is not None:
            self._instruments.active_sandboxes.add(change, {names.BACKEND: self.backend})

    def _clean(
        self, sandbox_id: str | None, attributes: Mapping[str, AttributeValue | None] | None
    ) -> dict[str, AttributeValue]:
        """The span's attributes, redacted: the backend's once, an id when it changes."""
        clean = dict(self._attributes)
        if attributes:
            clean.update(clean_attributes(attributes, self._redactor))
        if sandbox_id is not None:
            seen, redacted = self._last_id
            if seen != sandbox_id:
                redacted = redaction(self._redactor)(sandbox_id)
                self._last_id = (sandbox_id, redacted)
            clean[names.SANDBOX_ID] = redacted
        return clean

    def _labels(self, outcome: str, failure: str | None) -> dict[str, AttributeValue]:
        labels: dict[str, AttributeValue] = {names.BACKEND: self.backend, names.OUTCOME: outcome}
        if failure is not None:
            labels[names.ERROR_TYPE] = failure
        return labels


def _version() -> str:
    """This library's version as installed (the instrumentation scope's version)."""
    try:
        return importlib.metadata.version("piship_remote")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
