"""OpenTelemetry traces and metrics, and the log events, of piship_remote.

Install the ``otel`` extra (``pip install 'piship-remote[otel]'``) and configure
OpenTelemetry's tracer and meter providers as usual; piship_remote's spans and metrics
(scope ``piship_remote``) then go wherever they are exported. Without the extra nothing
is imported and nothing is recorded. :mod:`~piship_remote.telemetry.names` lists every
span, attribute and metric. No span, metric or log line carries a command's text, an
argument, an environment value, a file's content or a credential.
"""

from __future__ import annotations

from piship_remote.telemetry import names
from piship_remote.telemetry.context import carried, trace_headers
from piship_remote.telemetry.telemetry import Telemetry

__all__ = ["Telemetry", "carried", "names", "trace_headers"]
