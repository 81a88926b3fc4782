"""The seed suite's shared setup (``remote.test.ts``): its policy, host environment and helpers.

Both seed ports use the same temporary workspace, the same host environment with
secrets that must never leave, and the same ``activate``/``run`` helpers.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from piship_remote.activation import Sandbox, activate_sandbox
from piship_remote.backends.base import Backend, ExecRequest
from piship_remote.policy import SandboxProfile

SECRETS = {
    "ACME_API_TOKEN": "sk-live-never-in-remote-backends",
    "AWS_SECRET_ACCESS_KEY": "aws-never-in-remote-backends",
    "GITHUB_TOKEN": "ghp_never_in_remote_backends_0000000000",
}
ENV = {
    "PATH": "/opt/host/bin",
    "HOME": "/home/alice",
    "LANG": "C.UTF-8",
    "DOCS_MODE": "demo",
    "UNLISTED_VARIABLE": "unlisted-host-value",
    **SECRETS,
}


def seed_policy(network: str = "deny", **overrides: Any) -> dict[str, Any]:
    """The seed's policy: required, ``~/.ssh`` read-denied, the five-name allow list."""
    return {
        "required": True,
        "filesystem": {"read": {"deny": ["~/.ssh"]}, "write": {"allow": ["workspace"]}},
        "network": {"mode": network},
        "environment": {"allow": ["PATH", "HOME", "LANG", "DOCS_MODE", "ACME_API_TOKEN"]},
        **overrides,
    }


@attrs.frozen
class Run:
    exit_code: int
    output: str


@attrs.frozen
class Seed:
    """The seed's ``activate`` and ``run`` over one temporary workspace."""

    workspace: Path
    home: Path
    network: str = "deny"

    def activate(self, backend: Backend, config: Mapping[str, Any] | None = None) -> Sandbox:
        return activate_sandbox(
            seed_policy(self.network) if config is None else config,
            backend=backend,
            workspace=self.workspace,
            home_dir=self.home,
            env=ENV,
            settle_timeout=2.0,
        )

    def run(
        self,
        sandbox: Sandbox,
        command: str,
        *,
        cwd: Path | None = None,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> Run:
        output = bytearray()
        result = sandbox.exec(
            command,
            self.workspace if cwd is None else cwd,
            on_data=output.extend,
            timeout=timeout,
            cancel=cancel,
        )
        return Run(result.exit_code, output.decode())

    def request(self, command: str) -> ExecRequest:
        return ExecRequest(command, str(self.workspace), ".", {})

    def profile(self) -> SandboxProfile:
        return SandboxProfile(workspace=str(self.workspace), network=self.network)
