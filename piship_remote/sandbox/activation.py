"""Activating a sandbox under a policy: :func:`activate_sandbox`.

    >>> backend = E2bCompatibleBackend(endpoint="https://api.e2b.app", credential=read_key)
    >>> with activate_sandbox(policy, backend=backend, workspace=".") as sandbox:
    ...     print(describe_containment(sandbox.report))
    ...     sandbox.exec("make test", on_data=sys.stdout.write, timeout=600)

Activation (:mod:`~piship_remote.sandbox._activation_steps`) runs these steps in order:
availability, the capability check (before anything is created), prepare, the readiness
check command, the network-denial evidence, then the report, and gives the
:class:`~piship_remote.sandbox.sandbox.Sandbox` over the result (this module re-exports
it with the values its methods return).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from piship_remote.backends.base import Backend
from piship_remote.model.policy import SandboxPolicy, resolve_profile
from piship_remote.model.result import CommandResult
from piship_remote.sandbox._activation_steps import Activation
from piship_remote.sandbox._exec_engine import CHANNEL_BYTES
from piship_remote.sandbox._sandbox_transfers import check_sync_mode
from piship_remote.sandbox._workspace import check_workspace
from piship_remote.sandbox.command_handle import CommandHandle
from piship_remote.sandbox.sandbox import ExecResult, PathLike, Sandbox
from piship_remote.telemetry import Telemetry

__all__ = [
    "CHANNEL_BYTES",
    "CommandHandle",
    "CommandResult",
    "ExecResult",
    "Sandbox",
    "activate_sandbox",
]


def activate_sandbox(
    policy: SandboxPolicy | Mapping[str, Any],
    *,
    backend: Backend,
    workspace: PathLike,
    home_dir: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    settle_timeout: float = 5.0,
    probe_timeout: float = 60.0,
    sync: str = "none",
    sync_ignore: bool = True,
    attach: str | None = None,
) -> Sandbox:
    """Prepare a sandbox on ``backend`` that enforces ``policy`` and check it works.

    A required policy that cannot be enforced raises ``PiShipError`` with code
    ``SANDBOX_UNAVAILABLE``; an optional one gives a sandbox whose report has
    level ``unavailable`` and whose ``exec`` refuses to run anything.

    ``sync``: ``"none"`` (the remote working directory starts as the image has it),
    ``"push"`` (the workspace is pushed once, after the readiness check) or
    ``"push-pull"`` (also pulled back at ``dispose()``); ``sync_ignore=False`` pushes
    ``.gitignore``d paths too. A failed push disposes the sandbox and raises.
    ``attach`` is the id of an existing sandbox (from :meth:`Sandbox.detach`) to use
    instead of creating one; on Kubernetes only a claim labelled as this library's.

    Raises:
        ConfigInvalid: a bad policy, workspace or option.
        SandboxUnavailable: ``required`` and the backend cannot give a sandbox that enforces the
            policy (an optional one gives a sandbox that says why instead).
        CredentialRequired: the service needs a credential and none was given.
        PiShipError: any other failure, with its code (``SandboxUnavailable`` unless the reason has
            one of its own).
    """
    check_sync_mode(sync)
    if not isinstance(policy, SandboxPolicy):
        policy = SandboxPolicy.from_dict(policy)
    check_workspace(workspace)
    profile = resolve_profile(policy, workspace=workspace, home_dir=home_dir)
    source = dict(os.environ if env is None else env)
    activation = Activation(
        policy,
        profile,
        backend,
        source,
        settle_timeout,
        probe_timeout,
        sync,
        sync_ignore,
        attach,
        env_given=env is not None,
        telemetry=Telemetry.load(backend.id, backend.redactor),
    )
    return activation.run()
