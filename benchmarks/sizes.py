"""How much work each ``--size`` does.

>>> SIZES["tiny"].exec_calls
20
"""

from __future__ import annotations

import attrs

__all__ = ["SIZES", "Size"]

MIB = 1024 * 1024


@attrs.frozen
class Size:
    """Work per scenario; every count is per client (``rtt_*`` behind the delay proxy)."""

    name: str
    exec_calls: int
    exec_batch: int
    rtt_exec_calls: int
    rtt_exec_batch: int
    stream_bytes: int
    stream_rounds: int
    threads: tuple[int, ...]
    commands_per_thread: int
    concurrency_rounds: int
    command_ms: int
    cancel_runs: int
    cancel_timeout: float
    memory_bytes: int
    activation_runs: int
    cut_runs: int
    """Commands per client and server whose stream is cut (``stream_cuts``)."""
    cut_lines: int
    """Numbered lines each of them prints (2,500,000: 18.9 MB)."""
    stall_runs: int
    cut_workers: int
    """Worker processes the cut runs are spread over."""


SIZES: dict[str, Size] = {
    "tiny": Size(
        name="tiny",
        exec_calls=20,
        exec_batch=5,
        rtt_exec_calls=6,
        rtt_exec_batch=3,
        stream_bytes=2 * MIB,
        stream_rounds=1,
        threads=(1, 8, 32),
        commands_per_thread=2,
        concurrency_rounds=1,
        command_ms=5,
        cancel_runs=3,
        cancel_timeout=0.02,
        memory_bytes=4 * MIB,
        activation_runs=1,
        cut_runs=2,
        cut_lines=20_000,
        stall_runs=1,
        cut_workers=1,
    ),
    "small": Size(
        name="small",
        exec_calls=200,
        exec_batch=25,
        rtt_exec_calls=30,
        rtt_exec_batch=5,
        stream_bytes=32 * MIB,
        stream_rounds=3,
        threads=(1, 8, 32),
        commands_per_thread=10,
        concurrency_rounds=3,
        command_ms=10,
        cancel_runs=50,
        cancel_timeout=0.05,
        memory_bytes=128 * MIB,
        activation_runs=3,
        cut_runs=20,
        cut_lines=100_000,
        stall_runs=5,
        cut_workers=1,
    ),
    "full": Size(
        name="full",
        exec_calls=1000,
        exec_batch=50,
        rtt_exec_calls=100,
        rtt_exec_batch=10,
        stream_bytes=256 * MIB,
        stream_rounds=5,
        threads=(1, 8, 32),
        commands_per_thread=25,
        concurrency_rounds=5,
        command_ms=10,
        cancel_runs=200,
        cancel_timeout=0.05,
        memory_bytes=1024 * MIB,
        activation_runs=5,
        cut_runs=1_000,
        cut_lines=2_500_000,
        stall_runs=20,
        cut_workers=2,
    ),
}
