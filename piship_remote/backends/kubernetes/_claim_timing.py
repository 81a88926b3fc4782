"""How long a SandboxClaim the API saw alive is trusted to exist without asking again.

Asking the API before every command doubles its round trips. Instead, a claim
the API saw alive (its readiness, an existence check or a renewal) less than the
*existence window* ago runs a direct command without a check; past half the
window a background check refreshes the sighting, past the whole window the
command checks first. A sighting is timed from when its request was *sent*, so
the answer's own delay never stretches the window. Its age is, like a claim's
elapsed lifetime, the larger advance of the wall and the monotonic clock (a
suspend counts, a backward jump does not)::

    window = ExistenceWindow(existence_window_seconds(1.0), clock)
    sent = window.now()           # read just before the request is sent
    ...                           # the request found the claim alive
    window.verdict(sent)          # TRUST, REFRESH (trust, check in the background) or CHECK

A window of 0 checks before every command.
"""

from __future__ import annotations

import enum
import math

import attrs

from piship_remote.backends.lifetime import ClaimClock, micros
from piship_remote.model.errors import ConfigInvalid, PiShipError

__all__ = [
    "DEFAULT_EXISTENCE_WINDOW",
    "ExistenceWindow",
    "Sighting",
    "Trust",
    "existence_window_seconds",
]

DEFAULT_EXISTENCE_WINDOW = 1.0


def existence_window_seconds(value: object) -> float:
    """``value`` as a window in seconds; ``PiShipError`` (``CONFIG_INVALID``) unless >= 0.

    >>> existence_window_seconds(0)
    0.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(f"existence_window must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise _invalid(f"existence_window must be a finite number of seconds >= 0, not {value!r}")
    return seconds


def _invalid(message: str) -> PiShipError:
    return ConfigInvalid(
        message,
        user_action="Pass existence_window=0 to check the claim before every command, "
        "or a positive number of seconds",
        component="sandbox",
    )


@attrs.frozen
class Sighting:
    """Both clocks (µs) read just before a request that found the claim alive was sent."""

    wall: int
    monotonic: int


class Trust(enum.Enum):
    """Whether a direct command may skip the existence check."""

    TRUST = "trust"  # seen alive less than half the window ago
    REFRESH = "refresh"  # within the window, past its half: trust, and check in the background
    CHECK = "check"  # never seen, seen too long ago, or a window of 0: check first


@attrs.frozen
class ExistenceWindow:
    """The existence window of one backend, in microseconds, on its claim clock."""

    span: int
    clock: ClaimClock

    @classmethod
    def of(cls, seconds: float, clock: ClaimClock) -> ExistenceWindow:
        """A window of ``seconds`` (validated by :func:`existence_window_seconds`)."""
        return cls(micros(existence_window_seconds(seconds)), clock)

    def now(self) -> Sighting:
        """Both clocks now: read it just before sending a request that may see the claim."""
        return Sighting(micros(self.clock.now()), micros(self.clock.monotonic()))

    def age(self, seen: Sighting) -> int:
        """Microseconds since ``seen``: the larger advance of the two clocks, never negative."""
        wall = micros(self.clock.now()) - seen.wall
        monotonic = micros(self.clock.monotonic()) - seen.monotonic
        return max(wall, monotonic, 0)

    def verdict(self, seen: Sighting | None) -> Trust:
        """What a direct command needs before it runs, given the latest sighting."""
        if seen is None or self.span <= 0:
            return Trust.CHECK
        age = self.age(seen)
        if age >= self.span:
            return Trust.CHECK
        return Trust.REFRESH if 2 * age >= self.span else Trust.TRUST

    def newer(self, seen: Sighting | None, other: Sighting) -> Sighting:
        """The more recent of two sightings (``other`` when ``seen`` is missing)."""
        if seen is None:
            return other
        return other if self.age(other) < self.age(seen) else seen
