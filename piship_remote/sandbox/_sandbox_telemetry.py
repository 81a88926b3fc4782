"""What one :class:`~piship_remote.sandbox.activation.Sandbox` records: its commands' and
transfers' spans and metrics, its count among the active sandboxes, its INFO events."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from piship_remote.model.errors import PiShipError
from piship_remote.model.redact import Redactor
from piship_remote.model.transfer import TransferSummary
from piship_remote.telemetry import Telemetry
from piship_remote.telemetry.logs import info
from piship_remote.telemetry.names import COMMAND_SPAN
from piship_remote.telemetry.outcomes import outcome_of
from piship_remote.telemetry.spans import LiveSpan, NoSpan

if TYPE_CHECKING:
    from piship_remote.sandbox._exec_engine import ExecEngine
    from piship_remote.sandbox.command_handle import CommandHandle

__all__ = ["SandboxTelemetry"]


class SandboxTelemetry:
    """The spans, metrics and log events of one sandbox (nothing recorded without the extra)."""

    def __init__(
        self,
        telemetry: Telemetry,
        engine: ExecEngine | None,
        *,
        adapter: str,
        redactor: Redactor,
    ) -> None:
        self._telemetry = telemetry
        self._engine = engine
        self._adapter = adapter
        self._redactor = redactor
        self._counted = threading.Lock()  # held for good once the sandbox is let go of

    @contextmanager
    def command(self) -> Iterator[LiveSpan | NoSpan]:
        """The span of a command waited for on this thread; an unknown outcome is logged."""
        telemetry = self._telemetry
        with telemetry.span(
            COMMAND_SPAN, self._span_id(), ended=telemetry.command_ended, command=True
        ) as span:
            try:
                yield span
            except PiShipError as error:
                if outcome_of(error, command=True) == "unknown":
                    info("a command's outcome is unknown (%s)", error.code)
                raise

    def started(self, handle: CommandHandle) -> CommandHandle:
        """Start ``handle`` on its worker, its span ended there when the command ends."""
        telemetry = self._telemetry
        span = telemetry.started(COMMAND_SPAN, self._span_id(), ended=telemetry.command_ended)
        if span is None:
            return handle._begin()
        return handle._begin(lambda: span.finish(lambda: handle.wait(0).exit_code))

    def transfer(
        self, name: str, direction: str, move: Callable[[], TransferSummary]
    ) -> TransferSummary:
        """``move()`` (a push or a pull) in its span, with the bytes it moved."""
        return self._telemetry.transfer(name, direction, move, _bytes, self._span_id)

    def activated(self) -> None:
        """Count the sandbox among the active ones."""
        self._telemetry.sandbox_active(+1)

    def let_go(self, sandbox_id: str | None, how: str) -> None:
        """Say once that the sandbox was ``how`` (deleted, detached); stop counting it."""
        if self._engine is None or not self._counted.acquire(blocking=False):
            return
        self._telemetry.sandbox_active(-1)
        info("%s sandbox %s %s", self._adapter, sandbox_id, how, redactor=self._redactor)

    def _span_id(self) -> str | None:
        """The sandbox's id for a span; not looked up when nothing is recorded."""
        if self._engine is None or not self._telemetry.recording:
            return None
        return self._engine.epoch()


def _bytes(summary: TransferSummary) -> int:
    return summary.bytes
