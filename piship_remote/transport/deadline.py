"""One value for time: :class:`Deadline`, the moment a command or a request must end by.

Made once, where the caller's ``timeout`` enters (``Sandbox.exec``), and handed down
as it is: the run engine fires it, a backend tells the service how long is left, the
transport bounds its socket waits by it. Nobody keeps a copy in seconds::

    deadline = Deadline.after(30)        # or Deadline.never()
    deadline.remaining()                 # 29.99..., never below 0; None for never
    deadline.expired                     # False, until 30 s have passed
    deadline.earliest(Deadline.after(5)) # the 5 s one
    deadline.later(1)                    # a backstop one second after it

``timeout_deadline`` turns a caller's ``timeout`` argument into one, refusing what
has no sensible meaning (zero, a negative number, NaN).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import attrs

from piship_remote.model.errors import ConfigInvalid

__all__ = ["Clock", "Deadline", "timeout_deadline"]

Clock = Callable[[], float]
"""A monotonic clock in seconds (``time.monotonic`` unless a test gives its own)."""


@attrs.frozen
class Deadline:
    """The moment something must end by, on ``clock``; ``at`` ``None``: never.

    ``seconds`` is the timeout it was made from (for messages: "timeout:30").
    """

    at: float | None
    seconds: float | None = None
    clock: Clock = attrs.field(default=time.monotonic, eq=False, repr=False)

    @classmethod
    def after(cls, seconds: float, clock: Clock = time.monotonic) -> Deadline:
        """``seconds`` from now on ``clock`` (zero or less: already expired)."""
        return cls(clock() + seconds, seconds, clock)

    @classmethod
    def never(cls) -> Deadline:
        """A deadline that never passes."""
        return _NEVER

    @property
    def bounded(self) -> bool:
        """Whether it ever passes."""
        return self.at is not None

    def remaining(self) -> float | None:
        """Seconds left (``0.0`` once passed); ``None`` for a deadline that never passes."""
        if self.at is None:
            return None
        return max(0.0, self.at - self.clock())

    @property
    def expired(self) -> bool:
        """Whether it has passed."""
        return self.at is not None and self.clock() >= self.at

    def later(self, seconds: float) -> Deadline:
        """The same deadline ``seconds`` later (a backstop for a service or a socket,
        so that the caller's own deadline acts first); never stays never."""
        if self.at is None:
            return self
        return Deadline(self.at + seconds, self.seconds, self.clock)

    def earliest(self, other: Deadline) -> Deadline:
        """Whichever of the two passes first (``self`` when they are equal)."""
        if other.at is None:
            return self
        if self.at is None or other.at < self.at:
            return other
        return self


_NEVER = Deadline(None)


def timeout_deadline(timeout: float | Deadline | None, *, name: str = "timeout") -> Deadline:
    """The deadline a caller's ``timeout`` (seconds; ``None``: none; a :class:`Deadline`
    as it is, as a pool hands its task's down) means.

    Raises ``PiShipError`` ``CONFIG_INVALID`` for zero, a negative number or NaN:
    "no time at all" is never silently read as "no limit".
    """
    if isinstance(timeout, Deadline):
        return timeout
    if timeout is None or timeout == math.inf:
        return Deadline.never()
    if math.isnan(timeout) or timeout <= 0:
        raise ConfigInvalid(
            f"{name} must be a positive number of seconds or None (no limit), not {timeout}",
        )
    return Deadline.after(timeout)
