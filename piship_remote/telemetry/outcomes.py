"""How a call ended, in the words spans and metrics use (``piship.outcome``, ``error.type``)."""

from __future__ import annotations

from piship_remote.model.errors import (
    COMMAND_FAILED,
    CONFIG_INVALID,
    CommandCancelled,
    CommandTimeout,
    PiShipError,
)
from piship_remote.transport.failures import TransportError

__all__ = ["error_type", "exit_outcome", "outcome_of"]


def exit_outcome(exit_code: int) -> str:
    """``ok`` for exit 0, ``failed`` for any other."""
    return "ok" if exit_code == 0 else "failed"


def outcome_of(error: BaseException, *, command: bool = False) -> str:
    """The outcome of a call that raised ``error``; for a ``command``, a failure of the
    sandbox or its service after the command was sent is ``unknown``.

    >>> outcome_of(CommandTimeout(5.0)), outcome_of(ValueError("x"))
    ('timeout', 'error')
    """
    if isinstance(error, CommandTimeout):
        return "timeout"
    if isinstance(error, (CommandCancelled, KeyboardInterrupt)):
        return "cancelled"
    if isinstance(error, TransportError) and not error.request_sent:
        return "not-started"
    if isinstance(error, PiShipError):
        if error.not_started or error.code == CONFIG_INVALID:
            return "not-started"
        if command and error.code != COMMAND_FAILED:
            return "unknown"
    return "error"


def error_type(error: BaseException) -> str:
    """A low-cardinality name for ``error``: its code, else its class (never its message)."""
    if isinstance(error, PiShipError):
        return error.code
    return type(error).__qualname__
