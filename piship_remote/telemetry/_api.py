"""The OpenTelemetry API calls a span makes, looked up once per ``Telemetry``: an import
statement inside a function costs microseconds on every call, and a command makes several."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["OtelApi"]


@attrs.frozen
class OtelApi:
    attach: Callable[[Any], object]
    detach: Callable[[Any], None]
    in_context: Callable[[Any], Any]
    """``trace.set_span_in_context``."""
    get_value: Callable[[str], object]
    current_span: Callable[[], Any]
    """``trace.get_current_span``."""
    suppressed: str
    """The key OpenTelemetry's ``suppress_instrumentation`` sets."""

    @classmethod
    def load(cls) -> OtelApi:
        """The calls (``opentelemetry`` must be importable)."""
        from opentelemetry import context, trace

        suppressed = context._SUPPRESS_INSTRUMENTATION_KEY
        in_context = trace.set_span_in_context
        return cls(
            context.attach,
            context.detach,
            in_context,
            context.get_value,
            trace.get_current_span,
            suppressed,
        )
