"""A callable task on a thread of its own, so that the task's timeout and cancel bound it.

    call = BoundedCall(task, sandbox, item, name="piship-pool-call-3")
    value = call.result(deadline, cancel, closed)   # or raises

Python cannot stop a thread. When the deadline passes, ``cancel`` is set or the pool
closes first, :meth:`BoundedCall.result` raises at once (``CommandTimeout``,
``CommandCancelled``) and the ``piship-pool-call-N`` thread (a daemon) lingers until
the callable returns; what it returns or raises then is dropped. The pool disposes
that sandbox (it never hands it to another task), so the callable's next call on it
fails at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from piship_remote.model.errors import CommandCancelled, CommandTimeout
from piship_remote.sandbox import lifecycle
from piship_remote.sandbox.sandbox import Sandbox
from piship_remote.telemetry import carried
from piship_remote.transport.deadline import Deadline
from piship_remote.workspace._worker import Worker

__all__ = ["BoundedCall"]

_WAKE = 0.05  # how often a waiting task looks at its cancel event and the pool's closing


class BoundedCall:
    """``task(sandbox, item)`` started on a ``piship-pool-call-N`` daemon thread."""

    def __init__(
        self, task: Callable[[Sandbox, Any], Any], sandbox: Sandbox, item: Any, *, name: str
    ) -> None:
        # The task's span is the parent of the spans the callable makes; a task thread that
        # works for the main thread hands that on.
        for_main = lifecycle.works_for_the_main_thread()

        def call() -> Any:
            with lifecycle.working_for_the_main_thread() if for_main else nullcontext():
                return task(sandbox, item)

        self._worker: Worker[Any] = Worker(carried(call), name)

    def result(
        self,
        deadline: Deadline,
        cancel: threading.Event,
        closed: Callable[[], bool],
    ) -> Any:
        """The callable's value, or its exception raised here; ``CommandTimeout`` at
        ``deadline``, ``CommandCancelled`` when ``cancel`` is set or ``closed()`` becomes
        true first."""
        wait = 0.0
        while not self._worker.done(wait):
            if cancel.is_set() or closed():
                raise CommandCancelled()
            wait = _WAKE
            left = deadline.remaining()
            if left is not None:
                if left <= 0:
                    raise CommandTimeout(deadline.seconds or 0.0)
                wait = min(wait, left)
        return self._worker.result()
