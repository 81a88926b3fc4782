"""A SandboxClaim's bounded lifetime, read on the wall clock and the monotonic clock.

A claim carries an absolute ``spec.lifecycle.shutdownTime`` that the cluster
enforces. Locally the library must know how much of it is left although the
wall clock can be set back or forward and a suspended laptop stops the
monotonic clock. The rule: time elapsed on the claim is the *larger* advance of
the two clocks since the claim was created (never negative), so a suspend
counts, a backward jump is ignored, and a forward jump counts (it can only make
a renewal come earlier). A committed shutdownTime only ever moves later, and a
claim past it is never renewed::

    clock = ClaimClock.for_lifetime(900)
    anchor = clock.anchor()                 # just before the claim is created
    rfc3339(anchor.expires)                 # '2026-09-28T18:15:01Z'
    clock.before_command(anchor, committed) # FRESH, DUE or EXPIRED
    clock.renewal(anchor, committed)        # the next shutdownTime, or None

All instants are integer microseconds internally, so that the rounding rules
(``left == 0`` is expired, shutdownTime rounded *up* to the whole second) do
not depend on floating-point luck; the public inputs are seconds.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable
from datetime import datetime, timezone

import attrs

__all__ = [
    "DEFAULT_LIFETIME",
    "MICROS",
    "Anchor",
    "ClaimClock",
    "Freshness",
    "keepalive_interval",
    "lifetime_seconds",
    "micros",
    "rfc3339",
    "whole_second",
]

MICROS = 1_000_000
DEFAULT_LIFETIME = 3600.0
MIN_KEEPALIVE = 0.25

Clock = Callable[[], float]


def lifetime_seconds(value: float | None) -> float:
    """The effective lifetime: ``value``, or one hour when it is missing, not finite or <= 0."""
    if value is None or isinstance(value, bool):
        return DEFAULT_LIFETIME
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return DEFAULT_LIFETIME
    if not math.isfinite(seconds) or seconds <= 0:
        return DEFAULT_LIFETIME
    return seconds


def keepalive_interval(lifetime: float) -> float:
    """How often a claim is renewed while a command runs: a quarter lifetime, at least 0.25 s."""
    return max(MIN_KEEPALIVE, lifetime_seconds(lifetime) / 4)


def micros(seconds: float) -> int:
    """A clock reading in seconds as whole microseconds (rounded to the nearest)."""
    return round(seconds * MICROS)


def whole_second(instant: int) -> int:
    """``instant`` (microseconds) rounded *up* to the whole second."""
    return -(-instant // MICROS) * MICROS


def rfc3339(instant: int) -> str:
    """A whole-second UTC instant as Kubernetes writes it: ``2026-09-28T18:15:01Z``."""
    moment = datetime.fromtimestamp(whole_second(instant) // MICROS, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.frozen
class Anchor:
    """Both clocks read just before a claim was created, and its first shutdownTime (µs)."""

    wall: int
    monotonic: int
    expires: int


class Freshness(enum.Enum):
    """What a claim needs before the next command runs in it."""

    FRESH = "fresh"  # at least half the lifetime left
    DUE = "due"  # less than half left: renew first
    EXPIRED = "expired"  # at or past the committed shutdownTime: replace it, never renew


@attrs.frozen
class ClaimClock:
    """The lifetime arithmetic of one backend: its lifetime and its two clocks.

    ``lifetime`` is in microseconds; build one with :meth:`for_lifetime`.
    """

    lifetime: int
    now: Clock = time.time
    monotonic: Clock = time.monotonic

    @classmethod
    def for_lifetime(
        cls, seconds: float, *, now: Clock = time.time, monotonic: Clock = time.monotonic
    ) -> ClaimClock:
        """A clock for a lifetime in seconds (a bad value falls back to one hour)."""
        return cls(micros(lifetime_seconds(seconds)), now, monotonic)

    def anchor(self) -> Anchor:
        """Read both clocks for a claim about to be created."""
        wall = micros(self.now())
        return Anchor(wall, micros(self.monotonic()), whole_second(wall + self.lifetime))

    def claim_time(self, anchor: Anchor) -> int:
        """The wall-clock instant on the claim's own timeline (µs)."""
        elapsed = max(
            micros(self.monotonic()) - anchor.monotonic, micros(self.now()) - anchor.wall, 0
        )
        return anchor.wall + elapsed

    def before_command(self, anchor: Anchor, committed: int) -> Freshness:
        """Whether the claim can run a command as is, must be renewed first, or is gone."""
        left = committed - self.claim_time(anchor)
        if left <= 0:
            return Freshness.EXPIRED
        if 2 * left >= self.lifetime:
            return Freshness.FRESH
        return Freshness.DUE

    def renewal(self, anchor: Anchor, committed: int) -> int | None:
        """The shutdownTime a renewal now commits, or ``None`` when the claim already expired.

        Never earlier than ``committed``: a concurrent renewal may have committed
        a later one already.
        """
        claim_time = self.claim_time(anchor)
        if claim_time >= committed:
            return None
        return max(committed, whole_second(claim_time + self.lifetime))
