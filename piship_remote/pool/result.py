"""What became of one task in a pool: :class:`TaskResult`, and how an error is judged.

    for result in pool.imap("pytest tests/{item}", shards):
        if result.outcome == "infra":
            print(result.item, "never ran:", result.error)

Only work that never started may run again. A sandbox error says whether its command
was sent: an error marked ``retryable`` (nothing reached the sandbox: the router could
not connect, the service was unreachable) or one of the refusals below, which come
before a command is sent, means it never started; any other failure of the sandbox
may have come after the command began, so its outcome is ``"unknown"``.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from piship_remote.model.errors import (
    COMMAND_FAILED,
    CONFIG_INVALID,
    CREDENTIAL_DENIED,
    CREDENTIAL_REQUIRED,
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
    "TaskResult",
    "command_outcome",
    "is_infrastructure",
    "is_refusal",
    "never_started",
]

OK: Final = "ok"
FAILED: Final = "failed"
INFRA: Final = "infra"
UNKNOWN: Final = "unknown"
TIMEOUT: Final = "timeout"
CANCELLED: Final = "cancelled"
OUTCOMES = (OK, FAILED, INFRA, UNKNOWN, TIMEOUT, CANCELLED)

# The codes of a failure of the sandbox or the service, not of the task.
_INFRASTRUCTURE_CODES = frozenset(
    {SANDBOX_UNAVAILABLE, GATEWAY_UNREACHABLE, GATEWAY_PROTOCOL_ERROR}
)

# The codes of a create that no other attempt can get past: a missing or refused key,
# a template the service does not offer, a setting it cannot take.
_REFUSAL_CODES = frozenset({CREDENTIAL_REQUIRED, CREDENTIAL_DENIED, CONFIG_INVALID})


@attrs.frozen
class TaskResult:
    """One task's end: its ``item``, ``value`` (or ``None``), ``error``, and ``outcome``.

    ``outcome`` is ``"ok"``, ``"failed"`` (the task's own failure; never retried),
    ``"infra"`` (no sandbox could be had, or the work never started, on every attempt),
    ``"unknown"`` (the command may have run; never retried), ``"timeout"`` or
    ``"cancelled"``. ``attempts`` counts the sandboxes tried; ``seconds`` the whole time.
    """

    item: Any
    value: Any
    error: BaseException | None
    outcome: str
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


def is_refusal(error: BaseException) -> bool:
    """Whether a failed activation will fail the same way however often it is tried."""
    if not isinstance(error, PiShipError):
        return False
    return (error.cause_code or error.code) in _REFUSAL_CODES


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


def command_outcome(error: BaseException) -> str:
    """The outcome of a command (a ``str`` task) that raised ``error``."""
    if isinstance(error, CommandTimeout):
        return TIMEOUT
    if isinstance(error, CommandCancelled):
        return CANCELLED
    if not is_infrastructure(error):
        return FAILED
    return INFRA if never_started(error) else UNKNOWN
