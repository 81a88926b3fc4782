"""Detached execution on the fake cluster, whose runtime really runs each ``/execute``
command in a shell on this host (in a temporary directory, like the real runtime:
split with ``shlex``, no shell of its own, its own session, strict UTF-8 output).
"""

from __future__ import annotations

import errno
import os
import select
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote.backends.base import BackendResult, ExecRequest
from piship_remote.backends.kubernetes.backend import (
    KubernetesAgentSandboxBackend,
    KubernetesInstance,
)
from piship_remote.model.errors import CommandCancelled
from piship_remote.model.policy import SandboxProfile
from piship_remote.testing import CLAIMS, Cluster, KubernetesServer

PROFILE = SandboxProfile(workspace="/ws", network="allow")


class ShellRuntime:
    """``execute(command)`` for the fake: runs it for real, timing every call."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.durations: list[float] = []

    def __call__(self, command: str) -> dict[str, Any]:
        started = time.monotonic()
        done = subprocess.run(
            shlex.split(command),
            cwd=self.base,
            env={"PATH": "/usr/bin:/bin", "TMPDIR": str(self.base)},
            capture_output=True,
            start_new_session=True,
            timeout=30,
        )
        self.durations.append(time.monotonic() - started)
        return {"stdout": done.stdout, "stderr": done.stderr, "exit_code": done.returncode}


def reader_gone(fifo: Path, timeout: float) -> bool:
    """Whether, within ``timeout`` seconds, no process has ``fifo`` open for reading.

    A non-blocking writer's open fails with ENXIO when nobody reads; otherwise the
    writer, holding the FIFO open without writing, sees POLLERR when the last reader goes
    (and releases no reader meanwhile: it sends nothing, and stays open until then).
    """
    try:
        descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError as error:
        if error.errno == errno.ENXIO:
            return True
        raise
    try:
        poller = select.poll()
        poller.register(descriptor, select.POLLERR)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(descriptor)


@pytest.fixture
def runtime(tmp_path: Path) -> ShellRuntime:
    return ShellRuntime(tmp_path)


@pytest.fixture
def detached(runtime: ShellRuntime) -> Iterator[tuple[KubernetesServer, KubernetesInstance]]:
    """Our backend in detached mode behind a router that ends any request after 2 s."""
    with KubernetesServer(runtime, Cluster(proxy_timeout=2)) as fake:
        backend = KubernetesAgentSandboxBackend(
            endpoint=fake.url,
            router=fake.url,
            template="python-pool",
            namespace="agents",
            poll_interval=0.01,
            execution="detached",
        )
        instance = backend.prepare(PROFILE)
        yield fake, instance
        instance.dispose()
        backend.close()


def run(
    instance: KubernetesInstance, command: str, on_stdout: Callable[[bytes], None], **kw: Any
) -> BackendResult:
    return instance.exec(ExecRequest(command, "/ws", ".", {}), on_stdout=on_stdout, **kw)


@pytest.mark.timeout(90)
def test_a_20_second_command_outlives_a_2_second_router_limit_with_its_output_streamed(
    detached: tuple[KubernetesServer, KubernetesInstance], runtime: ShellRuntime
) -> None:
    fake, instance = detached
    arrivals: list[tuple[float, bytes]] = []
    err: list[bytes] = []
    started = time.monotonic()
    result = instance.exec(
        ExecRequest(
            "for i in $(seq 1 20); do echo tick $i; sleep 1; done; echo done >&2; exit 7",
            "/ws",
        ),
        on_stdout=lambda chunk: arrivals.append((time.monotonic() - started, chunk)),
        on_stderr=err.append,
    )
    elapsed = time.monotonic() - started
    assert result == BackendResult(7)
    assert b"".join(c for _, c in arrivals) == b"".join(b"tick %d\n" % i for i in range(1, 21))
    assert b"".join(err) == b"done\n"
    assert elapsed >= 20
    assert arrivals[0][0] < elapsed - 10  # streamed while it ran, not at the end
    assert max(runtime.durations) < 2  # no request came near the router's limit
    assert fake.count("POST", CLAIMS) == 1


@pytest.mark.timeout(30)
def test_a_cancelled_command_is_killed_and_its_claim_stays_usable(
    detached: tuple[KubernetesServer, KubernetesInstance], runtime: ShellRuntime
) -> None:
    fake, instance = detached
    cancel = threading.Event()
    seen = threading.Event()

    def on_stdout(chunk: bytes) -> None:
        if b"running" in chunk:
            seen.set()

    marker = runtime.base / "survived"
    gate = runtime.base / "gate"
    os.mkfifo(gate)
    # The job blocks opening the FIFO until a writer comes: while it lives, a writer can
    # open it; once it is killed, nobody reads and nothing could ever touch the marker.
    command = f"echo running; read -r line < {gate}; touch {marker}"
    failures: list[BaseException] = []

    def cancelled_run() -> None:
        try:
            run(instance, command, on_stdout, cancel=cancel)
        except BaseException as error:
            failures.append(error)

    worker = threading.Thread(target=cancelled_run)
    worker.start()
    assert seen.wait(10)
    cancel.set()
    worker.join(10)
    assert not worker.is_alive()
    assert [type(f) for f in failures] == [CommandCancelled]
    out: list[bytes] = []
    assert run(instance, "echo again", out.append) == BackendResult(0)
    assert out == [b"again\n"]
    assert fake.count("POST", CLAIMS) == 1
    assert fake.count("DELETE") == 0
    assert reader_gone(gate, timeout=10)  # the job was killed, not left waiting
    assert not marker.exists()
    assert list((runtime.base / "piship-jobs").iterdir()) == []


def test_a_command_that_fits_runs_detached_and_its_exit_code_comes_back(
    detached: tuple[KubernetesServer, KubernetesInstance],
) -> None:
    _, instance = detached
    out: list[bytes] = []
    assert run(instance, "printf 'a\\377b'; kill -9 $$", out.append) == BackendResult(137)
    assert b"".join(out) == b"a\xffb"


def test_the_report_says_commands_run_detached_and_direct_mode_adds_nothing() -> None:
    from piship_remote.model.report import (
        DETACHED_SENTENCE,
        ContainmentReport,
        describe_containment,
    )

    def backend(execution: Any) -> KubernetesAgentSandboxBackend:
        return KubernetesAgentSandboxBackend(
            endpoint="http://127.0.0.1:1",
            router="http://127.0.0.1:1",
            template="python-pool",
            execution=execution,
        )

    assert backend("detached").capabilities().execution == "detached"
    assert backend("direct").capabilities() == backend("direct").capabilities()
    assert backend("direct").capabilities().execution is None
    assert "execution" not in backend("direct").capabilities().to_dict()
    report = ContainmentReport(
        level="enforced", adapter="k", provider="k", required=True, network="allow"
    )
    detached = ContainmentReport(
        level="enforced",
        adapter="k",
        provider="k",
        required=True,
        network="allow",
        execution="detached",
    )
    assert describe_containment(detached) == f"{describe_containment(report)} {DETACHED_SENTENCE}"
    assert detached.to_dict()["execution"] == "detached"
    with pytest.raises(ValueError, match="execution"):
        backend("sometimes")
