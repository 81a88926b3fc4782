"""A callable task on a worker thread, so that the task's timeout and cancel bound it.

    call = BoundedCall(task, sandbox, item, workers=call_workers)
    value = call.result(deadline, cancel, closed)   # or raises

The callable runs on one of the pool's reusable ``piship-pool-call-N`` threads. Python
cannot stop a thread: when the deadline passes, ``cancel`` is set or the pool closes
first, :meth:`BoundedCall.result` raises at once (``CommandTimeout``,
``CommandCancelled``) and the thread (a daemon) lingers in the callable until it
returns; what it returns or raises then is dropped, and the thread is free again (or
ends, once the pool is closed). The pool disposes that sandbox (it never hands it to
another task), so the callable's next call on it fails at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from piship_remote.model.errors import CommandCancelled, CommandTimeout
from piship_remote.sandbox import lifecycle
from piship_remote.sandbox.sandbox import Sandbox
from piship_remote.transport.deadline import Deadline
from piship_remote.workspace._worker import WorkerPool

__all__ = ["BoundedCall"]

_WAKE = 0.05  # how often a waiting task looks at its cancel event and the pool's closing


class BoundedCall:
    """``task(sandbox, item)`` handed to a worker of ``workers``."""

    def __init__(
        self,
        task: Callable[[Sandbox, Any], Any],
        sandbox: Sandbox,
        item: Any,
        *,
        workers: WorkerPool,
    ) -> None:
        self._task = task
        self._sandbox = sandbox
        self._item = item
        # The callable's commands are the main thread's when the task's thread works for it.
        self._for_main = lifecycle.works_for_the_main_thread()
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self._refused = workers.submit(self) is None  # the pool closed meanwhile

    def execute(self) -> None:
        """Run the callable (on the worker); what it gives is kept for :meth:`result`."""
        with lifecycle.working_for_the_main_thread() if self._for_main else nullcontext():
            try:
                self._value = self._task(self._sandbox, self._item)
            except BaseException as error:  # handed to the caller by result()
                self._error = error

    def finish(self, outcome: None) -> None:
        self._done.set()

    def result(
        self,
        deadline: Deadline,
        cancel: threading.Event,
        closed: Callable[[], bool],
    ) -> Any:
        """The callable's value, or its exception raised here; ``CommandTimeout`` at
        ``deadline``, ``CommandCancelled`` when ``cancel`` is set or ``closed()`` becomes
        true first."""
        if self._refused:
            raise CommandCancelled()
        wait = 0.0
        while not self._done.wait(wait):
            if cancel.is_set() or closed():
                raise CommandCancelled()
            wait = _WAKE
            left = deadline.remaining()
            if left is not None:
                if left <= 0:
                    raise CommandTimeout(deadline.seconds or 0.0)
                wait = min(wait, left)
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        return self._value
