"""The supply's close(): a sandbox whose create was in flight for a task is deleted before
close() returns, so nothing the pool made outlives it (a Ctrl-C'd map in a kernel that
exits next included)."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from piship_remote import PiShipError
from piship_remote.pool._supply import SandboxSupply
from piship_remote.pool._throttle import CreateThrottle
from piship_remote.sandbox.activation import Sandbox
from piship_remote.transport.deadline import Deadline
from tests.support.pool import settled

pytestmark = pytest.mark.timeout(30)


class _Made:
    """What a create returns: only disposal matters to the supply."""

    def __init__(self) -> None:
        self.disposed = threading.Event()

    def dispose(self) -> None:
        self.disposed.set()


def test_close_deletes_the_sandbox_of_a_task_create_still_in_flight() -> None:
    creating, release, made = threading.Event(), threading.Event(), _Made()

    def activate() -> Sandbox:
        creating.set()
        release.wait(20)
        return cast(Sandbox, made)

    supply = SandboxSupply(activate, size=1, warm=0, throttle=CreateThrottle(None))
    taken: list[Any] = []
    taker = threading.Thread(target=lambda: taken.append(_outcome(supply)), daemon=True)
    taker.start()
    assert creating.wait(10)
    disposed_at_return: list[bool] = []

    def close() -> None:
        supply.close()
        disposed_at_return.append(made.disposed.is_set())

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    assert settled(lambda: supply.closed)
    release.set()
    closer.join(20)
    taker.join(20)
    assert disposed_at_return == [True]
    assert isinstance(taken[0], PiShipError) and "closed" in str(taken[0])


def _outcome(supply: SandboxSupply) -> object:
    try:
        return supply.take(Deadline.never(), None)
    except PiShipError as error:
        return error
