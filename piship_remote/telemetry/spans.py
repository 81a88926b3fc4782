"""One span as the library fills it: attributes through the redaction, an outcome at its end.

    with telemetry.span(names.COMMAND_SPAN, sandbox_id) as span:
        result = run()
        span.exit_code(result.exit_code)

A span records no exception, message or traceback: a failure sets ``error.type`` (the
``PiShipError`` code, else the exception's class) and the status ``ERROR`` with that
name as its description, and ``piship.outcome`` says how the call ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING

from piship_remote.model.redact import Redactor, redaction
from piship_remote.telemetry import names
from piship_remote.telemetry.outcomes import error_type, exit_outcome, outcome_of

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from piship_remote.telemetry._api import OtelApi

__all__ = ["AttributeValue", "Ended", "LiveSpan", "NoSpan", "StartedSpan", "clean_attributes"]

AttributeValue = str | int | float | bool
Ended = Callable[[float, str, "str | None"], None]
"""Told when a span ends: its seconds, its outcome, its ``error.type`` (or ``None``)."""


def clean_attributes(
    attributes: Mapping[str, AttributeValue | None], redactor: Redactor | None
) -> dict[str, AttributeValue]:
    """``attributes`` without ``None`` values, every text through the redaction."""
    clean = redaction(redactor)
    return {
        key: clean(value) if isinstance(value, str) else value
        for key, value in attributes.items()
        if value is not None
    }


class NoSpan:
    """What a span is without the ``otel`` extra: every call does nothing."""

    __slots__ = ()

    def __enter__(self) -> NoSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def set(self, key: str, value: AttributeValue | None) -> None:
        """Nothing to set."""

    def exit_code(self, code: int) -> int:
        """``code``, nothing set."""
        return code

    def outcome(self, outcome: str) -> None:
        """Nothing to set."""


class LiveSpan:
    """A started span, current on this thread until the block ends."""

    __slots__ = (
        "_api",
        "_code",
        "_command",
        "_ended",
        "_outcome",
        "_redactor",
        "_span",
        "_started",
        "_token",
    )

    def __init__(
        self,
        api: OtelApi,
        tracer: Tracer,
        name: str,
        attributes: dict[str, AttributeValue],
        redactor: Redactor | None,
        *,
        ended: Ended | None,
        command: bool,
    ) -> None:
        self._api = api
        self._span: Span = tracer.start_span(name, attributes=attributes, record_exception=False)
        self._redactor = redactor
        self._ended = ended
        self._command = command
        self._outcome = "ok"
        self._code: int | None = None
        self._started = 0.0
        self._token: object = None

    def __enter__(self) -> LiveSpan:
        self._token = self._api.attach(self._api.in_context(self._span))
        self._started = time.perf_counter()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        seconds = time.perf_counter() - self._started
        # The error went to the caller as it is: the span holds only its name.
        self._outcome, failure = _ending(
            self._span, self._code, error, self._outcome, command=self._command
        )
        self._api.detach(self._token)
        self._span.end()
        if self._ended is not None:  # outside the span: no exemplar sampling per measurement
            self._ended(seconds, self._outcome, failure)

    def set(self, key: str, value: AttributeValue | None) -> None:
        """Add an attribute (text through the redaction); ``None`` adds nothing."""
        if value is None:
            return
        if isinstance(value, str):
            value = redaction(self._redactor)(value)
        self._span.set_attribute(key, value)

    def exit_code(self, code: int) -> int:
        """Set the command's exit code, and the outcome it makes (``ok`` or ``failed``);
        returns ``code``."""
        self._code = code  # set with the outcome when the span ends
        self._outcome = exit_outcome(code)
        return code

    def outcome(self, outcome: str) -> None:
        """How the call ended, when the block itself says so (it raised nothing)."""
        self._outcome = outcome


class StartedSpan:
    """A span that ends on another thread than the one it began on (a started command's):
    a child of the context current at its start, never current itself."""

    __slots__ = ("_ended", "_span", "_started")

    def __init__(
        self,
        tracer: Tracer,
        name: str,
        attributes: dict[str, AttributeValue],
        *,
        ended: Ended | None,
    ) -> None:
        self._span = tracer.start_span(name, attributes=attributes, record_exception=False)
        self._ended = ended
        self._started = time.perf_counter()

    def finish(self, result: Callable[[], int]) -> None:
        """End the span with the exit code ``result()`` returns, or the error it raises."""
        seconds = time.perf_counter() - self._started
        code: int | None = None
        raised: BaseException | None = None
        try:
            code = result()
        except BaseException as error:
            raised = error
        given = "error" if code is None else exit_outcome(code)  # an error decides its own
        outcome, failure = _ending(self._span, code, raised, given, command=True)
        try:
            if self._ended is not None:
                self._ended(seconds, outcome, failure)
        finally:
            self._span.end()


def _ending(
    span: Span, code: int | None, error: BaseException | None, outcome: str, *, command: bool
) -> tuple[str, str | None]:
    """Set a span's closing attributes (one call: the SDK takes its lock once) and, for
    ``error``, its status; returns its outcome and its ``error.type`` (or ``None``)."""
    ending: dict[str, AttributeValue] = {}
    if code is not None:
        ending[names.EXIT_CODE] = code
    failure = None
    if error is not None:
        failure = error_type(error)
        outcome = outcome_of(error, command=command)
        ending[names.ERROR_TYPE] = failure
        _mark_failed(span, failure)
    ending[names.OUTCOME] = outcome
    span.set_attributes(ending)
    return outcome, failure


def _mark_failed(span: Span, failure: str) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_status(Status(StatusCode.ERROR, failure))
