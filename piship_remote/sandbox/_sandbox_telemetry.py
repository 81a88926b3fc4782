"""What one :class:`~piship_remote.sandbox.sandbox.Sandbox` records: its commands' spans
and metrics, its count among the active sandboxes, its INFO events (its pushes, pulls and
file transfers are recorded by ``SandboxTransfers`` and ``SandboxFiles``)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING

from piship_remote.model.errors import PiShipError
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

    def __init__(self, telemetry: Telemetry, engine: ExecEngine | None) -> None:
        self._telemetry = telemetry
        self._engine = engine
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
                _say_if_unknown(error)
                raise

    def started(self, handle: CommandHandle) -> CommandHandle:
        """Start ``handle`` on its worker; when the command ends, there, its span ends and
        an unknown outcome is logged."""
        telemetry = self._telemetry
        span = telemetry.started(COMMAND_SPAN, self._span_id(), ended=telemetry.command_ended)

        def exit_code() -> int:
            try:
                return handle.wait(0).exit_code  # it has ended: this only reads the outcome
            except PiShipError as error:
                _say_if_unknown(error)
                raise

        def ended() -> None:
            if span is not None:
                span.finish(exit_code)
                return
            with suppress(BaseException):  # the handle's own wait raises it to its caller
                exit_code()

        try:
            return handle._begin(ended)
        except BaseException as error:  # refused before it started: ended is not called
            if span is not None:
                span.finish(functools.partial(_reraise, error))
            raise

    def activated(self) -> None:
        """Count the sandbox among the active ones."""
        self._telemetry.sandbox_active(+1)

    def let_go(self, how: str) -> None:
        """Say once that the sandbox was ``how`` (deleted, detached); stop counting it."""
        if self._engine is None or not self._counted.acquire(blocking=False):
            return
        sandbox_id = self._engine.epoch()
        self._telemetry.sandbox_active(-1)
        info("%s sandbox %s %s", self._telemetry.backend, sandbox_id, how)

    def _span_id(self) -> str | None:
        """The sandbox's id for a span; not looked up when nothing is recorded."""
        if self._engine is None or not self._telemetry.recording:
            return None
        return self._engine.epoch()


def _say_if_unknown(error: PiShipError) -> None:
    if outcome_of(error, command=True) == "unknown":
        info("a command's outcome is unknown (%s)", error.code)


def _reraise(error: BaseException) -> int:
    raise error
