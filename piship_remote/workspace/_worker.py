"""Work run beside the caller on named daemon threads: one action on a thread of its own
(:class:`Worker`), or jobs on reusable threads (:class:`WorkerPool`).

stat = Worker(lambda: remote.stat(path), "piship-files-stat")
...                                  # the caller does something else meanwhile
info = stat.result()                 # what the action returned, or raises what it raised

workers = WorkerPool("piship-exec", itertools.count(1))
workers.submit(job)                  # job.execute() on an idle piship-exec-N, then job.finish()
workers.close()                      # idle threads end now, busy ones after their job
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, cast

from piship_remote.telemetry.context import Job, carried_job

__all__ = ["Worker", "WorkerPool"]

T = TypeVar("T")


class Worker(Generic[T]):
    """``action()`` on a daemon thread named ``name`` (``piship-…``); ``on_end(failed)`` runs
    on that thread once the action returned or raised."""

    def __init__(
        self,
        action: Callable[[], T],
        name: str,
        on_end: Callable[[bool], None] | None = None,
    ) -> None:
        self._action = action
        self._on_end = on_end
        self._value: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._action()
        except BaseException as error:  # handed to the caller by result()
            self._error = error
        finally:
            if self._on_end is not None:
                self._on_end(self._error is not None)

    def done(self, wait: float) -> bool:
        """Whether the action has ended, waiting at most ``wait`` seconds for it."""
        self._thread.join(wait)
        return not self._thread.is_alive()

    def result(self) -> T:
        """What the action returned (or raised, once), when it is done."""
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return cast(T, self._value)

    def result_quietly(self) -> None:
        """Wait for the action to end and drop what it gave (the caller is failing already)."""
        self._thread.join()
        self._error = None


class _PooledThread:
    def __init__(self, pool: WorkerPool, name: str) -> None:
        self.jobs: queue.SimpleQueue[Job[Any] | None] = queue.SimpleQueue()
        self._pool = pool
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            outcome = job.execute()
            # Idle again before the job's outcome is handed on, so that the work that
            # outcome lets the caller submit next takes this thread instead of a new one.
            keep = self._pool._release(self)
            job.finish(outcome)
            if not keep:
                return


class WorkerPool:
    """Reusable daemon threads named ``<name>-N`` (N from ``numbers``): an idle one takes
    the next job, a new one starts when all are busy.

    A job's ``execute`` must not raise (it returns what went wrong); ``finish`` runs on
    the same thread once it is idle again.
    """

    def __init__(self, name: str, numbers: Iterator[int]) -> None:
        self._name = name
        self._numbers = numbers
        self._lock = threading.Lock()
        self._idle: list[_PooledThread] = []
        self._closed = False

    def submit(self, job: Job[Any]) -> _PooledThread | None:
        """Run ``job`` on a worker; ``None`` once the pool is closed."""
        job = carried_job(job)  # the caller's span is the parent of the job's
        with self._lock:
            if self._closed:
                return None
            worker = self._idle.pop() if self._idle else None
        if worker is None:
            worker = _PooledThread(self, f"{self._name}-{next(self._numbers)}")
            worker.jobs.put(job)
            worker.thread.start()
        else:
            worker.jobs.put(job)
        return worker

    def reap(self, worker: _PooledThread, timeout: float) -> None:
        """Once the pool is closed, wait for ``worker`` (whose job returned) to exit."""
        if self._closed and worker.thread is not threading.current_thread():
            worker.thread.join(timeout)

    def close(self) -> None:
        """Stop and join the idle workers; busy ones exit when their job returns."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.jobs.put(None)
        for worker in idle:
            if worker.thread is not threading.current_thread():
                worker.thread.join()

    def _release(self, worker: _PooledThread) -> bool:
        with self._lock:
            if self._closed:
                return False
            self._idle.append(worker)
            return True
