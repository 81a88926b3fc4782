"""Run shell commands in remote sandboxes from synchronous Python, under a containment policy.

    >>> from piship_remote import E2bCompatibleBackend, activate_sandbox
    >>> backend = E2bCompatibleBackend(endpoint="https://api.e2b.app", credential=read_key)
    >>> with activate_sandbox({"required": True}, backend=backend, workspace=".") as sandbox:
    ...     sandbox.exec("echo hello", on_data=sys.stdout.write)
"""

import logging

from piship_remote.backends.base import BackendResult, ExecRequest
from piship_remote.backends.e2b import E2bCompatibleBackend
from piship_remote.backends.kubernetes import KubernetesAgentSandboxBackend, runtime_command
from piship_remote.model.errors import CommandCancelled, CommandFailed, CommandTimeout, PiShipError
from piship_remote.model.policy import SandboxPolicy, SandboxProfile
from piship_remote.model.report import (
    Capabilities,
    ContainmentReport,
    NetworkDenial,
    WorkspaceReport,
    describe_containment,
)
from piship_remote.model.result import CommandResult
from piship_remote.model.transfer import FileInfo, SkippedPath, TransferSummary
from piship_remote.pool import Outcome, SandboxPool, TaskResult, TaskResults
from piship_remote.sandbox.activation import activate_sandbox
from piship_remote.sandbox.command_handle import CommandHandle
from piship_remote.sandbox.files import SandboxFiles
from piship_remote.sandbox.lifecycle import cleanup_on_signals
from piship_remote.sandbox.sandbox import ExecResult, Sandbox
from piship_remote.wire.connect import EnvelopeReader, Frame, connect_envelope

__version__ = "0.1.0"

# A library's log lines reach stderr only once the application configures logging.
logging.getLogger(__name__).addHandler(logging.NullHandler())

__all__ = [
    "BackendResult",
    "Capabilities",
    "CommandCancelled",
    "CommandFailed",
    "CommandHandle",
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
    "Outcome",
    "PiShipError",
    "Sandbox",
    "SandboxFiles",
    "SandboxPolicy",
    "SandboxPool",
    "SandboxProfile",
    "SkippedPath",
    "TaskResult",
    "TaskResults",
    "TransferSummary",
    "WorkspaceReport",
    "__version__",
    "activate_sandbox",
    "cleanup_on_signals",
    "connect_envelope",
    "describe_containment",
    "runtime_command",
]
