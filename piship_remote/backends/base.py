"""The backend contract: what a backend and its instance provide, and the values they pass.

The layers above (:mod:`piship_remote.sandbox`, :mod:`piship_remote.pool`, the command
line) drive a backend through these protocols only, so a test double or another
backend needs nothing more. A backend is a :class:`Backend`; what its ``prepare``
returns is an :class:`Instance`, whose ``exec`` runs one :class:`ExecRequest` and
returns a :class:`BackendResult`. The run engine always hands ``exec`` one
:class:`~piship_remote.transport.deadline.Deadline` and one cancel token; a caller that
calls an instance directly may leave both out.

An instance declares its capabilities as attributes (read as they are, never
guessed): ``cancels_promptly`` and ``controls_commands``. What only some backends can
do is an optional protocol, checked with ``isinstance``:

- :class:`ServesPorts` (an instance): ``url(port)``, a sandbox's server from this host;
- :class:`SupportsFiles` (an instance): ``files()``, its :class:`RemoteFiles`;
- :class:`Detachable` (an instance): ``detach()``, let go without deleting;
- :class:`Reattachable` (a backend): attach to, list and delete what it created;
- :class:`Labelled` (a backend): ``prepare(profile, labels=...)``.

A running command's input (stdin, a terminal's size) is a
:class:`~piship_remote.backends.control.CommandInput`, bound to the request's
``control`` by an instance that ``controls_commands``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from piship_remote.backends._owned import OwnedSandbox
from piship_remote.backends.control import CommandControl, CommandInput, TerminalSize
from piship_remote.model.output_gap import nothing_missing
from piship_remote.model.transfer import FileInfo
from piship_remote.transport.deadline import Deadline

if TYPE_CHECKING:
    from piship_remote.model.policy import SandboxProfile
    from piship_remote.model.redact import Redactor
    from piship_remote.model.report import Capabilities

__all__ = [
    "Availability",
    "Backend",
    "BackendResult",
    "ChunkSink",
    "CommandInput",
    "Detachable",
    "ExecRequest",
    "Instance",
    "Labelled",
    "OutputCallback",
    "Reattachable",
    "RemoteFiles",
    "ServesPorts",
    "SupportsFiles",
]

OutputCallback = Callable[[bytes], None]
ChunkSink = Callable[[bytes], None]


def _frozen_env(value: Mapping[str, str]) -> Mapping[str, str]:
    return dict(value)


@attrs.frozen
class ExecRequest:
    """One command for a backend instance.

    ``cwd`` is the host path the caller asked for (already checked to lie in the
    workspace); ``workspace_path`` is the same place relative to the workspace root
    (``"."`` for the root, ``/``-separated), which the backend maps onto its remote
    working directory. ``env`` is already filtered: send it as is. The command's
    time limit is not part of the request: ``exec`` is handed its ``deadline``.
    ``login=False`` is for the library's own helper
    commands (tar, find): a backend that starts commands in a login shell runs
    these with ``/bin/sh -c`` instead, so no startup file of the sandbox's can
    replace the tools they use. ``stdin``, when given, is the command's standard
    input: its chunks are written as they come and the input is closed when it
    ends. ``pty``: the command runs on a terminal of that size (its output is
    stdout). ``control`` links a :class:`~piship_remote.CommandHandle` to the running
    command (:mod:`piship_remote.backends.control`): a backend that has
    ``controls_commands = True`` binds its input and says its pid; ``control.stdin``
    asks for an input pipe the handle writes to. A backend that cannot pass input or
    give a terminal raises ``PiShipError`` ``CONFIG_INVALID``. ``resumable``: the
    command's output is also spooled to files in the sandbox, read back by offset if its
    stream drops on a service that replays nothing (a backend that cannot follow a
    command again ignores it).
    """

    command: str
    cwd: str
    workspace_path: str = "."
    env: Mapping[str, str] = attrs.field(factory=dict, converter=_frozen_env)
    login: bool = True
    stdin: Iterable[bytes] | None = attrs.field(default=None, eq=False)
    pty: TerminalSize | None = None
    control: CommandControl | None = attrs.field(default=None, eq=False, repr=False)
    resumable: bool = False

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
    missing: dict[str, int] = attrs.field(factory=nothing_missing)
    """Per stream, the bytes that may be missing after a dropped stream (``-1``: unknown)."""


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

    ``cancels_promptly``: a promise that a call whose ``cancel`` is set returns within
    milliseconds. The main thread then makes its calls itself, with Ctrl-C turned into
    that cancel, instead of handing each one to a worker thread.
    ``controls_commands``: it binds a request's ``control`` (a pid, input, a terminal)
    and honours ``pty``; without it a handle's ``pid`` is ``None`` and
    ``Sandbox.start`` refuses ``stdin`` and ``pty``.
    """

    cancels_promptly: bool
    controls_commands: bool

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
        tells the service how long is left from it (``None``: no limit).
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
class Detachable(Protocol):
    """An instance that can let go of its sandbox without deleting it."""

    def detach(self) -> str:
        """Stop using the sandbox, leave it running; its id, to attach to later."""
        ...


