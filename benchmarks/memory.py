"""Memory: peak RSS growth while a client streams ``size.memory_bytes`` of stdout.

Each client runs in a fresh child process (``python -m benchmarks.memory``) so
that no other scenario's heap hides or adds growth: it sets up, streams 1 MiB to
warm up, resets VmHWM (``/proc/self/clear_refs``), notes VmRSS, streams, and
reports VmHWM minus that baseline. Output goes to a counting callback, so a client
whose memory grows with the output is holding the output somewhere itself.

The ``-slow`` variants give the callback 0.5 ms of (GIL-free) sleep per chunk, a
consumer slower than the network (a notebook cell, a terminal): a client that
buffers between its reader and the callback instead of pushing back then grows.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import subprocess
import sys
import time
from typing import Any

from benchmarks.clients import e2b_clients
from benchmarks.loopback import ROOT
from benchmarks.report import Role, Row, ScenarioResult, summarize, with_ratios
from benchmarks.rounds import Context
from benchmarks.sampling import memory_kib, reset_peak_rss

__all__ = ["NAME", "run"]

NAME = "memory"
CLIENTS = (
    "ours-sandbox",
    "ours-instance",
    "e2b-sdk",
    "socket-raw",
    "requests-raw",
    "ours-sandbox-slow",
    "e2b-sdk-slow",
)
ROLES: dict[str, Role] = {
    "ours-sandbox": "ours",
    "ours-instance": "ours",
    "e2b-sdk": "reference",
    "ours-sandbox-slow": "ours",
    "e2b-sdk-slow": "reference",
}
SLOW = "-slow"
SLOW_SECONDS = 0.0005
_WARM_UP = 1024 * 1024
_CHILD_TIMEOUT = 600.0


def run(context: Context) -> ScenarioResult:
    """One child per client; rows of RSS growth in MiB (lower is better)."""
    began = time.perf_counter()
    size = context.size
    rows: list[Row] = []
    skipped: list[str] = []
    for name in CLIENTS:
        report = _child(context.url, context.workspace, name, size.memory_bytes)
        if "skipped" in report:
            skipped.append(str(report["skipped"]))
            continue
        role: Role = ROLES.get(name, "floor")
        rows.append(
            summarize(
                NAME,
                "loopback",
                name,
                role,
                [report["growth_kib"] / 1024],
                unit="MiB",
                group="slow on_data" if name.endswith(SLOW) else "",
                extra={
                    "baseline_MiB": round(report["baseline_kib"] / 1024, 1),
                    "MB_per_s": round(size.memory_bytes / 1e6 / report["seconds"], 1),
                    "hwm_reset": str(report["hwm_reset"]),
                },
            )
        )
    return ScenarioResult(
        name=NAME,
        rows=with_ratios(rows),
        skipped=tuple(skipped),
        notes=(f"{size.memory_bytes // (1024 * 1024)} MiB streamed per client, one child each",),
        seconds=time.perf_counter() - began,
    )


def _child(url: str, workspace: str, client: str, total: int) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "benchmarks.memory",
        "--url",
        url,
        "--workspace",
        workspace,
        "--client",
        client,
        "--bytes",
        str(total),
    ]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=_CHILD_TIMEOUT,
            check=False,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        return {"skipped": f"{client}: the child did not finish in {_CHILD_TIMEOUT:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"skipped": f"{client}: the child failed (exit {done.returncode}): {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _measure(url: str, workspace: str, name: str, total: int) -> dict[str, Any]:
    slow = name.endswith(SLOW)
    base = name.removesuffix(SLOW)
    with contextlib.ExitStack() as stack:
        clients, skipped = e2b_clients(url, workspace, stack, names=(base,))
        if not clients:
            return {"skipped": skipped[0] if skipped else f"{name}: unavailable"}
        client = clients[0]
        received = [0]

        def count(n: int) -> None:
            received[0] += n
            if slow:
                time.sleep(SLOW_SECONDS)

        client.run(f"bench-stream {_WARM_UP}", count)
        gc.collect()
        reset = reset_peak_rss()
        baseline, _ = memory_kib()
        start = time.perf_counter()
        client.run(f"bench-stream {total}", count)
        seconds = time.perf_counter() - start
        _, peak = memory_kib()
    return {
        "baseline_kib": baseline,
        "peak_kib": peak,
        "growth_kib": max(0, peak - baseline),
        "seconds": seconds,
        "hwm_reset": reset,
    }


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--client", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    args = parser.parse_args()
    print(json.dumps(_measure(args.url, args.workspace, args.client, args.bytes)), flush=True)


if __name__ == "__main__":
    _main()
