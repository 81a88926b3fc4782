"""``Sandbox.exec``'s :class:`ExecResult`: the exit code, and per stream the bytes that may
be missing after a dropped stream (nothing, on every backend, when nothing was cut)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from piship_remote import E2bCompatibleBackend, ExecResult, activate_sandbox
from piship_remote.testing import E2bServer, KubernetesServer
from tests.support.seed import kubernetes

POLICY = {"required": True, "network": {"mode": "allow"}, "environment": {"allow": ["LANG"]}}
NOTHING = {"stdout": 0, "stderr": 0}
pytestmark = pytest.mark.timeout(60)


def test_a_result_made_with_its_exit_code_alone_has_nothing_missing() -> None:
    assert ExecResult(3).missing == NOTHING
    assert ExecResult(exit_code=3) == ExecResult(3, NOTHING)


def test_an_exec_on_an_e2b_service_with_nothing_cut_has_nothing_missing(
    e2b_server: Any, workspace: Path
) -> None:
    mock: E2bServer = e2b_server(command=lambda start: {"stdout": "out\n", "exit_code": 4})
    backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url)
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        assert sandbox.exec("x") == ExecResult(4, NOTHING)


@pytest.fixture
def kubernetes_url(kubernetes_server: Any) -> Iterator[str]:
    mock: KubernetesServer = kubernetes_server(lambda command: {"stdout": "ok\n"})
    yield mock.url


def test_an_exec_on_kubernetes_has_nothing_missing(kubernetes_url: str, workspace: Path) -> None:
    backend = kubernetes(kubernetes_url)
    with activate_sandbox(POLICY, backend=backend, workspace=workspace, env={}) as sandbox:
        assert sandbox.exec("echo ok").missing == NOTHING
