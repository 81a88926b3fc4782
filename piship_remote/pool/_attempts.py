"""One task of a pool, from taking a sandbox to its :class:`TaskResult`, retries included.

    attempts = TaskAttempts(supply, reset="rm -rf /tmp/work", reuse=True, max_attempts=2)
    result = attempts.run("pytest tests/{item}", "test_a.py", timeout=600, cancel=stop)

An attempt takes a sandbox and runs the task in it. Only an attempt whose work never
started (no sandbox could be had, or its command was refused before it was sent) is
followed by another, on another sandbox. A sandbox whose attempt ended ``"infra"``,
``"unknown"``, ``"timeout"`` or ``"cancelled"`` is disposed; one that ended ``"ok"`` or
``"failed"`` goes back to the pool when ``reuse`` (after ``reset`` exits 0). A callable
task runs on a worker thread (:mod:`~piship_remote.pool._call`), so its timeout
ends the task even when the callable does not return.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import attrs

from piship_remote.model.errors import CommandCancelled, CommandTimeout
from piship_remote.pool._call import BoundedCall
from piship_remote.pool._command import command_for
from piship_remote.pool._supply import (
    NoSandboxInTime,
    SandboxSupply,
    busy_delay,
    service_busy,
)
from piship_remote.pool.result import (
    CANCELLED,
    FAILED,
    INFRA,
    OK,
    TIMEOUT,
    UNKNOWN,
    TaskResult,
    command_outcome,
    is_infrastructure,
)
from piship_remote.sandbox.sandbox import Sandbox
from piship_remote.transport.deadline import Deadline
from piship_remote.workspace._worker import WorkerPool

__all__ = ["RESET_TIMEOUT", "Task", "TaskAttempts"]

Task = str | Callable[[Sandbox, Any], Any]
RESET_TIMEOUT = 300.0  # seconds a reset command may take before its sandbox is disposed
_REUSABLE = frozenset({OK, FAILED})
_BUSY = "busy"  # an attempt's create was refused for capacity: wait, then try again
_PAUSE_SLICE = 0.05  # how often a pause looks at the pool's closing


@attrs.frozen
class _Attempt:
    outcome: str
    value: Any = None
    error: BaseException | None = None
    sandbox_id: str | None = None


class TaskAttempts:
    """Runs tasks on the sandboxes of ``supply``; shared by every thread of the pool."""

    def __init__(
        self,
        supply: SandboxSupply,
        *,
        reset: str | None,
        reuse: bool,
        max_attempts: int,
        call_workers: WorkerPool,
        on_failure: Callable[[], None] = lambda: None,
    ) -> None:
        self._supply = supply
        self._reset = reset
        self._reuse = reuse
        self._max_attempts = max_attempts
        self._on_failure = on_failure
        self._call_workers = call_workers

    def run(
        self, task: Task, item: Any, timeout: float | None, cancel: threading.Event
    ) -> TaskResult:
        """Run ``task`` for ``item``; never raises for the task's or a sandbox's failure."""
        started = time.monotonic()
        deadline = Deadline.never() if timeout is None else Deadline.after(timeout)
        attempts = 0
        waits = 0
        while True:
            attempts += 1
            attempt = self._attempt(task, item, deadline, cancel)
            if attempt.outcome == _BUSY:  # the service is full: not a failed attempt
                attempts -= 1
                waits += 1
                attempt = self._wait_for_room(attempt, waits, deadline, cancel)
                if attempt.outcome == _BUSY:
                    continue
            if attempt.outcome != INFRA or attempts >= self._max_attempts:
                break
        if self._supply.closed and attempt.outcome not in (OK, FAILED):
            attempt = _Attempt(CANCELLED, None, self._supply.closed_error(), attempt.sandbox_id)
        seconds = time.monotonic() - started
        return TaskResult(
            item, attempt.value, attempt.error, attempt.outcome, attempt.sandbox_id, attempts,
            seconds,
        )  # fmt: skip

    def _attempt(
        self,
        task: Task,
        item: Any,
        deadline: Deadline,
        cancel: threading.Event,
    ) -> _Attempt:
        try:
            sandbox = self._supply.take(deadline, cancel)
        except NoSandboxInTime:
            return _Attempt(TIMEOUT, error=CommandTimeout(deadline.seconds or 0.0))
        except CommandCancelled as cancelled:
            return _Attempt(CANCELLED, error=cancelled)
        except Exception as error:  # activation failed: the work never started
            return _Attempt(_BUSY if service_busy(error) else INFRA, error=error)
        try:
            attempt = self._run_in(sandbox, task, item, deadline, cancel)
        except BaseException:  # e.g. SystemExit from a callable: what ran there is unknown
            self.give_back(sandbox, healthy=False)
            raise
        self.give_back(sandbox, healthy=attempt.outcome in _REUSABLE)
        return attempt

    def give_back(self, sandbox: Sandbox, *, healthy: bool) -> None:
        """Return a leased sandbox: kept when ``reuse``, ``healthy`` and reset, else disposed
        (and, when not ``healthy``, ``on_failure`` called)."""
        if not healthy:
            self._on_failure()
        keep = self._reuse and healthy and self._reset_ok(sandbox)
        self._supply.give_back(sandbox, keep=keep)

    def _wait_for_room(
        self, busy: _Attempt, waits: int, deadline: Deadline, cancel: threading.Event
    ) -> _Attempt:
        """Wait as a full service asked (``Retry-After``, else a growing pause); ``busy``
        again to try once more, or how the task ends when its deadline comes first."""
        delay = busy_delay(busy.error, waits)
        left = deadline.remaining()
        if left is not None and delay >= left:
            self._pause(left, cancel)
            return _Attempt(TIMEOUT, error=busy.error)
        self._pause(delay, cancel)
        if cancel.is_set():
            return _Attempt(CANCELLED, error=CommandCancelled())
        return busy

    def _pause(self, seconds: float, cancel: threading.Event) -> None:
        """Sleep ``seconds`` unless the task is cancelled or the pool closed first."""
        end = Deadline.after(seconds)
        while not self._supply.closed and (left := end.remaining() or 0.0) > 0:
            if cancel.wait(min(left, _PAUSE_SLICE)):
                return

    def _run_in(
        self,
        sandbox: Sandbox,
        task: Task,
        item: Any,
        deadline: Deadline,
        cancel: threading.Event,
    ) -> _Attempt:
        sandbox_id = _id_of(sandbox)
        if isinstance(task, str):
            command = command_for(task, item)
            return self._run_command(sandbox, command, deadline, cancel, sandbox_id)
        call = BoundedCall(task, sandbox, item, workers=self._call_workers)
        try:
            value = call.result(deadline, cancel, lambda: self._supply.closed)
        except CommandTimeout as error:
            return _Attempt(TIMEOUT, error=error, sandbox_id=sandbox_id)
        except CommandCancelled as error:
            return _Attempt(CANCELLED, error=error, sandbox_id=sandbox_id)
        except Exception as error:
            # The callable had begun its work: a sandbox failure inside it is "unknown".
            outcome = UNKNOWN if is_infrastructure(error) else FAILED
            return _Attempt(outcome, error=error, sandbox_id=sandbox_id)
        return _Attempt(OK, value, sandbox_id=sandbox_id)

    def _run_command(
        self,
        sandbox: Sandbox,
        command: str,
        deadline: Deadline,
        cancel: threading.Event,
        sandbox_id: str | None,
    ) -> _Attempt:
        try:
            result = sandbox.run(command, timeout=deadline, cancel=cancel)
        except Exception as error:
            return _Attempt(command_outcome(error), error=error, sandbox_id=sandbox_id)
        return _Attempt(OK if result.exit_code == 0 else FAILED, result, sandbox_id=sandbox_id)

    def _reset_ok(self, sandbox: Sandbox) -> bool:
        """Run ``reset`` before the sandbox is reused; only an exit 0 keeps it."""
        if self._reset is None or self._supply.closed:
            return not self._supply.closed
        try:
            return sandbox.run(self._reset, timeout=RESET_TIMEOUT).exit_code == 0
        except Exception:
            return False


def _id_of(sandbox: Sandbox) -> str | None:
    try:
        return sandbox.id
    except Exception:
        return None
