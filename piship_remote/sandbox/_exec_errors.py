"""The errors a governed command raises: why it stopped, what its backend raised, and
why the sandbox refuses further commands.

:class:`ExecErrors` maps an abort kind (timeout, cancel, dispose, Ctrl-C) and a
backend's own exception to the library's errors, the backend's text redacted and cut
to ``REASON_LIMIT`` characters.
"""

from __future__ import annotations

from piship_remote.model.errors import (
    SANDBOX_UNAVAILABLE,
    CommandCancelled,
    CommandTimeout,
    PiShipError,
    SandboxUnavailable,
)
from piship_remote.model.redact import Redactor
from piship_remote.sandbox._exec_workers import AbortKind
from piship_remote.transport.deadline import Deadline

__all__ = ["REASON_LIMIT", "ExecErrors", "reason_text"]

REASON_LIMIT = 400


class ExecErrors:
    """The errors of the commands run on one sandbox; ``adapter`` names the backend."""

    def __init__(self, *, adapter: str, redactor: Redactor) -> None:
        self._adapter = adapter
        self._redactor = redactor

    def aborted(self, kind: AbortKind, deadline: Deadline) -> BaseException:
        """Why the caller stopped waiting for a command."""
        if kind == "timeout":
            return CommandTimeout(deadline.seconds or 0)
        if kind == "disposed":
            # The one plain PiShipError the library raises (code SANDBOX_UNAVAILABLE): its
            # exact type is pinned by callers that compare ``type(error)``.
            return PiShipError(
                SANDBOX_UNAVAILABLE,
                f"The {self._adapter} sandbox was disposed while the command ran; "
                "check its effects before running it again",
                component="sandbox",
            )
        return CommandCancelled()

    def from_backend(self, error: BaseException) -> BaseException:
        """What the caller sees of an exception the backend call raised."""
        if isinstance(error, (PiShipError, CommandCancelled, CommandTimeout)):
            return error
        if not isinstance(error, Exception):
            return error
        return SandboxUnavailable(
            reason_text(str(error) or type(error).__name__, self._redactor),
            component="sandbox",
            redactor=self._redactor,
        )

    def retired(self, *, disposed: bool, retired: bool) -> PiShipError:
        """The refusal of a command on a retired or disposed sandbox."""
        if disposed and not retired:
            text = (
                f"The {self._adapter} sandbox was disposed, so piship_remote retired it; "
                "activate a new sandbox"
            )
        else:
            text = (
                f"The {self._adapter} sandbox backend did not stop a timed-out or "
                "cancelled command, so piship_remote retired it; activate a new sandbox"
            )
        return SandboxUnavailable(text, not_started=True, component="sandbox")


def reason_text(text: str, redactor: Redactor) -> str:
    """``text`` redacted and cut to ``REASON_LIMIT`` characters, for an error message."""
    redacted = redactor.redact(text)
    return redacted if len(redacted) <= REASON_LIMIT else redacted[:REASON_LIMIT]
