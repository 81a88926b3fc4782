"""benchmarks/concurrency.py: every client runs its alternating rounds, summed into one row."""

from __future__ import annotations

import threading

import attrs
import pytest

from benchmarks.concurrency import _Counters, _sweep
from benchmarks.rounds import Context
from benchmarks.sizes import SIZES


class _Client:
    role = "ours"

    def __init__(self, name: str, order: list[str], lock: threading.Lock) -> None:
        self.name = name
        self.order = order
        self.lock = lock

    def run(self, script: str, count: object = None) -> None:
        with self.lock:
            self.order.append(self.name)


@pytest.mark.timeout(30)
def test_each_client_runs_its_rounds_alternating_and_reports_them_summed() -> None:
    size = attrs.evolve(SIZES["tiny"], threads=(2,), commands_per_thread=3, concurrency_rounds=2)
    context = Context(size=size, loopback=None, workspace="/tmp", url="")  # type: ignore[arg-type]
    order: list[str] = []
    lock = threading.Lock()
    clients = [_Client(name, order, lock) for name in ("a", "b")]
    answered = iter(range(0, 1000, 6))  # the server answered 6 requests per round
    counters = _Counters(lambda: next(answered), lambda: {})
    rows = _sweep(context, "loopback", clients, "true", [], counters)  # type: ignore[arg-type]
    assert [row.client for row in rows] == ["a", "b"]
    assert [row.n for row in rows] == [12, 12]  # 2 rounds x 2 threads x 3 commands
    assert [row.extra["requests"] for row in rows] == [1.0, 1.0]
    assert order[:6] == ["a"] * 6 and order[6:12] == ["b"] * 6  # round 1: a, then b
    assert order[12:18] == ["b"] * 6 and order[18:] == ["a"] * 6  # round 2: b first
