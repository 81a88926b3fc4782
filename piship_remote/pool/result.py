"""What became of one task in a pool: :class:`TaskResult`, its :class:`Outcome`, and how
an error is judged.

    for result in pool.imap("pytest tests/{item}", shards):
        if result.outcome is Outcome.INFRA:  # or == "infra": an Outcome is a str
            print(result.item, "never ran:", result.error)

Only work that never started may run again. A sandbox error says whether its command
was sent: an error marked ``retryable`` (nothing reached the sandbox: the router could
not connect, the service was unreachable) or one of the refusals below, which come
before a command is sent, means it never started; any other failure of the sandbox
may have come after the command began, so its outcome is ``"unknown"``.
"""

from __future__ import annotations

import enum
from typing import Any, Final

import attrs

from piship_remote.model.errors import (
    COMMAND_FAILED,
    GATEWAY_PROTOCOL_ERROR,
    GATEWAY_UNREACHABLE,
    SANDBOX_UNAVAILABLE,
    CommandCancelled,
    CommandTimeout,
    PiShipError,
)
from piship_remote.transport import TransportError

__all__ = [
    "CANCELLED",
    "FAILED",
    "INFRA",
    "OK",
    "OUTCOMES",
    "TIMEOUT",
    "UNKNOWN",
    "Outcome",
    "TaskResult",
    "command_outcome",
    "is_infrastructure",
    "never_started",
]



class Outcome(str, enum.Enum):
    """How a task ended; a ``str``, so ``result.outcome == "ok"`` holds for ``Outcome.OK``.

    ``OK``: the command exited 0, or the callable returned. ``FAILED``: the task's own
    failure (a non-zero exit, a callable that raised); never retried. ``INFRA``: no
    sandbox could be had, or the work never started, on every attempt. ``UNKNOWN``: the
    command may have run; never retried. ``TIMEOUT`` / ``CANCELLED``: the task's timeout
    expired / the task was cancelled.
    """

    OK = "ok"
    FAILED = "failed"
    INFRA = "infra"
    UNKNOWN = "unknown"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"

    __str__ = str.__str__  # "ok" in f-strings and print, on every Python


OK: Final = Outcome.OK
FAILED: Final = Outcome.FAILED
INFRA: Final = Outcome.INFRA
UNKNOWN: Final = Outcome.UNKNOWN
TIMEOUT: Final = Outcome.TIMEOUT
CANCELLED: Final = Outcome.CANCELLED
OUTCOMES = tuple(Outcome)

# The codes of a failure of the sandbox or the service, not of the task.
_INFRASTRUCTURE_CODES = frozenset(
    {SANDBOX_UNAVAILABLE, GATEWAY_UNREACHABLE, GATEWAY_PROTOCOL_ERROR}
)


@attrs.frozen
class TaskResult:
    """One task's end: its ``item``, ``value`` (or ``None``), ``error``, and ``outcome``.

    ``outcome`` is an :class:`Outcome` (a ``str``: ``"ok"``, ``"failed"``, ``"infra"``,
    ``"unknown"``, ``"timeout"`` or ``"cancelled"``). ``attempts`` counts the sandboxes
    tried; ``seconds`` the whole time.
    """

    item: Any
    value: Any
    error: BaseException | None
    outcome: Outcome = attrs.field(converter=Outcome)
    sandbox_id: str | None
    attempts: int
    seconds: float


def is_infrastructure(error: BaseException) -> bool:
    """Whether ``error`` is a failure of the sandbox or its service, not of the task."""
    return (
        isinstance(error, PiShipError)
        and error.code != COMMAND_FAILED
        and (error.code in _INFRASTRUCTURE_CODES or isinstance(error, TransportError))
    )


def never_started(error: BaseException) -> bool:
    """Whether a command that ended with ``error`` certainly never started in the sandbox."""
    if not is_infrastructure(error):
        return False
    if isinstance(error, TransportError):
        return not error.request_sent
    assert isinstance(error, PiShipError)
    if "unknown" in error.message:
        return False
    return error.retryable or error.not_started


def command_outcome(error: BaseException) -> Outcome:
    """The outcome of a command (a ``str`` task) that raised ``error``."""
    if isinstance(error, CommandTimeout):
        return TIMEOUT
    if isinstance(error, CommandCancelled):
        return CANCELLED
    if not is_infrastructure(error):
        return FAILED
    return INFRA if never_started(error) else UNKNOWN
