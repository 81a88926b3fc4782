"""Stream throughput: many MiB of stdout in 32 KiB frames, per client.

The fast loopback server sends the same pre-encoded frames to every reader (one
HTTP chunk per frame, as envd behind Go's net/http does). MB/s is stdout payload
(10^6 bytes) per second for every reader, the floors included: ``socket-raw``
moves the whole encoded body (about 4/3 of the payload) in that time, so it is the
physical limit for delivering that payload over this protocol.
"""

from __future__ import annotations

import contextlib
import time

from benchmarks.clients import Client, e2b_clients
from benchmarks.report import ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context, alternate

__all__ = ["NAME", "run"]

NAME = "stream_throughput"
CLIENTS = ("ours-sandbox", "ours-instance", "e2b-sdk", "socket-raw", "requests-raw")


def run(context: Context) -> ScenarioResult:
    """MB/s of ``bench-stream <size>`` through ``on_data``/``on_stdout`` or raw reads."""
    began = time.perf_counter()
    size = context.size
    script = f"bench-stream {size.stream_bytes}"
    problems: list[str] = []

    def measure(client: Client) -> list[float]:
        received = [0]

        def count(n: int) -> None:
            received[0] += n

        start = time.perf_counter_ns()
        client.run(script, count)
        seconds = (time.perf_counter_ns() - start) / 1e9
        if client.role != "floor" and received[0] != size.stream_bytes:
            problems.append(f"{client.name} delivered {received[0]} of {size.stream_bytes} bytes")
        return [size.stream_bytes / 1e6 / seconds]

    with contextlib.ExitStack() as stack:
        clients, skipped = e2b_clients(context.url, context.workspace, stack, names=CLIENTS)
        samples = alternate(clients, rounds=size.stream_rounds, measure=measure)
        rows = [
            summarize(
                NAME,
                "loopback",
                client.name,
                client.role,
                samples[client.name],
                unit="MB/s",
                higher_is_better=True,
                extra={"MiB": size.stream_bytes // (1024 * 1024)},
            )
            for client in clients
        ]
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped + sorted(set(problems))),
        notes=(
            "x floor is against socket-raw (the body read from a socket, no HTTP or Connect "
            "decoding); requests-raw reads the same body through requests without decoding",
        ),
        seconds=time.perf_counter() - began,
    )
