"""Load and soak: thousands of commands from 16 threads on one sandbox, per backend.

The double runs in its own process (``serve_double.py``), so this process holds only
the library and what it leaves behind can be measured: after dispose, no library
thread (``piship-…``) and no file descriptor more than before; between the end of
the first thousand commands and the end of the last, resident memory grows by no
more than :data:`RSS_BUDGET`. Every command must succeed with its own output, the
Kubernetes backend must run them all in one claim, and no credential or host secret
may reach the double outside its header, nor any log record (checked as each record
is emitted, at DEBUG; the repository-wide sweep is off here because the double is in
another process and because keeping 10,000 records would itself grow the heap).

``PISHIP_SOAK_COMMANDS`` sets the number of commands (default 5,000; with the
werkzeug doubles that is about 25 s for E2B and 20 s for Kubernetes on 2 cores).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
from reliability_support import (
    API_KEY,
    BEARER,
    HOST_ENV,
    HOST_SECRETS,
    checked_logs,
    library_threads,
    open_fds,
    policy,
    rss_bytes,
    settled,
)

from piship_remote.backends.base import Backend
from piship_remote.backends.e2b.backend import E2bCompatibleBackend
from piship_remote.backends.kubernetes.backend import KubernetesAgentSandboxBackend
from piship_remote.sandbox.activation import Sandbox, activate_sandbox

COMMANDS = int(os.environ.get("PISHIP_SOAK_COMMANDS", "5000"))
THREADS = 16
WARM_UP = min(1000, COMMANDS // 5)
# Python allocations still live after the warm-up: a leak of even one small object
# per command would add one block per command (4,000 here).
BLOCK_BUDGET = COMMANDS // 5
# Resident memory also counts glibc's per-thread malloc arenas: the 16 calling threads
# each make their backend calls themselves, which spreads allocations over up to 8
# arenas per core; that growth flattens out (measured: +6 MiB E2B, +0.3 MiB Kubernetes).
RSS_BUDGET = 12 * 1024 * 1024
SERVE = Path(__file__).with_name("serve_double.py")
REPO = Path(__file__).resolve().parents[2]


@attrs.define
class Double:
    """A double in a child process: its URL now, its summary once it stopped."""

    url: str
    summary: dict[str, Any] = attrs.field(factory=dict)


@contextmanager
def double_process(kind: str, credential: str) -> Iterator[Double]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    process = subprocess.Popen(
        [sys.executable, str(SERVE), kind, credential, *HOST_SECRETS.values()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdin is not None and process.stdout is not None
    try:
        double = Double(process.stdout.readline().strip())
        assert double.url.startswith("http://127.0.0.1:"), double.url
        yield double
        process.stdin.close()
        double.summary = json.loads(process.stdout.readline())
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


def make_backend(kind: str, url: str) -> Backend:
    if kind == "e2b":
        return E2bCompatibleBackend(endpoint=url, envd_url=url, credential=lambda: API_KEY)
    return KubernetesAgentSandboxBackend(
        endpoint=url,
        router=url,
        template="python-pool",
        namespace="agents",
        poll_interval=0.01,
        credential=lambda: BEARER,
    )


@attrs.define
class Load:
    """Runs commands on one sandbox from many threads, keeping every failure."""

    sandbox: Sandbox
    failures: list[str] = attrs.field(factory=list)
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def run(self, pool: ThreadPoolExecutor, indices: range) -> None:
        list(pool.map(self.one, indices))

    def one(self, index: int) -> None:
        output = bytearray()
        command = f"echo soak-{index}"
        try:
            result = self.sandbox.exec(command, on_data=output.extend, timeout=60)
            if result.exit_code != 0 or command not in output.decode():
                self.fail(f"{command}: exit {result.exit_code}, output {bytes(output)!r}")
        except Exception as e:
            self.fail(f"{command}: {type(e).__name__}: {e}")

    def fail(self, text: str) -> None:
        with self.lock:
            self.failures.append(text)


@pytest.mark.no_secret_sweep
@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["e2b", "k8s"])
def test_soak(kind: str, workspace: Path) -> None:
    credential = API_KEY if kind == "e2b" else BEARER
    with double_process(kind, credential) as double, checked_logs() as logs:
        threads, fds, start = library_threads(), open_fds(), time.monotonic()
        backend = make_backend(kind, double.url)
        sandbox = activate_sandbox(
            policy("deny" if kind == "e2b" else "allow"),
            backend=backend,
            workspace=workspace,
            env=HOST_ENV,
        )
        load = Load(sandbox)
        with ThreadPoolExecutor(THREADS, thread_name_prefix="soak-caller") as pool:
            load.run(pool, range(WARM_UP))
            gc.collect()
            blocks, rss = sys.getallocatedblocks(), rss_bytes()
            load.run(pool, range(WARM_UP, COMMANDS))
            gc.collect()
            block_growth = sys.getallocatedblocks() - blocks
            rss_growth = rss_bytes() - rss
        sandbox.dispose()
        backend.close()  # type: ignore[attr-defined]
        seconds = time.monotonic() - start
        assert load.failures == [], f"{len(load.failures)} failures, e.g. {load.failures[:3]}"
        assert settled(lambda: library_threads() <= threads), sorted(
            t.name for t in library_threads() - threads
        )
        assert settled(lambda: open_fds() <= fds), f"{open_fds()} fds open, {fds} before"
    print(
        f"\nsoak {kind}: {COMMANDS} commands in {seconds:.1f} s, after the first {WARM_UP}: "
        f"Python heap {block_growth:+d} blocks, RSS {rss_growth / 2**20:+.2f} MiB"
    )
    assert block_growth <= BLOCK_BUDGET, f"the Python heap grew by {block_growth} blocks"
    assert rss_growth <= RSS_BUDGET, f"RSS grew {rss_growth / 2**20:.1f} MiB"
    summary = double.summary
    assert summary["live"] == [] and summary["errors"] == 0
    assert summary["leaks"] == []
    assert summary["counts"]["command"] == COMMANDS + 1  # + the activation check
    assert summary["counts"]["create"] == 1  # one sandbox; for Kubernetes one claim
    assert logs.records > COMMANDS and logs.leaked == []
