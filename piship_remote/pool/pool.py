"""``SandboxPool``: many sandboxes at once, for test shards, evaluations and rollouts.

    with SandboxPool(policy, backend=backend, workspace=".", size=8, warm=8) as pool:
        results = pool.map("pytest -q tests/{item}", shards, timeout=900)
        failed = [r.item for r in results if r.outcome != "ok"]

The pool activates its sandboxes with :func:`~piship_remote.activate_sandbox` and
runs tasks with ``Sandbox.run``; it holds at most ``size`` sandboxes, keeps ``warm``
of them ready, and spaces creates to ``max_create_rate`` a second. Its sandboxes are
in the lifecycle registry like any other, and the pool too: interpreter exit, Ctrl-C
or ``close()`` dispose every one of them. The service's health is checked once for the
pool and again after any failure, not before every create (see ``_health``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from piship_remote.backends.base import Backend
from piship_remote.model.errors import (
    ConfigInvalid,
    SandboxUnavailable,
)
from piship_remote.model.policy import SandboxPolicy
from piship_remote.pool._attempts import Task, TaskAttempts
from piship_remote.pool._command import check_command
from piship_remote.pool._health import HealthOnce
from piship_remote.pool._labels import labelled
from piship_remote.pool._progress import progress_for
from piship_remote.pool._run import MapRun
from piship_remote.pool._supply import (
    CLOSED_BY_CALLER,
    INTERRUPTED,
    NoSandboxInTime,
    SandboxSupply,
)
from piship_remote.pool._throttle import CreateThrottle
from piship_remote.pool.result import TaskResult, TaskResults, is_infrastructure
from piship_remote.sandbox import lifecycle
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.sandbox.sandbox import PathLike, Sandbox
from piship_remote.telemetry import Telemetry
from piship_remote.transport.deadline import Deadline
from piship_remote.workspace._worker import WorkerPool

__all__ = ["SandboxPool"]

_TASK_NUMBERS = itertools.count(1)  # piship-pool-task-N, numbered across pools
_CALL_NUMBERS = itertools.count(1)  # piship-pool-call-N


class SandboxPool:
    """Sandboxes for many tasks at once; a context manager (``close()`` on exit).

    ``size``: at most this many sandboxes exist at once (activating ones included).
    ``warm``: this many are activated ahead, from construction on, and refilled.
    ``reuse=False``: every task gets a fresh sandbox, disposed after it; ``True``: a
    sandbox returns to the pool unless the task left it broken, ``reset`` (a shell
    command) run in it first (a non-zero exit disposes it). ``max_create_rate``:
    creates per second across the pool. ``max_attempts``: how many sandboxes a task
    whose work never started may try. ``labels`` go on every sandbox or claim.
    ``progress``: ``True`` shows a bar, ``False`` never, ``None`` on a terminal or in
    a notebook. ``policy``, ``workspace``, ``sync`` and ``env`` are as for
    :func:`~piship_remote.activate_sandbox`.
    """

    def __init__(
        self,
        policy: SandboxPolicy | Mapping[str, Any],
        *,
        backend: Backend,
        workspace: PathLike,
        size: int = 4,
        warm: int = 0,
        sync: str = "none",
        env: Mapping[str, str] | None = None,
        reuse: bool = True,
        reset: str | None = None,
        max_create_rate: float | None = None,
        max_attempts: int = 2,
        labels: Mapping[str, str] | None = None,
        progress: bool | None = None,
    ) -> None:
        _check_counts(size, warm, max_attempts)
        self._size = size
        labels = dict(labels or {})
        self._progress = progress
        health = HealthOnce(labelled(backend, labels))
        activate = functools.partial(
            _activate_usable,
            policy,
            backend=health.backend,
            workspace=workspace,
            sync=sync,
            env=env,
        )
        self._supply = SandboxSupply(
            functools.partial(health.watch, activate),
            size=size,
            warm=warm,
            throttle=CreateThrottle(max_create_rate),
        )
        # Kept across map calls, so that a call's first task starts on a running thread.
        self._task_workers = WorkerPool("piship-pool-task", _TASK_NUMBERS)
        self._call_workers = WorkerPool("piship-pool-call", _CALL_NUMBERS)
        self._attempts = TaskAttempts(
            self._supply,
            reset=reset,
            reuse=reuse,
            max_attempts=max_attempts,
            call_workers=self._call_workers,
            on_failure=health.forget,
        )
        self._telemetry = Telemetry.load(backend.id, backend.redactor)
        # The registry's closer must not hold the pool.
        closer = functools.partial(_close, self._supply, (self._task_workers, self._call_workers))
        self._token = lifecycle.track(
            self, "sandbox pool", lambda: closer(lifecycle.disposal_cause())
        )

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._supply.closed:
            error = self._supply.closed_error()
            return f"<SandboxPool size={self._size}: {error}; {error.user_action}>"
        ready, leased, existing = self._supply.counts()
        return f"<SandboxPool size={self._size} {leased} busy, {ready} ready, {existing} sandboxes>"

    def close(self) -> None:
        """Dispose every sandbox the pool holds; idempotent; waits for no running task
        (each ends with an error mentioning "closed")."""
        self._shut(CLOSED_BY_CALLER)

    def _shut(self, reason: str) -> None:
        _close(self._supply, (self._task_workers, self._call_workers), reason)
        lifecycle.untrack(self._token)

    @contextlib.contextmanager
    def sandbox(self, timeout: float | None = None) -> Iterator[Sandbox]:
        """Lease one ready sandbox (waiting up to ``timeout`` seconds) until the block ends.

        It goes back to the pool at exit, or is disposed when the block raised a
        failure of the sandbox itself.

        Raises:
            SandboxUnavailable: no sandbox was ready within ``timeout`` (the message mentions the
                pool), or the pool is closed.
            ConfigInvalid: a bad ``timeout``.
        """
        deadline = Deadline.never() if timeout is None else Deadline.after(timeout)
        try:
            sandbox = self._supply.take(deadline, None)
        except NoSandboxInTime:
            raise SandboxUnavailable(
                f"no sandbox of the pool became free within {timeout} s",
                component="pool",
                user_action="Wait longer, or make the pool larger (size=)",
            ) from None
        healthy = False
        try:
            yield sandbox
            healthy = True
        except Exception as error:
            healthy = not is_infrastructure(error)
            raise
        finally:
            self._attempts.give_back(sandbox, healthy=healthy)

    def map(self, task: Task, items: Iterable[Any], *, timeout: float | None = None) -> TaskResults:
        """Run ``task`` for every item, up to ``size`` at once; one result per item, in
        the order of ``items`` (a list; in a notebook a table, the failures first). Never
        raises for a task's failure.

        ``task``: a shell command in which every literal ``{item}`` is replaced by the
        item quoted as one shell word (``shlex.quote``; other braces are left as they
        are), run with ``Sandbox.run`` (its ``CommandResult`` is the value), or a
        callable ``task(sandbox, item)`` whose return value is the value (the way to
        use the item unquoted). A command that cannot run (blank, a NUL, an open quote)
        raises ``ConfigInvalid`` before any task starts; one without ``{item}`` warns
        (``NoItemWarning``). ``timeout`` bounds
        each task, waiting for its sandbox included. Ctrl-C kills every running remote
        command, disposes the pool's sandboxes and is re-raised.

        A callable runs on a ``piship-pool-call-N`` daemon thread: when its timeout
        expires (or the pool closes) first, its result says ``"timeout"``
        (``"cancelled"``) at once and its sandbox is disposed, never handed on, but
        Python cannot stop the thread, which lingers until the callable returns.

        Raises:
            ConfigInvalid: a bad ``task`` or ``timeout``; a task's own failure is in its result,
                never raised.
            SandboxUnavailable: the pool is closed.
        """
        listed = list(items)
        results: list[TaskResult | None] = [None] * len(listed)
        for index, result in self._run(task, listed, timeout):
            results[index] = result
        return TaskResults(result for result in results if result is not None)

    def imap(
        self, task: Task, items: Iterable[Any], *, timeout: float | None = None
    ) -> Iterator[TaskResult]:
        """As :meth:`map`, but yields each result as its task finishes.

        Raises:
            ConfigInvalid: a bad ``task`` or ``timeout``; a task's own failure is in its result,
                never raised.
            SandboxUnavailable: the pool is closed.
        """
        for _, result in self._run(task, list(items), timeout):
            yield result

    def _run(
        self, task: Task, items: list[Any], timeout: float | None
    ) -> Iterator[tuple[int, TaskResult]]:
        if not isinstance(task, str) and not callable(task):
            raise TypeError(
                f"task must be a command (str) or a callable, not {type(task).__name__}"
            )
        if isinstance(task, str):
            check_command(task, stacklevel=3)  # warns at map's/imap's caller
        if self._supply.closed:
            raise self._supply.closed_error()
        progress = progress_for(self._progress, len(items))
        run = MapRun(
            self._attempts,
            task,
            items,
            timeout=timeout,
            threads=self._size,
            workers=self._task_workers,
            progress=progress,
            telemetry=self._telemetry,
        )
        finished = False
        try:
            yield from run.results()
            finished = True
        except KeyboardInterrupt:
            run.stop()
            self._shut(INTERRUPTED)  # disposing the sandboxes kills every command
            raise KeyboardInterrupt(
                "interrupted: the pool's running commands were killed, its sandboxes deleted"
            ) from None
        finally:
            if not finished:
                run.stop()
            progress.close()


def _close(supply: SandboxSupply, workers: tuple[WorkerPool, ...], cause: str) -> None:
    supply.close(cause)
    for pool in workers:
        pool.close()  # the idle threads end; the busy ones as their task returns


def _check_counts(size: int, warm: int, max_attempts: int) -> None:
    if size < 1:
        raise ConfigInvalid(f"size must be at least 1, not {size}")
    if not 0 <= warm <= size:
        raise ConfigInvalid(f"warm must be between 0 and size ({size}), not {warm}")
    if max_attempts < 1:
        raise ConfigInvalid(f"max_attempts must be at least 1, not {max_attempts}")


def _activate_usable(policy: SandboxPolicy | Mapping[str, Any], **options: Any) -> Sandbox:
    """``activate_sandbox``, raising where an optional policy gave a sandbox that runs
    nothing: in a pool that is a create that failed (the task never started), not a sandbox
    to lease."""
    sandbox = activate_sandbox(policy, **options)
    if sandbox.report.level != "unavailable":
        return sandbox
    sandbox.dispose()
    raise SandboxUnavailable(
        f"No {sandbox.report.adapter} sandbox could be activated for the pool: "
        f"{sandbox.report.reason or 'unknown reason'}",
        component="sandbox",
        user_action="Fix the sandbox backend (piship-remote doctor says what), then map again",
        redactor=options["backend"].redactor,
    )
