"""The :class:`Sandbox` façade over an active sandbox (:func:`activate_sandbox` makes one).

    >>> with activate_sandbox(policy, backend=backend, workspace=".") as sandbox:
    ...     sandbox.exec("make test", on_data=sys.stdout.write, timeout=600)

``Sandbox`` turns a call into an ``ExecRequest`` (working directory, filtered
environment) and hands it to the :class:`~piship_remote.sandbox._exec_engine.ExecEngine`,
which runs it under the deadline, the cancel event and Ctrl-C; its files and workspace
sync go through its :class:`~piship_remote.sandbox._sandbox_transfers.SandboxTransfers`.

A policy that is not required and cannot be enforced gives a ``Sandbox`` with no
engine: its report says why, and every command is refused with that reason.
piship_remote never runs a command anywhere but in a sandbox.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping
from typing import TypeVar, Union

import attrs

from piship_remote.backends._common import exit_status
from piship_remote.backends.base import Backend, ExecRequest
from piship_remote.backends.control import CommandControl, TerminalSize
from piship_remote.model.display import html_table
from piship_remote.model.environment import screen_environment
from piship_remote.model.errors import (
    CommandCancelled,
    CommandFailed,
    CommandTimeout,
    ConfigInvalid,
    PiShipError,
    SandboxUnavailable,
)
from piship_remote.model.output_gap import nothing_missing
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.model.report import (
    ContainmentReport,
    WorkspaceReport,
)
from piship_remote.model.result import CommandResult
from piship_remote.model.transfer import TransferSummary
from piship_remote.sandbox import lifecycle
from piship_remote.sandbox._exec_engine import Command, ExecEngine, command_line
from piship_remote.sandbox._exec_workers import Sink
from piship_remote.sandbox._output import NO_EXIT, OUTPUT_LIMIT, DataSink, OnData, OutputCapture
from piship_remote.sandbox._sandbox_telemetry import SandboxTelemetry
from piship_remote.sandbox._sandbox_transfers import SandboxTransfers
from piship_remote.sandbox._workspace import real_path, workspace_relative
from piship_remote.sandbox.command_handle import CommandHandle
from piship_remote.sandbox.files import SandboxFiles
from piship_remote.telemetry.logs import log_environment_warnings
from piship_remote.transport.deadline import Deadline, timeout_deadline

__all__ = ["ExecResult", "Sandbox"]

PathLike = Union[str, "os.PathLike[str]"]
_T = TypeVar("_T")


@attrs.frozen
class ExecResult:
    """What ``Sandbox.exec`` returns: how the command ended, its exit code (``128 + n`` for
    signal ``n``); its output went to ``on_data``. (``Sandbox.run`` and a handle's ``wait``
    give a :class:`CommandResult`, with the output; a backend instance a ``BackendResult``.)

    ``missing``: per stream, the bytes that may be missing because the command's stream
    dropped and the output written meanwhile could not be replayed (0: nothing lost;
    ``-1``: an unknown number), as ``CommandResult.missing``; ``on_data`` got an
    :class:`OutputGap` where they are."""

    exit_code: int
    missing: dict[str, int] = attrs.field(factory=nothing_missing)


class Sandbox:
    """An active sandbox: run commands in it, read its report, dispose of it.

    Returned by :func:`activate_sandbox`; a context manager that disposes on exit::

        with activate_sandbox(policy, backend=backend, workspace=ws) as sandbox:
            result = sandbox.exec("pytest -q", on_data=print_bytes, timeout=900)

    Without an engine (an optional sandbox that could not be enforced) it runs nothing.
    """

    def __init__(
        self,
        *,
        report: ContainmentReport,
        profile: SandboxProfile,
        backend: Backend,
        engine: ExecEngine | None,
        env: Mapping[str, str],
        telemetry: SandboxTelemetry,
        transfers: SandboxTransfers | None = None,
    ) -> None:
        self.report = report
        self.profile = profile
        self._backend = backend
        self._engine = engine
        self._env = dict(env)
        self._logged_warnings: set[str] = set()
        self._workspace_root = real_path(profile.workspace)
        self._transfers = transfers
        self._telemetry = telemetry
        self._detached = False
        self._lifecycle = _track(self, engine)

    @property
    def redactor(self) -> Redactor:
        """The backend's secret registry: ``sandbox.redactor.redact(text)`` hides every
        credential and registered secret, in each encoding, before ``text`` is shown."""
        return self._backend.redactor

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.dispose()

    @property
    def state(self) -> str:
        """``"active"``, ``"retired"`` (broken: it runs no more commands), ``"disposed"``,
        ``"detached"``, or ``"unavailable"`` (an optional policy that could not be enforced)."""
        if self._engine is None:
            return "unavailable"
        return "detached" if self._detached else self._engine.state

    def _shown_id(self) -> str:
        engine = self._engine
        sandbox_id = engine.epoch() if engine is not None else None
        return sandbox_id or "(no id)"

    def __repr__(self) -> str:
        return f"<Sandbox {self._shown_id()} {self.report.adapter} {self.state}>"

    def _repr_html_(self) -> str:
        rows = [
            ("id", self._shown_id()),
            ("backend", self.report.adapter),
            ("state", self.state),
            ("containment", self.report.level),
            ("network", self.report.network),
        ]
        return html_table(None, rows, caption="Sandbox")

    def exec(
        self,
        command: Command,
        cwd: PathLike | None = None,
        *,
        on_data: OnData | None = None,
        timeout: float | Deadline | None = None,
        cancel: threading.Event | None = None,
        env: Mapping[str, str] | None = None,
        resumable: bool = False,
    ) -> ExecResult:
        """Run ``command`` in the sandbox and return its exit code.

        ``command`` is a shell command line, or a list of arguments quoted one by one
        as :func:`shlex.join` does (``["pytest", "-k", "a b"]``).
        ``cwd`` is a host path inside the workspace (default: its root), mapped
        onto the remote working directory. ``on_data`` gets stdout and stderr
        chunks on the calling thread: a callable given the bytes, or a writable stream
        (``sys.stdout``, a file) or its ``write`` (``sys.stdout.write``, which works in a
        notebook), which get text for a text stream, decoded as UTF-8. ``timeout``
        (seconds, more than 0; ``None``: no limit; 0 or less is ``CONFIG_INVALID``) kills
        the remote command and raises :class:`CommandTimeout`; setting ``cancel`` kills it
        and raises :class:`CommandCancelled`; Ctrl-C kills it and re-raises.
        ``timeout`` may also be a :class:`~piship_remote.transport.deadline.Deadline`,
        handed down as it is (as a pool hands down its task's). ``env`` replaces the
        environment the allow list is applied to.

        A command whose stream drops is followed again (never started again); output
        written meanwhile is replayed where the service keeps it (the local service), or,
        with ``resumable=True``, read back from a spool file the command also writes in
        the sandbox. What could not be replayed reaches ``on_data`` as an
        :class:`~piship_remote.OutputGap` chunk.

        Raises:
            CommandTimeout: ``timeout`` passed; the remote command was killed.
            CommandCancelled: ``cancel`` was set; the remote command was killed.
            ConfigInvalid: a bad argument (``cwd`` outside the workspace, ``timeout`` of 0 or less,
                an empty command).
            SandboxUnavailable: no sandbox is active, it was disposed or retired, or it failed under
                the command (the message says whether the command may have run).
            GatewayUnreachable: the service could not be reached.
            PiShipError: any other failure the service reports, with its code.
        """
        if on_data is None:
            return self._execute(command, cwd, None, timeout, cancel, env, resumable=resumable)
        sink = DataSink(on_data)
        try:
            return self._execute(
                command, cwd, sink.write, timeout, cancel, env, resumable=resumable
            )
        finally:
            sink.close()

    def run(
        self,
        command: Command,
        cwd: PathLike | None = None,
        *,
        timeout: float | Deadline | None = None,
        check: bool = False,
        echo: bool = False,
        cancel: threading.Event | None = None,
        env: Mapping[str, str] | None = None,
        output_limit: int | None = OUTPUT_LIMIT,
        stdin: Iterable[bytes] | None = None,
        resumable: bool = False,
    ) -> CommandResult:
        """Run ``command`` and capture its output, like ``subprocess.run``.

        ``check=True`` raises :class:`CommandFailed` for a non-zero exit;
        ``echo=True`` also writes the output live to ``sys.stdout``/``sys.stderr``
        (in Jupyter: the running cell)::

            result = sandbox.run("python -V", check=True)
            print(result.stdout)

        Each stream keeps its last ``output_limit`` bytes (16 MiB by default,
        ``None``: all); a longer one sets ``stdout_truncated``/``stderr_truncated``
        on the result. The echo always shows everything, byte for byte where the
        stream has a binary buffer (a file or a pipe).

        ``stdin`` is the command's standard input, written chunk by chunk as the
        iterable yields them and closed when it ends (E2B-compatible services; the
        agent-sandbox router refuses it with ``CONFIG_INVALID``).

        ``resumable=True``: as for :meth:`exec`; ``missing`` on the result says how many
        bytes of each stream may be missing after a dropped stream (0: none).

        A :class:`CommandTimeout` or ``PiShipError`` it raises carries what the command
        wrote until then as ``error.output`` (a ``CommandResult`` whose ``exit_code`` is
        -1: the command did not exit on its own).

        Raises:
            CommandFailed: ``check=True`` and the command exited non-zero.
            CommandTimeout: ``timeout`` passed; the remote command was killed.
            CommandCancelled: ``cancel`` was set; the remote command was killed.
            ConfigInvalid: a bad argument (``cwd`` outside the workspace, ``timeout`` of 0 or less,
                an empty command).
            SandboxUnavailable: no sandbox is active, it was disposed or retired, or it failed under
                the command (the message says whether the command may have run).
            GatewayUnreachable: the service could not be reached.
            PiShipError: any other failure the service reports, with its code.
        """
        capture = OutputCapture(echo=echo, limit=output_limit)
        try:
            result = self._execute(
                command, cwd, capture.write, timeout, cancel, env, stdin, resumable=resumable
            )
        except (CommandTimeout, PiShipError) as error:
            error.output = capture.result(NO_EXIT)  # what it wrote before it was stopped
            raise
        outcome = capture.result(result.exit_code)
        if check and outcome.exit_code != 0:
            raise CommandFailed(outcome, redactor=self.redactor)
        return outcome

    def start(
        self,
        command: Command,
        cwd: PathLike | None = None,
        *,
        env: Mapping[str, str] | None = None,
        stdin: bool = False,
        timeout: float | Deadline | None = None,
        pty: bool | tuple[int, int] = False,
        resumable: bool = False,
    ) -> CommandHandle:
        """Start ``command`` and return at once with its :class:`CommandHandle`::

            handle = sandbox.start("cat", stdin=True)
            handle.send_stdin("hi\\n"); handle.close_stdin()
            for stream, chunk in handle: ...
            print(handle.wait().stdout)

        ``stdin=True``: its input is a pipe written with ``send_stdin`` (else it reads end
        of file). ``pty=True``: it runs on an 80x24 terminal (``pty=(cols, rows)``: of that
        size; ``resize`` changes it), its output all on ``stdout``. ``timeout`` kills it
        and makes ``wait`` raise :class:`CommandTimeout`. A service that cannot pass input
        or give a terminal (the agent-sandbox router) refuses with ``PiShipError``
        ``CONFIG_INVALID``. ``resumable=True``: as for :meth:`exec` (not with ``pty``).

        Raises:
            ConfigInvalid: a bad argument, or ``stdin``/``pty`` on a service that cannot give them.
            SandboxUnavailable: no sandbox is active, or it was disposed or retired.
        """
        engine = self._usable_engine()
        if (stdin or pty) and not engine.controls_commands:
            what = "give a command a terminal" if pty else "pass standard input to a command"
            raise ConfigInvalid(
                f"the {self.report.adapter} sandbox backend cannot {what}",
                user_action="Use an E2B-compatible backend, or run the command without it",
            )
        control = CommandControl(stdin=stdin)
        line = command_line(command)
        request = self._request(line, cwd, env, control=control, pty=pty, resumable=resumable)
        deadline = timeout_deadline(timeout)
        handle = CommandHandle(engine, request, deadline, output_limit=OUTPUT_LIMIT)
        return self._telemetry.started(handle)

    def _execute(
        self,
        command: Command,
        cwd: PathLike | None,
        sink: Sink | None,
        timeout: float | Deadline | None,
        cancel: threading.Event | None,
        env: Mapping[str, str] | None,
        stdin: Iterable[bytes] | None = None,
        *,
        resumable: bool = False,
    ) -> ExecResult:
        """``exec`` and ``run``: run on this thread, output to ``sink``; no handle needed."""
        if cancel is not None and cancel.is_set():
            command_line(command)
            raise CommandCancelled()
        line = command_line(command)
        engine = self._usable_engine()
        request = self._request(line, cwd, env, stdin=stdin, resumable=resumable)
        deadline = timeout_deadline(timeout)  # the command's one deadline, handed down as it is
        # The caller's cancel becomes the command's one token, here, once.
        with self._telemetry.command() as span, engine.cancel_token(cancel) as token:
            result = engine.run(request, sink, deadline, token, retire=True)
            return ExecResult(span.exit_code(exit_status(result)), dict(result.missing))

    def _request(
        self,
        line: str,
        cwd: PathLike | None,
        env: Mapping[str, str] | None,
        *,
        stdin: Iterable[bytes] | None = None,
        control: CommandControl | None = None,
        pty: bool | tuple[int, int] = False,
        resumable: bool = False,
    ) -> ExecRequest:
        """The request for the command ``line`` (checked by ``command_line``) on the usable
        engine the caller holds."""
        return ExecRequest(
            command=line,
            cwd=os.fspath(cwd) if cwd is not None else self._workspace_root,
            workspace_path=self._workspace_path(cwd),
            env=self._command_env(env),
            stdin=stdin,
            pty=_terminal_size(pty),
            control=control,
            resumable=resumable,
        )

    def workspace(self) -> WorkspaceReport | None:
        """The live workspace report (a snapshot's never changes); ``None`` when not enforced.

        With sync it says what the push sent and, once a pull ran, what came back.
        """
        synced = self._transfers.workspace_report() if self._transfers is not None else None
        return synced if synced is not None else self.report.workspace

    # -- files and workspace sync -------------------------------------------------------

    @property
    def files(self) -> SandboxFiles:
        """Read, write, list and copy files in the sandbox (streamed, thread-safe); each
        operation takes ``timeout`` and ``cancel`` as :meth:`exec` does."""
        return self._file_side().files

    def push(
        self,
        paths: Iterable[PathLike] | None = None,
        *,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> TransferSummary:
        """Send the workspace (or ``paths`` inside it) into the sandbox as one archive.

        Never sent: paths under ``filesystem.read.deny``, ``.gitignore``d paths (unless
        activated with ``sync_ignore=False``), symlinks leaving the workspace.
        ``timeout`` (seconds) stops the transfer and raises :class:`CommandTimeout`;
        setting ``cancel`` stops it and raises :class:`CommandCancelled`; ``dispose()``
        stops it with an error that mentions "disposed".

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            ConfigInvalid: a path outside the workspace.
            SandboxUnavailable: the sandbox cannot move files, is gone or disposed, or the transfer
                was cut off.
            PiShipError: any other failure the service reports, with its code.
        """
        return self._file_side().push(paths, timeout=timeout, cancel=cancel)

    def pull(
        self,
        paths: Iterable[PathLike] | None = None,
        delete: bool = False,
        *,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> TransferSummary:
        """Bring back what changed in the sandbox since the last push (deletions with
        ``delete=True``), only where ``filesystem.write.allow`` permits; ``timeout`` and
        ``cancel`` as for :meth:`push`.

        Raises:
            CommandTimeout: ``timeout`` passed.
            CommandCancelled: ``cancel`` was set.
            ConfigInvalid: a path outside the workspace.
            FileWriteFailed: a file could not be written on this host.
            SandboxUnavailable: the sandbox cannot move files, is gone or disposed, or the transfer
                was cut off.
            PiShipError: any other failure the service reports, with its code.
        """
        return self._file_side().pull(paths, delete=delete, timeout=timeout, cancel=cancel)

    def _file_side(self) -> SandboxTransfers:
        self._usable_engine()
        if self._transfers is None:
            raise SandboxUnavailable(
                f"the {self.report.adapter} sandbox cannot move files",
                component="files",
            )
        return self._transfers

    def dispose(self) -> None:
        """Delete the remote sandbox or claim. Idempotent, thread-safe, never waits for commands.

        Commands and file operations still running end at once with an error that
        mentions "disposed".
        With ``sync="push-pull"`` the first call pulls the workspace back first (a failure
        is logged, not raised); concurrent calls return at once.
        """
        if self._engine is None:
            lifecycle.untrack(self._lifecycle)
            return
        if self._transfers is not None:
            if not self._transfers.begin_dispose():
                return  # the first call pulls (push-pull) and then disposes
            self._transfers.at_dispose()
            self._transfers.stop()
        self._engine.dispose()
        lifecycle.untrack(self._lifecycle)
        self._telemetry.let_go("deleted")

    @property
    def id(self) -> str:
        """The remote sandbox's id: the E2B sandbox id, or the current claim's name.

        Raises:
            SandboxUnavailable: no sandbox is active, or it has no id yet.
        """
        sandbox_id = self._usable_engine().epoch()
        if sandbox_id is None:
            raise SandboxUnavailable("the sandbox has no id yet", component="sandbox")
        return sandbox_id

    def url(self, port: int) -> str:
        """The address at which a server listening on ``port`` inside the sandbox is reached
        from this host by any HTTP client (``http://127.0.0.1:<p>`` on the local service: a
        loopback listener of its own for the port).

        ``PiShipError`` ``CONFIG_INVALID`` for a port outside 1-65535, or on a backend that
        does not route a sandbox's ports (Kubernetes agent-sandbox).

        Raises:
            ConfigInvalid: a port outside 1-65535, or a backend that does not route ports.
            SandboxUnavailable: no sandbox is active, or it was disposed or retired.
        """
        return self._usable_engine().url(port)

    def detach(self) -> str:
        """Let go of the sandbox without deleting it: renewals stop, it is no longer
        deleted at exit, and it lives until its lifetime ends. Returns its id, for
        ``activate_sandbox(..., attach=id)`` (from this or another process).

        Raises:
            SandboxUnavailable: no sandbox is active, or it was disposed or retired.
        """
        sandbox_id = self._usable_engine().detach()
        self._detached = True
        if self._transfers is not None:
            self._transfers.stop()  # its file operations end too, and their threads
        lifecycle.untrack(self._lifecycle)
        self._telemetry.let_go("detached")
        return sandbox_id

    def _usable_engine(self) -> ExecEngine:
        if self._engine is None:
            reason = self.report.reason or "unknown reason"
            raise SandboxUnavailable(
                f"No {self.report.adapter} sandbox is active ({self.report.level}): {reason}; "
                "piship_remote never runs commands unsandboxed",
                component="sandbox",
                user_action="Fix the sandbox backend, then activate the sandbox again",
                redactor=self.redactor,
            )
        self._engine.ensure_usable()
        return self._engine

    def _workspace_path(self, cwd: PathLike | None) -> str:
        return workspace_relative(cwd, self._workspace_root, self.report.adapter)

    def _command_env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """The allow-listed environment; a given ``env``'s dropped names are logged once."""
        screened = screen_environment(
            self.profile.environment_allow,
            self._env if env is None else env,
            secrets=self.redactor,
            name_unlisted=env is not None,
        )
        if env is not None:
            fresh = tuple(w for w in screened.warnings if w not in self._logged_warnings)
            self._logged_warnings.update(fresh)
            log_environment_warnings(fresh)
        return screened.env


def _terminal_size(pty: bool | tuple[int, int]) -> TerminalSize | None:
    if pty is True:
        return TerminalSize()
    if pty is False:
        return None
    cols, rows = pty
    return TerminalSize(cols, rows)


def _track(sandbox: Sandbox, engine: ExecEngine | None) -> int | None:
    """Register an active sandbox for deletion at exit; the disposer holds the engine only."""
    if engine is None:
        return None
    return lifecycle.track(sandbox, f"{sandbox.report.adapter} sandbox", engine.dispose)
