"""Deadline: one frozen value for "must end by", on a clock a test can drive."""

from __future__ import annotations

import math

import attrs
import pytest

from piship_remote.model.errors import PiShipError
from piship_remote.transport.deadline import Deadline, timeout_deadline


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_deadline_counts_down_on_its_clock() -> None:
    clock = FakeClock()
    deadline = Deadline.after(5, clock=clock)
    clock.now += 2
    assert deadline.remaining() == 3
    assert not deadline.expired


def test_a_passed_deadline_has_nothing_left_and_is_expired() -> None:
    clock = FakeClock()
    deadline = Deadline.after(5, clock=clock)
    clock.now += 7
    assert deadline.remaining() == 0.0
    assert deadline.expired


def test_never_has_no_remaining_time_and_never_expires() -> None:
    never = Deadline.never()
    assert never.remaining() is None
    assert not never.expired
    assert not never.bounded


def test_earliest_is_the_one_that_passes_first() -> None:
    clock = FakeClock()
    soon, later = Deadline.after(1, clock=clock), Deadline.after(9, clock=clock)
    assert soon.earliest(later) is soon
    assert later.earliest(soon) is soon
    assert Deadline.never().earliest(later) is later
    assert later.earliest(Deadline.never()) is later


def test_a_deadline_is_frozen_and_keeps_its_timeout() -> None:
    deadline = Deadline.after(30)
    assert deadline.seconds == 30
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        deadline.at = 0.0  # type: ignore[misc]


@pytest.mark.parametrize("timeout", [0, 0.0, -1, -0.5, math.nan])
def test_a_timeout_of_no_time_is_config_invalid(timeout: float) -> None:
    with pytest.raises(PiShipError) as caught:
        timeout_deadline(timeout)
    assert caught.value.code == "CONFIG_INVALID"


def test_no_timeout_means_no_deadline() -> None:
    assert timeout_deadline(None) == Deadline.never()
    assert timeout_deadline(math.inf) == Deadline.never()


def test_a_positive_timeout_is_a_deadline_that_far_away() -> None:
    deadline = timeout_deadline(2.5)
    remaining = deadline.remaining()
    assert deadline.seconds == 2.5
    assert remaining is not None and 2.0 < remaining <= 2.5
