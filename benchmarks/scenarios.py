"""The scenario registry: what ``python -m benchmarks`` can run, and at which round trips.

A scenario is a module with ``NAME`` and ``run(context) -> ScenarioResult``; adding
one (file transfer, say) is that module plus one line here. ``round_trips=True``
runs it again behind the delay proxy for every non-zero ``--rtt``, with
``context.url`` pointing at the proxy and ``context.rtt_ms`` set; the harness
stamps its rows with that round trip::

    SCENARIOS["exec_latency"].round_trips    # True
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from benchmarks import (
    activation,
    cancellation,
    concurrency,
    exec_latency,
    file_transfer,
    memory,
    pool,
    pool_first_command,
    pool_kubernetes,
    pool_scale,
    push,
    sandboxd,
    stream_cuts,
    stream_throughput,
    template_python,
    tracing_cost,
)
from benchmarks.report import ScenarioResult
from benchmarks.rounds import Context

__all__ = ["SCENARIOS", "Scenario"]


@attrs.frozen
class Scenario:
    """One registered scenario."""

    name: str
    run: Callable[[Context], ScenarioResult]
    round_trips: bool = False
    """Also measured behind the delay proxy (every non-zero ``--rtt``)."""


_REGISTERED = (
    Scenario(exec_latency.NAME, exec_latency.run, round_trips=True),
    Scenario(stream_throughput.NAME, stream_throughput.run),
    Scenario(concurrency.NAME, concurrency.run, round_trips=True),
    Scenario(cancellation.NAME, cancellation.run),
    Scenario(memory.NAME, memory.run),
    Scenario(activation.NAME, activation.run, round_trips=True),
    Scenario(file_transfer.NAME, file_transfer.run, round_trips=True),
    Scenario(push.NAME, push.run, round_trips=True),
    Scenario(pool.NAME, pool.run, round_trips=True),
    Scenario(pool_kubernetes.NAME, pool_kubernetes.run, round_trips=True),
    Scenario(pool_first_command.NAME, pool_first_command.run, round_trips=True),
    Scenario(pool_scale.NAME, pool_scale.run, round_trips=True),
    Scenario(tracing_cost.NAME, tracing_cost.run, round_trips=True),
    Scenario(template_python.NAME, template_python.run),
    Scenario(sandboxd.NAME, sandboxd.run),
    Scenario(stream_cuts.NAME, stream_cuts.run),
)

SCENARIOS: dict[str, Scenario] = {scenario.name: scenario for scenario in _REGISTERED}
