"""What every backend provides: the request it runs, the result it gives, and its protocols.

The activation layer (:mod:`piship_remote.sandbox.activation`) drives a backend through
these protocols only, so a test double or a third-party backend needs nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    from piship_remote.model.policy import SandboxProfile
    from piship_remote.model.redact import Redactor
    from piship_remote.model.report import Capabilities

__all__ = [
    "Availability",
    "Backend",
    "BackendResult",
    "ExecRequest",
    "Instance",
    "OutputCallback",
    "ServesPorts",
]

OutputCallback = Callable[[bytes], None]


def _frozen_env(value: Mapping[str, str]) -> Mapping[str, str]:
    return dict(value)


@attrs.frozen
class ExecRequest:
    """One command for a backend instance.

    ``cwd`` is the host path the caller asked for (already checked to lie in the
    workspace); ``workspace_path`` is the same place relative to the workspace root
    (``"."`` for the root, ``/``-separated), which the backend maps onto its remote
    working directory. ``env`` is already filtered: send it as is. ``timeout`` is
    the caller's deadline in seconds, if any: the activation layer enforces it, and
    a backend may also tell the service so that a lost client cannot leave the
    command running forever. ``login=False`` is for the library's own helper
    commands (tar, find): a backend that starts commands in a login shell runs
    these with ``/bin/sh -c`` instead, so no startup file of the sandbox's can
    replace the tools they use. ``stdin``, when given, is the command's standard
    input: its chunks are written as they come and the input is closed when it
    ends; a backend that cannot pass input raises ``PiShipError`` ``CONFIG_INVALID``.
    """

    command: str
    cwd: str
    workspace_path: str = "."
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_env)
    timeout: float | None = None
    login: bool = True
    stdin: Iterable[bytes] | None = attrs.field(default=None, eq=False)


@attrs.frozen
class BackendResult:
    """How a command ended: an exit code, or ``None`` with the signal that stopped it."""

    exit_code: int | None
    signal: str | None = None


@attrs.frozen
class Availability:
    """Whether a service can be used now; ``reason`` says why not, ``code`` how to act.

    ``code`` is an error code when the cause has its own (``GATEWAY_UNREACHABLE`` for
    a service that does not answer at all, ``CREDENTIAL_REQUIRED`` for a missing key),
    else ``None``; ``user_action`` says what to do, when the cause knows.
    """

    available: bool
    reason: str | None = None
    code: str | None = None
    user_action: str | None = None


@runtime_checkable
class Instance(Protocol):
    """A prepared sandbox (E2B) or claim manager (Kubernetes).

    An instance may also have ``cancels_promptly = True``: a promise that a call
    whose ``cancel`` is set returns within milliseconds. The main thread then makes
    its calls itself, with Ctrl-C turned into that cancel, instead of handing each
    one to a worker thread.
    """

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> BackendResult:
        """Run one command; raise ``CommandCancelled`` when ``cancel`` is set."""
        ...

    def epoch(self) -> str | None:
        """An identifier that changes when the remote sandbox is replaced."""
        ...

    def dispose(self) -> None:
        """Delete the remote sandbox or claim; idempotent and thread-safe."""
        ...


@runtime_checkable
class ServesPorts(Protocol):
    """An instance whose sandbox's ports are reached from this host through its service."""

    def url(self, port: int) -> str:
        """The address of ``port`` inside the sandbox (``ValueError`` for no valid port)."""
        ...


@runtime_checkable
class Backend(Protocol):
    """A kind of remote sandbox service."""

    id: str
    provider: str
    redactor: Redactor

    def available(self) -> Availability:
        """Whether the service answers; never raises for an unreachable service."""
        ...

    def capabilities(self) -> Capabilities:
        """What this backend enforces."""
        ...

    def prepare(self, profile: SandboxProfile) -> Instance:
        """Create a sandbox (or a claim manager) for ``profile``."""
        ...
