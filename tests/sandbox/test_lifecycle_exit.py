"""Nothing leaks when the host process ends, on both doubles; detached sandboxes reattach.

Each child (``lifecycle_child.py``) activates a sandbox on an ``E2bServer`` or a
``KubernetesServer`` running in this process, then ends in one way; the double must
hold nothing within 5 s of the child's end (SIGKILL: once the 10 s lease ran out).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piship_remote.testing import Cluster, E2bServer, KubernetesServer

CHILD = Path(__file__).parents[1] / "support" / "lifecycle_child.py"
GONE_WITHIN = 5.0
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["e2b", "k8s"])
def double(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, Callable[[], list[str]]]]:
    if request.param == "e2b":
        with E2bServer() as e2b:
            yield "e2b", e2b.url, lambda: e2b.live_sandboxes
    else:
        with KubernetesServer(cluster=Cluster(clock=time.time)) as k8s:  # lifetimes honoured
            yield "k8s", k8s.url, lambda: k8s.live_claims


def start(kind: str, url: str, mode: str, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, str(CHILD), kind, url, mode, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(ROOT),
    )


def ready(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline()
    if not line.startswith("ready "):
        child.kill()
        pytest.fail(f"the child did not activate: {line!r} {child.communicate()[1][-2000:]}")
    return line.split()[1]


def rest(child: subprocess.Popen[str]) -> tuple[str, str]:
    """The rest of the child's output once it ends. Not ``communicate()``: that reads the
    pipes' descriptors directly and would miss what ``readline()`` already buffered."""
    assert child.stdout is not None and child.stderr is not None
    out = child.stdout.read()
    err = child.stderr.read()
    child.wait(timeout=30)
    return out, err


def none_left(live: Callable[[], list[str]], within: float) -> list[str]:
    deadline = time.monotonic() + within
    while live() and time.monotonic() < deadline:
        time.sleep(0.05)
    return live()


@pytest.mark.parametrize("mode", ["exit", "raise", "drop"])
def test_a_child_that_ends_without_dispose_leaves_nothing(double, mode) -> None:
    kind, url, live = double
    child = start(kind, url, mode)
    ready(child)
    child.wait(timeout=30)
    assert none_left(live, GONE_WITHIN) == []


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.usefixtures("ctrl_c")
def test_a_signalled_child_deletes_its_sandbox(double, signum) -> None:
    kind, url, live = double
    child = start(kind, url, "wait")
    ready(child)
    assert live()
    child.send_signal(signum)
    child.wait(timeout=30)
    assert none_left(live, GONE_WITHIN) == []
    if signum == signal.SIGTERM:  # the default action after the cleanup: killed by it
        assert child.returncode == -signal.SIGTERM


def test_a_child_killed_by_sigkill_leaks_for_at_most_its_lease(double) -> None:
    kind, url, live = double
    child = start(kind, url, "wait", "10")
    ready(child)
    killed = time.monotonic()
    child.kill()
    child.wait(timeout=10)
    assert live()
    assert none_left(live, 15.0 - (time.monotonic() - killed)) == []


def test_a_detached_sandbox_is_reattached_from_another_process(double) -> None:
    kind, url, live = double
    first = start(kind, url, "detach")
    sandbox_id = ready(first)
    out, err = rest(first)
    assert f"detached {sandbox_id}" in out, err
    assert live(), "detach must not delete the sandbox"
    second = start(kind, url, "attach", "3600", sandbox_id)
    assert ready(second) == sandbox_id
    out, err = rest(second)
    assert "ran" in out, err
    assert none_left(live, GONE_WITHIN) == []
