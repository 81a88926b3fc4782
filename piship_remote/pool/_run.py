"""One ``map``/``imap`` call: its items run on the pool's ``piship-pool-task-N`` workers.

    run = MapRun(attempts, task, items, timeout=600, threads=4, workers=task_workers,
                 progress=NoProgress(), telemetry=Telemetry.load(backend.id))
    for index, result in run.results():   # as they finish
        ...

Up to ``threads`` workers (reusable threads the pool keeps across calls) each take the
next item not yet started and run it to its
:class:`~piship_remote.pool.result.TaskResult`. The caller's thread only waits for
results, waking often enough for Ctrl-C (``KeyboardInterrupt``) to reach it. When the
caller stops early (Ctrl-C, an exception, a generator closed), :meth:`stop` cancels
the items not started and every running command.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import Any

from piship_remote.model.errors import CommandCancelled
from piship_remote.pool._attempts import Task, TaskAttempts
from piship_remote.pool._progress import Progress
from piship_remote.pool.result import CANCELLED, UNKNOWN, TaskResult
from piship_remote.sandbox import lifecycle
from piship_remote.telemetry import Telemetry
from piship_remote.telemetry.names import ATTEMPTS, ERROR_TYPE, POOL_TASK_SPAN, SANDBOX_ID
from piship_remote.telemetry.outcomes import error_type
from piship_remote.transport._cancel import CancelToken
from piship_remote.workspace._worker import WorkerPool

__all__ = ["MapRun"]

_WAKE = 0.05  # how often the waiting caller can take a KeyboardInterrupt

Finished = tuple[int, TaskResult]


class MapRun:
    """The items of one call, the threads that run them and the results they give."""

    def __init__(
        self,
        attempts: TaskAttempts,
        task: Task,
        items: Sequence[Any],
        *,
        timeout: float | None,
        threads: int,
        workers: WorkerPool,
        progress: Progress,
        telemetry: Telemetry,
    ) -> None:
        self._attempts = attempts
        self._task = task
        self._items = items
        self._timeout = timeout
        self._progress = progress
        self._next = iter(range(len(items)))
        self._next_lock = threading.Lock()
        self._results: queue.SimpleQueue[Finished] = queue.SimpleQueue()
        # A token, not a plain Event: a command given a plain Event has its sandbox's
        # watcher thread poll it every 2 ms while it runs, one thread per busy sandbox.
        self.cancel = CancelToken()
        self._telemetry = telemetry
        # Called on the main thread, the call takes Ctrl-C itself: its threads need no watch.
        self._for_main = threading.current_thread() is threading.main_thread()
        for _ in range(min(threads, len(items))):
            if workers.submit(_Runner(self)) is None:  # the pool closed meanwhile
                self.stop()
                self._put(self._work())
                break

    def results(self) -> Iterator[Finished]:
        """``(index, result)`` for every item, as each finishes."""
        for _ in range(len(self._items)):
            while True:
                try:
                    yield self._results.get(timeout=_WAKE)
                    break
                except queue.Empty:
                    continue

    def stop(self) -> None:
        """Cancel the items not started and the running commands."""
        self.cancel.set()

    def _take(self) -> int | None:
        with self._next_lock:
            return next(self._next, None)

    def _work(self) -> Finished | None:
        """Run items until none is left; the last one's result is returned, not put, so
        that the worker is idle again before the caller hears of it."""
        with lifecycle.working_for_the_main_thread() if self._for_main else nullcontext():
            index = self._take()
            while index is not None:
                finished = (index, self._result_of(self._items[index]))
                index = self._take()
                if index is None:
                    return finished
                self._results.put(finished)
        return None

    def _put(self, finished: Finished | None) -> None:
        if finished is not None:
            self._results.put(finished)

    def _result_of(self, item: Any) -> TaskResult:
        if self.cancel.is_set():
            return TaskResult(item, None, CommandCancelled(), CANCELLED, None, 0, 0.0)
        self._progress.started()
        result = self._run(item)
        self._progress.finished(result.outcome)
        return result

    def _run(self, item: Any) -> TaskResult:
        """One item's task, in its span (the task's outcome, sandbox and attempts)."""
        telemetry = self._telemetry
        with telemetry.span(POOL_TASK_SPAN, ended=telemetry.pool_task_ended) as span:
            try:
                result = self._attempts.run(self._task, item, self._timeout, self.cancel)
            except BaseException as error:  # a bug below: the item still gets its result
                result = TaskResult(item, None, error, UNKNOWN, None, 1, 0.0)
            span.set(SANDBOX_ID, result.sandbox_id)
            span.set(ATTEMPTS, result.attempts)
            if result.error is not None:
                span.set(ERROR_TYPE, error_type(result.error))
            span.outcome(result.outcome)
        return result


class _Runner:
    """A worker's part of one run: items until none is left, then the last result."""

    __slots__ = ("_run",)

    def __init__(self, run: MapRun) -> None:
        self._run = run

    def execute(self) -> Finished | None:
        return self._run._work()

    def finish(self, outcome: Finished | None) -> None:
        self._run._put(outcome)
