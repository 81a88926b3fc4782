"""The claim lifetime arithmetic over a wall clock and a monotonic clock (seconds in, µs inside)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from piship_remote.backends.lifetime import (
    MICROS,
    ClaimClock,
    Freshness,
    keepalive_interval,
    lifetime_seconds,
    micros,
    rfc3339,
    whole_second,
)

T = 1790618400.0  # 2026-09-28T18:00:00Z


class Clocks:
    """A settable wall clock and monotonic clock."""

    def __init__(self, wall: float = T, monotonic: float = 0.0) -> None:
        self.wall = wall
        self.mono = monotonic

    def clock(self, lifetime: float) -> ClaimClock:
        return ClaimClock.for_lifetime(lifetime, now=lambda: self.wall, monotonic=lambda: self.mono)


def at(seconds: float) -> str:
    return rfc3339(micros(T + seconds))


def test_rfc3339_is_whole_seconds_utc_with_z() -> None:
    assert rfc3339(micros(T)) == "2026-09-28T18:00:00Z"


def test_whole_second_rounds_up_and_keeps_exact_seconds() -> None:
    assert whole_second(micros(T + 0.001)) == micros(T + 1)
    assert whole_second(micros(T)) == micros(T)


def test_creation_rounds_the_shutdown_time_up_to_the_second() -> None:
    anchor = Clocks(wall=T + 0.25).clock(900).anchor()
    assert rfc3339(anchor.expires) == "2026-09-28T18:15:01Z"


def test_creation_on_a_whole_second_keeps_it() -> None:
    assert rfc3339(Clocks().clock(600).anchor().expires) == "2026-09-28T18:10:00Z"


@pytest.mark.parametrize("bad", [0, -5, math.inf, math.nan, None])
def test_a_bad_lifetime_falls_back_to_an_hour(bad: float | None) -> None:
    assert lifetime_seconds(bad) == 3600.0


def test_a_fractional_lifetime_is_kept() -> None:
    assert Clocks().clock(1.5).lifetime == 1_500_000


@pytest.mark.parametrize(("lifetime", "every"), [(1, 0.25), (0.5, 0.25), (3600, 900), (60, 15)])
def test_keepalive_runs_every_quarter_lifetime_but_not_faster_than_250_ms(
    lifetime: float, every: float
) -> None:
    assert keepalive_interval(lifetime) == every


def test_a_fresh_claim_needs_nothing() -> None:
    clocks = Clocks()
    clock = clocks.clock(1)
    anchor = clock.anchor()
    assert clock.before_command(anchor, anchor.expires) is Freshness.FRESH


def test_past_half_the_lifetime_a_command_renews_first() -> None:
    clocks = Clocks(monotonic=T)
    clock = clocks.clock(1)
    anchor = clock.anchor()
    clocks.wall += 0.6
    clocks.mono += 0.6
    assert clock.before_command(anchor, anchor.expires) is Freshness.DUE
    assert clock.renewal(anchor, anchor.expires) == micros(T + 2)


def test_a_backward_jump_with_no_monotonic_time_renews_to_the_committed_value() -> None:
    clocks = Clocks()
    clock = clocks.clock(1)
    anchor = clock.anchor()
    clocks.wall -= 3600
    assert clock.before_command(anchor, anchor.expires) is Freshness.FRESH
    assert clock.renewal(anchor, anchor.expires) == micros(T + 1)


@pytest.mark.parametrize("jump", [-3600.0, -2.0])
def test_a_backward_jump_renews_from_monotonic_elapsed_time(jump: float) -> None:
    clocks = Clocks(monotonic=5)
    clock = clocks.clock(60)
    anchor = clock.anchor()
    committed = anchor.expires
    clocks.wall += jump
    clocks.mono += 40
    assert clock.before_command(anchor, committed) is Freshness.DUE
    committed = clock.renewal(anchor, committed) or 0
    assert rfc3339(committed) == at(100)
    clocks.wall -= jump / 2
    clocks.mono += 40
    assert clock.before_command(anchor, committed) is Freshness.DUE
    committed = clock.renewal(anchor, committed) or 0
    assert rfc3339(committed) == at(140)
    clocks.mono += 59.999
    assert clock.before_command(anchor, committed) is Freshness.DUE
    committed = clock.renewal(anchor, committed) or 0
    assert rfc3339(committed) == at(200)
    clocks.mono += 60.001
    assert clock.before_command(anchor, committed) is Freshness.EXPIRED
    assert clock.renewal(anchor, committed) is None


def test_a_suspend_counts_through_the_wall_clock() -> None:
    clocks = Clocks()
    clock = clocks.clock(3600)
    anchor = clock.anchor()
    clocks.wall += 45 * 60
    clocks.mono += 5 * 60
    assert clock.before_command(anchor, anchor.expires) is Freshness.DUE
    assert clock.renewal(anchor, anchor.expires) == micros(T + 45 * 60 + 3600)


def test_a_suspend_past_the_lifetime_expires_the_claim() -> None:
    clocks = Clocks()
    clock = clocks.clock(3600)
    anchor = clock.anchor()
    clocks.wall += 61 * 60
    clocks.mono += 5 * 60
    assert clock.before_command(anchor, anchor.expires) is Freshness.EXPIRED


def test_a_late_keepalive_never_revives_a_claim() -> None:
    clocks = Clocks()
    clock = clocks.clock(1)
    anchor = clock.anchor()
    clocks.wall += 5
    assert clock.renewal(anchor, anchor.expires) is None


def test_a_forward_jump_moves_the_shutdown_time_by_at_most_the_jump() -> None:
    clocks = Clocks()
    clock = clocks.clock(60)
    anchor = clock.anchor()
    clocks.wall += 35
    clocks.mono += 10
    assert clock.before_command(anchor, anchor.expires) is Freshness.DUE
    committed = clock.renewal(anchor, anchor.expires) or 0
    assert rfc3339(committed) == at(95)
    clocks.wall += 86_400
    assert clock.before_command(anchor, committed) is Freshness.EXPIRED


def test_exactly_at_the_committed_time_counts_as_expired() -> None:
    clocks = Clocks()
    clock = clocks.clock(60)
    anchor = clock.anchor()
    clocks.mono += 60
    assert clock.before_command(anchor, anchor.expires) is Freshness.EXPIRED


def test_a_backward_jump_then_real_expiry_expires() -> None:
    clocks = Clocks()
    clock = clocks.clock(60)
    anchor = clock.anchor()
    clocks.wall -= 3600
    clocks.mono += 61
    assert clock.before_command(anchor, anchor.expires) is Freshness.EXPIRED


@given(
    lifetime=st.floats(min_value=0.25, max_value=86_400),
    wall_moves=st.floats(min_value=-86_400, max_value=86_400),
    mono_moves=st.floats(min_value=0, max_value=86_400),
    committed_extra=st.integers(min_value=0, max_value=10),
)
def test_a_renewal_is_never_earlier_than_the_committed_time(
    lifetime: float, wall_moves: float, mono_moves: float, committed_extra: int
) -> None:
    clocks = Clocks()
    clock = clocks.clock(lifetime)
    anchor = clock.anchor()
    committed = anchor.expires + committed_extra * MICROS  # committed values are whole seconds
    clocks.wall += wall_moves
    clocks.mono += mono_moves
    renewed = clock.renewal(anchor, committed)
    if clock.claim_time(anchor) >= committed:
        assert renewed is None
    else:
        assert renewed is not None
        assert renewed >= committed
        assert renewed % MICROS == 0
    assert clock.claim_time(anchor) >= anchor.wall
