"""The caller's trace context on the library's own threads, and on the wire to a service.

A span the caller started is the parent of the spans the library starts on its
threads (``piship-pool-task-N``, ``piship-exec-N``): :func:`carried` takes the context
where work is handed over and makes it current where the work runs. Neither function
imports ``opentelemetry``: when the application has not imported it, no span can be
current, so there is nothing to carry.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Job", "carried", "carried_job", "trace_headers", "traceparent_of"]

_R = TypeVar("_R")
_O = TypeVar("_O")


class Job(Protocol[_O]):
    """Work handed to a worker thread: ``execute`` there, then ``finish`` with its outcome."""

    def execute(self) -> _O: ...

    def finish(self, outcome: _O) -> None: ...


def carried(work: Callable[[], _R]) -> Callable[[], _R]:
    """``work``, to run on another thread in this thread's current trace context."""
    if "opentelemetry.context" not in sys.modules:
        return work
    from opentelemetry import context

    captured = context.get_current()

    def in_context() -> _R:
        token = context.attach(captured)
        try:
            return work()
        finally:
            context.detach(token)

    return in_context


class _CarriedJob(Generic[_O]):
    __slots__ = ("_job", "execute")

    def __init__(self, job: Job[_O]) -> None:
        self._job = job
        self.execute = carried(job.execute)

    def finish(self, outcome: _O) -> None:
        self._job.finish(outcome)


def carried_job(job: Job[_O]) -> Job[_O]:
    """``job``, its ``execute`` to run in this thread's current trace context."""
    if "opentelemetry.context" not in sys.modules:
        return job
    return _CarriedJob(job)


def trace_headers() -> dict[str, str]:
    """The ``traceparent`` header of the current span (W3C Trace Context), or nothing.

    Only ``traceparent``: no ``tracestate`` or baggage, whose entries the application may
    fill with anything. Sent to a service's control plane only, never to a sandbox.
    """
    if "opentelemetry.trace" not in sys.modules:
        return {}
    from opentelemetry import trace

    return traceparent_of(trace.get_current_span())


def traceparent_of(span: Any) -> dict[str, str]:
    """The ``traceparent`` header naming ``span`` (an OpenTelemetry span), or nothing when
    it is not a valid one."""
    context = span.get_span_context()
    if not context.is_valid:
        return {}
    flags = int(context.trace_flags) & 0xFF
    return {"traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"}
