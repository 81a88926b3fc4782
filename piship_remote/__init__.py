"""Run shell commands in remote sandboxes from synchronous Python, under a containment policy.

    >>> from piship_remote import E2bCompatibleBackend, activate_sandbox
    >>> backend = E2bCompatibleBackend(endpoint="https://api.e2b.app", credential=read_key)
    >>> with activate_sandbox({"required": True}, backend=backend, workspace=".") as sandbox:
    ...     sandbox.exec("echo hello", on_data=sys.stdout.buffer.write)

Names are imported on first use, so ``import piship_remote`` stays cheap.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# A library's log lines reach stderr only once the application configures logging.
logging.getLogger(__name__).addHandler(logging.NullHandler())

_EXPORTS = {
    "activate_sandbox": "piship_remote.activation",
    "Sandbox": "piship_remote.activation",
    "ExecResult": "piship_remote.activation",
    "CommandResult": "piship_remote._output",
    "describe_containment": "piship_remote.report",
    "ContainmentReport": "piship_remote.report",
    "NetworkDenial": "piship_remote.report",
    "WorkspaceReport": "piship_remote.report",
    "Capabilities": "piship_remote.report",
    "SandboxPolicy": "piship_remote.policy",
    "SandboxProfile": "piship_remote.policy",
    "E2bCompatibleBackend": "piship_remote.backends.e2b",
    "KubernetesAgentSandboxBackend": "piship_remote.backends.kubernetes",
    "runtime_command": "piship_remote.backends.kubernetes",
    "ExecRequest": "piship_remote.backends.base",
    "BackendResult": "piship_remote.backends.base",
    "PiShipError": "piship_remote.errors",
    "CommandTimeout": "piship_remote.errors",
    "CommandCancelled": "piship_remote.errors",
    "CommandFailed": "piship_remote.errors",
    "connect_envelope": "piship_remote.connect",
    "EnvelopeReader": "piship_remote.connect",
    "Frame": "piship_remote.connect",
    "cleanup_on_signals": "piship_remote.lifecycle",
    "SandboxFiles": "piship_remote.files",
    "FileInfo": "piship_remote.transfer",
    "TransferSummary": "piship_remote.transfer",
    "SkippedPath": "piship_remote.transfer",
}

__all__ = [
    "BackendResult",
    "Capabilities",
    "CommandCancelled",
    "CommandFailed",
    "CommandResult",
    "CommandTimeout",
    "ContainmentReport",
    "E2bCompatibleBackend",
    "EnvelopeReader",
    "ExecRequest",
    "ExecResult",
    "FileInfo",
    "Frame",
    "KubernetesAgentSandboxBackend",
    "NetworkDenial",
    "PiShipError",
    "Sandbox",
    "SandboxFiles",
    "SandboxPolicy",
    "SandboxProfile",
    "SkippedPath",
    "TransferSummary",
    "WorkspaceReport",
    "__version__",
    "activate_sandbox",
    "cleanup_on_signals",
    "connect_envelope",
    "describe_containment",
    "runtime_command",
]

if TYPE_CHECKING:
    from piship_remote._output import CommandResult
    from piship_remote.activation import ExecResult, Sandbox, activate_sandbox
    from piship_remote.backends.base import BackendResult, ExecRequest
    from piship_remote.backends.e2b import E2bCompatibleBackend
    from piship_remote.backends.kubernetes import KubernetesAgentSandboxBackend, runtime_command
    from piship_remote.connect import EnvelopeReader, Frame, connect_envelope
    from piship_remote.errors import CommandCancelled, CommandFailed, CommandTimeout, PiShipError
    from piship_remote.files import SandboxFiles
    from piship_remote.lifecycle import cleanup_on_signals
    from piship_remote.policy import SandboxPolicy, SandboxProfile
    from piship_remote.report import (
        Capabilities,
        ContainmentReport,
        NetworkDenial,
        WorkspaceReport,
        describe_containment,
    )
    from piship_remote.transfer import FileInfo, SkippedPath, TransferSummary


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'piship_remote' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
