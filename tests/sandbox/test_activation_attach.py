"""Attaching never deletes: a failed activation lets go of a sandbox it attached to."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from piship_remote import activate_sandbox
from piship_remote.backends.base import BackendResult, ExecRequest
from piship_remote.backends.e2b.backend import E2bCompatibleBackend, E2bInstance
from piship_remote.model.errors import SANDBOX_UNAVAILABLE, PiShipError
from piship_remote.testing import E2bServer

E2bFactory = Callable[..., E2bServer]
POLICY = {"required": True, "network": {"mode": "deny"}}
pytestmark = pytest.mark.timeout(30)


class _RefusingCommands:
    """An attached instance whose every command fails (the readiness check included)."""

    cancels_promptly = False
    controls_commands = False

    def __init__(self, inner: E2bInstance) -> None:
        self._inner = inner

    def exec(self, request: ExecRequest, **_: Any) -> BackendResult:
        raise PiShipError(SANDBOX_UNAVAILABLE, "envd refused the command", component="sandbox")

    def epoch(self) -> str | None:
        return self._inner.epoch()

    def dispose(self) -> None:
        self._inner.dispose()

    def detach(self) -> str:
        return self._inner.detach()


class _AttachedFails(E2bCompatibleBackend):
    def attach(self, sandbox_id: str) -> Any:
        return _RefusingCommands(super().attach(sandbox_id))


def test_a_failed_activation_lets_go_of_the_attached_sandbox(
    e2b_server: E2bFactory, workspace: Path
) -> None:
    mock = e2b_server()
    backend = E2bCompatibleBackend(endpoint=mock.url, envd_url=mock.url, credential=lambda: "k")
    with backend:
        sandbox_id = activate_sandbox(POLICY, backend=backend, workspace=workspace).detach()
    failing = _AttachedFails(endpoint=mock.url, envd_url=mock.url, credential=lambda: "k")
    with failing, pytest.raises(PiShipError) as failed:
        activate_sandbox(POLICY, backend=failing, workspace=workspace, attach=sandbox_id)
    assert failed.value.code == SANDBOX_UNAVAILABLE
    assert mock.live_sandboxes == [sandbox_id]
    assert not any(r.method == "DELETE" for r in mock.requests)
