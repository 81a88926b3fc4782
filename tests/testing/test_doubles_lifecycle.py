"""DESIGN §1.6 on the doubles as users construct them (no arguments): dispose deletes,
detach keeps, a SIGKILLed host leaks its sandbox or claim for at most its lease."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from piship_remote import activate_sandbox
from piship_remote.testing import E2bServer, KubernetesServer
from tests.sandbox.test_lifecycle_exit import none_left, ready, rest, start
from tests.support.lifecycle_child import backend

pytestmark = pytest.mark.timeout(60)

Live = Callable[[], list[str]]


@pytest.fixture(params=["e2b", "k8s"])
def double(request: pytest.FixtureRequest) -> Iterator[tuple[str, str, Live]]:
    if request.param == "e2b":
        with E2bServer() as e2b:
            yield "e2b", e2b.url, lambda: e2b.live_sandboxes
    else:
        with KubernetesServer() as k8s:
            yield "k8s", k8s.url, lambda: k8s.live_claims


def test_dispose_deletes(double: tuple[str, str, Live], tmp_path: Path) -> None:
    kind, url, live = double
    sandbox = activate_sandbox(
        {"required": True, "network": {"mode": "allow"}},
        backend=backend(kind, url, 3600.0),
        workspace=tmp_path,
    )
    assert live() == [sandbox.id]
    sandbox.dispose()
    assert live() == []


def test_detach_keeps(double: tuple[str, str, Live]) -> None:
    kind, url, live = double
    child = start(kind, url, "detach")
    sandbox_id = ready(child)
    out, err = rest(child)
    assert f"detached {sandbox_id}" in out, err
    assert live() == [sandbox_id]


def test_a_sigkilled_process_under_a_10_s_lease_leaves_nothing_after_15_s(
    double: tuple[str, str, Live],
) -> None:
    kind, url, live = double
    child = start(kind, url, "wait", "10")
    ready(child)
    killed = time.monotonic()
    child.kill()
    child.wait(timeout=10)
    assert live()
    assert none_left(live, 15.0 - (time.monotonic() - killed)) == []
