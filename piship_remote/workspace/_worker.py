"""One action run beside the caller on a named daemon thread, its outcome handed back.

stat = Worker(lambda: remote.stat(path), "piship-files-stat")
...                                  # the caller does something else meanwhile
info = stat.result()                 # what the action returned, or raises what it raised
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar, cast

__all__ = ["Worker"]

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
