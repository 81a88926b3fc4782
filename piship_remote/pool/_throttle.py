"""The pool's create throttle: at most ``rate`` creates per second, spaced evenly.

    throttle = CreateThrottle(rate=2.0)
    if throttle.wait_turn(closed, deadline):
        activate()

Each create takes the next free slot (``1 / rate`` seconds after the one before) and
waits for it; a slot past the caller's deadline is not taken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from piship_remote.model.errors import ConfigInvalid

__all__ = ["CreateThrottle"]


class CreateThrottle:
    """Spaces the creates of a pool; ``rate`` ``None``: no limit. Thread-safe."""

    def __init__(self, rate: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        if rate is not None and not rate > 0:
            raise ConfigInvalid(f"max_create_rate must be positive, not {rate}")
        self._gap = 0.0 if rate is None else 1.0 / rate
        self._clock = clock
        self._lock = threading.Lock()
        self._next = float("-inf")

    def wait_turn(self, stop: threading.Event, deadline: float | None) -> bool:
        """Wait for this create's slot; ``False`` when ``stop`` was set or the slot would
        come after ``deadline`` (an instant of this throttle's clock: a
        :class:`~piship_remote.transport.deadline.Deadline`'s ``at``)."""
        with self._lock:
            now = self._clock()
            slot = max(now, self._next)
            if deadline is not None and slot > deadline:
                return False
            self._next = slot + self._gap
        delay = slot - now
        if delay > 0:
            return not stop.wait(delay)
        return not stop.is_set()
