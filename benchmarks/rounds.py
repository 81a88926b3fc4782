"""Alternating rounds: every client takes its turn each round, in a rotating order.

Interleaving spreads drifts of the machine (other load, CPU frequency, a warming
allocator) over every client instead of charging them to whoever ran last::

    samples = alternate(clients, rounds=20, measure=lambda c: [timed(c.run, "true")])
    samples["e2b-sdk"]          # 20 latencies in seconds
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs

from benchmarks.loopback import LoopbackServer
from benchmarks.sizes import Size

__all__ = ["Context", "Named", "alternate", "timed"]


class Named(Protocol):
    name: str


_C = TypeVar("_C", bound=Named)


@attrs.define
class Context:
    """What every scenario gets: the size, the shared fast server, a scratch workspace.

    Clients connect to ``url``: the fast server itself when ``rtt_ms`` is 0, else the
    delay proxy in front of it (control plane and envd alike). ``loopback`` is always
    the server itself, for its counters and arrival times.
    """

    size: Size
    loopback: LoopbackServer
    workspace: str
    url: str
    rtt_ms: int = 0


def timed(action: Callable[..., Any], *args: Any) -> float:
    """Seconds ``action(*args)`` took."""
    start = time.perf_counter_ns()
    action(*args)
    return (time.perf_counter_ns() - start) / 1e9


def alternate(
    clients: Sequence[_C], rounds: int, measure: Callable[[_C], list[float]]
) -> dict[str, list[float]]:
    """``measure(client)`` for each client in each of ``rounds`` rounds; samples by name."""
    samples: dict[str, list[float]] = {client.name: [] for client in clients}
    if not clients:
        return samples
    for index in range(rounds):
        shift = index % len(clients)
        for client in (*clients[shift:], *clients[:shift]):
            samples[client.name].extend(measure(client))
    return samples