@runtime_checkable
class RemoteFiles(Protocol):
    """File operations on one remote sandbox; thread-safe beside running commands.

    Paths are absolute remote paths (the façade resolves relative ones against
    :meth:`working_directory`). Every call takes an optional ``cancel`` event and
    raises ``CommandCancelled`` promptly when it is set, and an optional ``deadline``
    that bounds each of its requests; a missing path is ``FileNotFound``, a write the
    sandbox refused ``FileWriteFailed``, and the sandbox stays usable. Data moves in
    chunks, so memory stays bounded whatever the file's size.
    """

    def working_directory(
        self, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> str:
        """The absolute remote directory that relative paths (and the workspace) map to."""
        ...

    def stat(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> FileInfo | None:
        """The entry at ``path`` (a symlink itself, not its target), or ``None`` if missing."""
        ...

    def list_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> list[FileInfo]:
        """The entries directly in the directory ``path``, in any order."""
        ...

    def make_dir(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> bool:
        """Create ``path`` and its parents; ``False`` when it already was a directory."""
        ...

    def remove(
        self, path: str, *, cancel: threading.Event | None = None, deadline: Deadline | None = None
    ) -> None:
        """Remove a file, or a directory recursively; a missing path is not an error."""
        ...

    def write(
        self,
        path: str,
        chunks: Iterable[bytes],
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> FileInfo:
        """Stream ``chunks`` into the file ``path`` (parents created, replaced if present)."""
        ...

    def read(
        self,
        path: str,
        sink: ChunkSink,
        *,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> int:
        """Stream the file ``path`` into ``sink`` chunk by chunk; returns the byte count."""
        ...


@runtime_checkable
class SupportsFiles(Protocol):
    """An instance that can move files."""

    def files(self) -> RemoteFiles:
        """The file operations of this instance's sandbox."""
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


@runtime_checkable
class Reattachable(Protocol):
    """A backend that can attach to, list and delete the sandboxes it created."""

    def attach(self, sandbox_id: str) -> Instance:
        """An instance for the existing sandbox or claim ``sandbox_id`` (it must be ours)."""
        ...

    def list_owned(self) -> Sequence[OwnedSandbox]:
        """Every live sandbox or claim marked as created by this library."""
        ...

    def delete_owned(self, sandbox_id: str) -> None:
        """Delete one of :meth:`list_owned`'s sandboxes."""
        ...


@runtime_checkable
class Labelled(Protocol):
    """A backend that puts labels on what it creates (E2B metadata, claim labels)."""

    def prepare(
        self, profile: SandboxProfile, *, labels: Mapping[str, str] | None = None
    ) -> Instance:
        """Create a sandbox for ``profile`` that carries ``labels``."""
        ...
