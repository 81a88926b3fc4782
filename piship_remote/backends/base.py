"""What every backend provides: the request it runs, the result it gives, and its protocols.

The activation layer (:mod:`piship_remote.sandbox.activation`) drives a backend through
these protocols only, so a test double or a third-party backend needs nothing more.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from piship_remote.backends.control import CommandControl, TerminalSize
from piship_remote.transport.deadline import Deadline
from piship_remote.transport.protocol import takes_keyword

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
    "takes_deadline",
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
    ends. ``pty``: the command runs on a terminal of that size (its output is
    stdout). ``control`` links a :class:`~piship_remote.CommandHandle` to the running
    command (:mod:`piship_remote.backends.control`): a backend that has
    ``controls_commands = True`` binds its input and says its pid; ``control.stdin``
    asks for an input pipe the handle writes to. A backend that cannot pass input or
    give a terminal raises ``PiShipError`` ``CONFIG_INVALID``.
    ``timeout`` stays for backends whose ``exec`` takes no ``deadline``; the
    built-in ones use the deadline they are given.
    """

    command: str
    cwd: str
    workspace_path: str = "."
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_env)
    timeout: float | None = None
    login: bool = True
    stdin: Iterable[bytes] | None = attrs.field(default=None, eq=False)
    pty: TerminalSize | None = None
    control: CommandControl | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def takes_input(self) -> bool:
        """Whether the command's stdin is a pipe: ``stdin`` given, or written through
        ``control`` (a terminal takes its input through ``control`` too)."""
        return self.stdin is not None or (self.control is not None and self.control.stdin)


@attrs.frozen
class BackendResult:
    """What a backend instance's ``exec`` returns: how the command ended, an exit code,
    or ``None`` with the signal that stopped it. (``Sandbox.exec`` makes an
    :class:`~piship_remote.ExecResult` of it, ``Sandbox.run`` and a handle's ``wait`` a
    :class:`~piship_remote.CommandResult` with the output.)"""

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
    one to a worker thread. ``controls_commands = True``: it binds a request's
    ``control`` (a pid, input, a terminal) and honours ``pty``; without it a
    handle's ``pid`` is ``None`` and ``Sandbox.start`` refuses ``stdin`` and ``pty``.
    """

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> BackendResult:
        """Run one command; raise ``CommandCancelled`` when ``cancel`` is set.

        ``deadline`` is the caller's (the same value the run engine fires): a backend
        tells the service how long is left from it. An instance whose ``exec`` has
        no ``deadline`` parameter is called without one (see :func:`takes_deadline`).
        """
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


def takes_deadline(instance: object) -> bool:
    """Whether ``instance.exec`` accepts a ``deadline`` keyword (an instance written
    before it existed does not, and is called without one)."""
    return takes_keyword(getattr(instance, "exec", None), "deadline")
