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
from collections import Counter
from typing import Any, Final

import attrs

from piship_remote.model.display import html_pre, html_table, tail, text_table
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
    "Outcome",
    "TaskResult",
    "TaskResults",
    "command_outcome",
    "is_infrastructure",
    "is_refusal",
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

# The codes of a create that no other attempt can get past: a missing or refused key,
# a template the service does not offer, a setting it cannot take.
_REFUSAL_CODES = frozenset({CREDENTIAL_REQUIRED, CREDENTIAL_DENIED, CONFIG_INVALID})


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

    def _repr_html_(self) -> str:
        cells = [[html_pre(value) for value in _row(self)]]
        return html_table(_COLUMNS, cells, caption="TaskResult", raw_cells=True)


_COLUMNS = ("item", "outcome", "detail", "sandbox", "attempts", "seconds")
_SHOWN_DETAIL = 300  # characters of a task's error or output a table row shows
_SHOWN_ROWS = 200  # rows of a summary table; the rest are counted


def _row(result: TaskResult) -> list[str]:
    return [
        repr(result.item),
        result.outcome,
        tail(_detail(result), _SHOWN_DETAIL),
        result.sandbox_id or "",
        str(result.attempts),
        f"{result.seconds:.2f}",
    ]


def _detail(result: TaskResult) -> str:
    """What a reader of a row needs: the error, else the end of a command's output."""
    if result.error is not None:
        return f"{type(result.error).__name__}: {result.error}"
    value = result.value
    stdout, stderr = getattr(value, "stdout", None), getattr(value, "stderr", None)
    if isinstance(stdout, str) and isinstance(stderr, str):
        code = getattr(value, "exit_code", "?")
        text = (stderr if result.outcome != OK and stderr.strip() else stdout).strip()
        return f"exit {code}: {text}" if text else f"exit {code}"
    return repr(value)


class TaskResults(list[TaskResult]):
    """The list ``SandboxPool.map`` returns, in the order of its items; in a notebook a
    table: the count of each outcome, then the tasks, those not ``"ok"`` first."""

    def counts(self) -> dict[str, int]:
        """How many tasks ended with each outcome (only the outcomes that occurred)."""
        counted = Counter(result.outcome for result in self)
        return {outcome: counted[outcome] for outcome in OUTCOMES if counted[outcome]}

    def failures(self) -> TaskResults:
        """The results whose outcome is not ``"ok"``, in order."""
        return TaskResults(result for result in self if result.outcome != OK)

    def _summary(self) -> str:
        counts = ", ".join(f"{count} {outcome}" for outcome, count in self.counts().items())
        return f"{len(self)} tasks: {counts or 'none'}"

    def _shown(self) -> tuple[list[TaskResult], int]:
        ordered = sorted(self, key=lambda result: result.outcome == OK)  # stable: failures first
        return ordered[:_SHOWN_ROWS], max(0, len(ordered) - _SHOWN_ROWS)

    def _repr_html_(self) -> str:
        shown, left = self._shown()
        rows = [[html_pre(value) for value in _row(result)] for result in shown]
        if left:
            rows.append([html_pre(f"… {left} more")] + [""] * (len(_COLUMNS) - 1))
        return html_table(_COLUMNS, rows, caption=self._summary(), raw_cells=True)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        if cycle:
            printer.text("TaskResults(...)")
            return
        shown, left = self._shown()
        table = text_table(_COLUMNS, (_row(result) for result in shown))
        more = f"\n… {left} more" if left else ""
        printer.text(f"{self._summary()}\n{table}{more}")


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


def command_outcome(error: BaseException) -> Outcome:
    """The outcome of a command (a ``str`` task) that raised ``error``."""
    if isinstance(error, CommandTimeout):
        return TIMEOUT
    if isinstance(error, CommandCancelled):
        return CANCELLED
    if not is_infrastructure(error):
        return FAILED
    return INFRA if never_started(error) else UNKNOWN
