"""Activating a sandbox under a policy, and the :class:`Sandbox` façade over an active one.

    >>> backend = E2bCompatibleBackend(endpoint="https://api.e2b.app", credential=read_key)
    >>> with activate_sandbox(policy, backend=backend, workspace=".") as sandbox:
    ...     print(describe_containment(sandbox.report))
    ...     sandbox.exec("make test", on_data=sys.stdout.buffer.write, timeout=600)

Activation runs these steps in order: availability, the capability check (before
anything is created), prepare, the readiness check command, the network-denial
evidence, then the report. ``Sandbox`` turns a call into an ``ExecRequest``
(working directory, filtered environment) and hands it to the
:class:`~piship_remote.exec_engine.ExecEngine`, which runs it under the
deadline, the cancel event and Ctrl-C.

A policy that is not required and cannot be enforced gives a ``Sandbox`` with no
engine: its report says why, and every command is refused with that reason.
piship_remote never runs a command anywhere but in a sandbox.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar, Union

import attrs

from piship_remote import lifecycle
from piship_remote.backends.base import Backend, ExecRequest, Instance
from piship_remote.backends.common import exit_status
from piship_remote.backends.file_protocol import SupportsFiles
from piship_remote.backends.owned import Reattachable
from piship_remote.environment import command_environment, screen_environment
from piship_remote.errors import (
    CONFIG_INVALID,
    CREDENTIAL_REQUIRED,
    GATEWAY_UNREACHABLE,
    SANDBOX_UNAVAILABLE,
    CommandCancelled,
    CommandFailed,
    CommandTimeout,
    PiShipError,
)
from piship_remote.exec_engine import CHANNEL_BYTES, ExecEngine, reason_text
from piship_remote.exec_workers import Sink, Stream
from piship_remote.files import SandboxFiles
from piship_remote.output import OUTPUT_LIMIT, CommandResult, OutputCapture
from piship_remote.policy import SandboxPolicy, SandboxProfile, resolve_profile
from piship_remote.redact import Redactor
from piship_remote.report import (
    Capabilities,
    ContainmentReport,
    NetworkDenial,
    WorkspaceReport,
    capability_mismatch,
    claimed_guarantees,
    snapshot_workspace_report,
)
from piship_remote.sandbox_transfers import SandboxTransfers, check_sync_mode
from piship_remote.transfer import TransferSummary

__all__ = ["CHANNEL_BYTES", "CommandResult", "ExecResult", "Sandbox", "activate_sandbox"]

PathLike = Union[str, "os.PathLike[str]"]
_T = TypeVar("_T")
OnData = Callable[[bytes], None]

READY_MARKER = "piship-sandbox-ready"
PROBE_VARIABLE = "PISHIP_PROBE_UNLISTED"
CHECK_COMMAND = f"printf '%s %s\\n' {READY_MARKER} \"${{{PROBE_VARIABLE}:-unset}}\""
CHECK_OUTPUT_LIMIT = 4096
UNREACHABLE_ACTION = (
    "Check that the sandbox service is running and reachable at the address named above, then retry"
)
# Causes whose own code and action say better what to do than SANDBOX_UNAVAILABLE.
ACTIONABLE_CODES = frozenset({GATEWAY_UNREACHABLE, CREDENTIAL_REQUIRED})
UNSANDBOXED_ACTION = (
    "Fix the sandbox backend reported above; PiShip does not fall back to running unsandboxed"
)
NO_PROBE_REASON = "the backend declares no network probe to check it with"
UNCHECKED_PROBE_REASON = "piship_remote does not run the backend's network probe"


@attrs.frozen
class ExecResult:
    """How a command ended: its exit code (``128 + n`` for signal ``n``)."""

    exit_code: int


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
    ) -> None:
        self.report = report
        self.profile = profile
        self._backend = backend
        self._engine = engine
        self._env = dict(env)
        self._workspace_root = _real_path(profile.workspace)
        self._transfers: SandboxTransfers | None = None
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

    def __repr__(self) -> str:
        return f"<Sandbox {self.report.adapter} {self.report.level}>"

    def exec(
        self,
        command: str,
        cwd: PathLike | None = None,
        *,
        on_data: OnData | None = None,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run ``command`` in the sandbox and return its exit code.

        ``cwd`` is a host path inside the workspace (default: its root), mapped
        onto the remote working directory. ``on_data`` gets stdout and stderr
        chunks on the calling thread. ``timeout`` (seconds) kills the remote
        command and raises :class:`CommandTimeout`; setting ``cancel`` kills it
        and raises :class:`CommandCancelled`; Ctrl-C kills it and re-raises.
        ``env`` replaces the environment the allow list is applied to.
        """
        sink = None if on_data is None else (lambda _stream, chunk: on_data(chunk))
        return self._execute(command, cwd, sink, timeout, cancel, env)

    def run(
        self,
        command: str,
        cwd: PathLike | None = None,
        *,
        timeout: float | None = None,
        check: bool = False,
        echo: bool = False,
        cancel: threading.Event | None = None,
        env: Mapping[str, str] | None = None,
        output_limit: int | None = OUTPUT_LIMIT,
    ) -> CommandResult:
        """Run ``command`` and capture its output, like ``subprocess.run``.

        ``check=True`` raises :class:`CommandFailed` for a non-zero exit;
        ``echo=True`` also writes the output live to ``sys.stdout``/``sys.stderr``
        (in Jupyter: the running cell)::

            result = sandbox.run("python -V", check=True)
            print(result.stdout)

        Each stream keeps its last ``output_limit`` bytes (16 MiB by default,
        ``None``: all); a longer one sets ``stdout_truncated``/``stderr_truncated``
        on the result. The echo always shows everything.
        """
        capture = OutputCapture(echo=echo, limit=output_limit)
        result = self._execute(command, cwd, capture.write, timeout, cancel, env)
        outcome = capture.result(result.exit_code)
        if check and outcome.exit_code != 0:
            raise CommandFailed(outcome, redactor=self.redactor)
        return outcome

    def _execute(
        self,
        command: str,
        cwd: PathLike | None,
        sink: Sink | None,
        timeout: float | None,
        cancel: threading.Event | None,
        env: Mapping[str, str] | None,
    ) -> ExecResult:
        if cancel is not None and cancel.is_set():
            raise CommandCancelled()
        engine = self._usable_engine()
        request = ExecRequest(
            command=command,
            cwd=os.fspath(cwd) if cwd is not None else self._workspace_root,
            workspace_path=self._workspace_path(cwd),
            env=command_environment(
                self.profile.environment_allow, self._source(env), secrets=self.redactor
            ),
            timeout=timeout or None,
        )
        if timeout is not None and timeout < 0:
            raise PiShipError(CONFIG_INVALID, f"timeout must not be negative, not {timeout}")
        result = engine.run(request, sink, timeout or None, cancel, retire=True)
        return ExecResult(exit_code=exit_status(result))

    def workspace(self) -> WorkspaceReport | None:
        """The live workspace report (a snapshot's never changes); ``None`` when not enforced.

        With sync it says what the push sent and, once a pull ran, what came back.
        """
        synced = self._transfers.workspace_report() if self._transfers is not None else None
        return synced if synced is not None else self.report.workspace

    # -- files and workspace sync -------------------------------------------------------

    @property
    def files(self) -> SandboxFiles:
        """Read, write, list and copy files in the sandbox (streamed, thread-safe)."""
        return self._file_side().files

    def push(self, paths: Iterable[PathLike] | None = None) -> TransferSummary:
        """Send the workspace (or ``paths`` inside it) into the sandbox as one archive.

        Never sent: paths under ``filesystem.read.deny``, ``.gitignore``d paths (unless
        activated with ``sync_ignore=False``), symlinks leaving the workspace.
        """
        return self._file_side().push(paths)

    def pull(
        self, paths: Iterable[PathLike] | None = None, delete: bool = False
    ) -> TransferSummary:
        """Bring back what changed in the sandbox since the last push (deletions with
        ``delete=True``), only where ``filesystem.write.allow`` permits."""
        return self._file_side().pull(paths, delete=delete)

    def _attach_transfers(self, transfers: SandboxTransfers) -> None:
        self._transfers = transfers

    def _file_side(self) -> SandboxTransfers:
        self._usable_engine()
        if self._transfers is None:
            raise PiShipError(
                SANDBOX_UNAVAILABLE,
                f"the {self.report.adapter} sandbox cannot move files",
                component="files",
            )
        return self._transfers

    def dispose(self) -> None:
        """Delete the remote sandbox or claim. Idempotent, thread-safe, never waits for commands.

        Commands still running end at once with an error that mentions "disposed".
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
        self._engine.dispose()
        lifecycle.untrack(self._lifecycle)

    @property
    def id(self) -> str:
        """The remote sandbox's id: the E2B sandbox id, or the current claim's name."""
        sandbox_id = self._usable_engine().epoch()
        if sandbox_id is None:
            raise PiShipError(SANDBOX_UNAVAILABLE, "the sandbox has no id yet", component="sandbox")
        return sandbox_id

    def detach(self) -> str:
        """Let go of the sandbox without deleting it: renewals stop, it is no longer
        deleted at exit, and it lives until its lifetime ends. Returns its id, for
        ``activate_sandbox(..., attach=id)`` (from this or another process)."""
        sandbox_id = self._usable_engine().detach()
        lifecycle.untrack(self._lifecycle)
        return sandbox_id

    def _usable_engine(self) -> ExecEngine:
        if self._engine is None:
            reason = self.report.reason or "unknown reason"
            raise PiShipError(
                SANDBOX_UNAVAILABLE,
                f"No {self.report.adapter} sandbox is active ({self.report.level}): {reason}; "
                "piship_remote never runs commands unsandboxed",
                component="sandbox",
                user_action="Fix the sandbox backend, then activate the sandbox again",
                redactor=self.redactor,
            )
        self._engine.ensure_usable()
        return self._engine

    def _workspace_path(self, cwd: PathLike | None) -> str:
        if cwd is None:
            return "."
        real = _real_path(cwd)
        root = self._workspace_root
        if real == root:
            return "."
        if not real.startswith(root.rstrip(os.sep) + os.sep):
            raise PiShipError(
                CONFIG_INVALID,
                "Working directory is outside the workspace, where the "
                f"{self.report.adapter} sandbox backend cannot run commands: {os.fspath(cwd)}",
            )
        return os.path.relpath(real, root).replace(os.sep, "/")

    def _source(self, env: Mapping[str, str] | None) -> Mapping[str, str]:
        return self._env if env is None else env


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
    """
    check_sync_mode(sync)
    if not isinstance(policy, SandboxPolicy):
        policy = SandboxPolicy.from_dict(policy)
    profile = resolve_profile(policy, workspace=workspace, home_dir=home_dir)
    source = dict(os.environ if env is None else env)
    activation = _Activation(
        policy, profile, backend, source, settle_timeout, probe_timeout, sync, sync_ignore, attach
    )
    return activation.run()


@attrs.define
class _Activation:
    policy: SandboxPolicy
    profile: SandboxProfile
    backend: Backend
    env: dict[str, str]
    settle_timeout: float
    probe_timeout: float
    sync: str = "none"
    sync_ignore: bool = True
    attach: str | None = None

    def run(self) -> Sandbox:
        instance: Instance | None = None
        engine: ExecEngine | None = None
        try:
            capabilities = self._capabilities()
            instance = self._prepare()
            engine = self._engine(instance)
            report = self._checked(engine, self._report(capabilities), capabilities)
        except _Failure as failure:
            self._discard(instance, engine)
            return self._unavailable(failure)
        except BaseException:
            self._discard(instance, engine)
            raise
        sandbox = Sandbox(
            report=report, profile=self.profile, backend=self.backend, engine=engine, env=self.env
        )
        try:
            self._with_files(sandbox, instance, engine)
        except BaseException:
            sandbox.dispose()
            raise
        return sandbox

    def _with_files(self, sandbox: Sandbox, instance: Instance, engine: ExecEngine) -> None:
        """Give the sandbox its file side (when the backend moves files) and push if asked."""
        if not isinstance(instance, SupportsFiles):
            if self.sync != "none":
                raise PiShipError(
                    CONFIG_INVALID,
                    f"the {self.backend.id} sandbox backend cannot move files, so sync"
                    f" {self.sync!r} is not possible",
                    component="files",
                )
            return
        transfers = SandboxTransfers(
            instance, engine, self.profile, mode=self.sync, use_gitignore=self.sync_ignore
        )
        sandbox._attach_transfers(transfers)
        if self.sync != "none":
            transfers.push()
            sandbox.report = attrs.evolve(sandbox.report, workspace=transfers.workspace_report())

    @staticmethod
    def _discard(instance: Instance | None, engine: ExecEngine | None) -> None:
        """Dispose what a failed activation built: its engine (and threads) or instance."""
        if engine is not None:
            engine.dispose()
        elif instance is not None:
            _quietly(instance.dispose)

    def _capabilities(self) -> Capabilities:
        backend = self.backend
        availability = _call_reporting(backend.available, backend.redactor)
        if isinstance(availability, _Failure):
            raise availability
        if not availability.available:
            reason = reason_text(availability.reason or "unknown reason", backend.redactor)
            if availability.code == GATEWAY_UNREACHABLE:
                raise _Failure(
                    reason,
                    code=GATEWAY_UNREACHABLE,
                    retryable=True,
                    user_action=UNREACHABLE_ACTION,
                )
            raise _Failure(reason)
        capabilities = _call_reporting(backend.capabilities, backend.redactor)
        if isinstance(capabilities, _Failure):
            raise capabilities.within(f"the {backend.id} sandbox backend reported no capabilities")
        mismatch = capability_mismatch(capabilities, self.policy.network)
        if mismatch is not None:
            raise _Failure(
                f"the {backend.id} sandbox backend cannot enforce this policy: {mismatch}",
                user_action=_mismatch_action(mismatch, self.policy.network),
            )
        return capabilities

    def _prepare(self) -> Instance:
        if self.attach is not None:
            return self._attached(self.attach)
        instance = _call_reporting(
            lambda: self.backend.prepare(self.profile), self.backend.redactor
        )
        if isinstance(instance, _Failure):
            raise instance.within(
                f"the {self.backend.id} sandbox backend could not prepare a sandbox"
            )
        return instance

    def _attached(self, sandbox_id: str) -> Instance:
        backend = self.backend
        if not isinstance(backend, Reattachable):
            raise _Failure(f"the {backend.id} sandbox backend cannot attach to a sandbox")
        instance = _call_reporting(lambda: backend.attach(sandbox_id), backend.redactor)
        if isinstance(instance, _Failure):
            what = f"the {backend.id} sandbox backend could not attach to {sandbox_id}"
            raise _Failure(f"{what}: {instance.reason}")
        return instance

    def _report(self, capabilities: Capabilities) -> ContainmentReport:
        screened = screen_environment(
            self.profile.environment_allow, self.env, secrets=self.backend.redactor
        )
        return ContainmentReport(
            level="enforced",
            adapter=self.backend.id,
            provider=self.backend.provider,
            required=self.policy.required,
            planes=tuple(claimed_guarantees(capabilities, self.policy.network)),
            network=self.policy.network,
            verification="backend-attested",
            local_processes=False,
            warnings=(*self.profile.warnings, *screened.warnings),
            isolation="remote",
            workspace=snapshot_workspace_report(),
            execution=capabilities.execution,
        )

    def _engine(self, instance: Instance) -> ExecEngine:
        return ExecEngine(
            instance,
            adapter=self.backend.id,
            redactor=self.backend.redactor,
            settle_timeout=self.settle_timeout,
        )

    def _checked(
        self, engine: ExecEngine, report: ContainmentReport, capabilities: Capabilities
    ) -> ContainmentReport:
        """Run the readiness check; ``report`` with the network-denial evidence."""
        failure = self._readiness_failure(engine)
        if failure is not None:
            raise _Failure(f"the {self.backend.id} sandbox backend failed its check: {failure}")
        if self.policy.network != "deny":
            return report
        if capabilities.network_probe is None:
            denial = NetworkDenial(evidence="attested", probe=False, reason=NO_PROBE_REASON)
            return attrs.evolve(report, network_denial=denial)
        # piship_remote runs no connection probe: a declared one proves nothing yet.
        denial = NetworkDenial(evidence="attested", probe=True, reason=UNCHECKED_PROBE_REASON)
        warning = (
            f"network denial is attested by the backend, not verified: {UNCHECKED_PROBE_REASON}"
        )
        return attrs.evolve(report, network_denial=denial, warnings=(*report.warnings, warning))

    def _readiness_failure(self, engine: ExecEngine) -> str | None:
        """Run the readiness check command; the failure text, or ``None`` when it passed."""
        output = bytearray()

        def collect(_stream: Stream, chunk: bytes) -> None:
            if len(output) < CHECK_OUTPUT_LIMIT:
                output.extend(chunk)

        request = ExecRequest(
            command=CHECK_COMMAND,
            cwd=_real_path(self.profile.workspace),
            workspace_path=".",
            env=command_environment(
                self.profile.environment_allow,
                {**self.env, PROBE_VARIABLE: "1"},
                secrets=self.backend.redactor,
            ),
        )
        try:
            result = engine.run(request, collect, self.probe_timeout, None, retire=False)
        except (CommandTimeout, CommandCancelled):
            return "the sandbox check command timed out"
        except Exception as e:
            reason = reason_text(str(e), self.backend.redactor)
            return f"the sandbox check command failed: {reason}"
        return _verdict(exit_status(result), output.decode("utf-8", "replace"))

    def _unavailable(self, failure: _Failure) -> Sandbox:
        backend = self.backend
        reason = failure.reason
        if self.policy.required:
            raise PiShipError(
                failure.code,
                f"The distribution requires a sandbox, but it cannot be enforced: {reason}",
                component="sandbox",
                retryable=failure.retryable,
                user_action=failure.user_action,
                redactor=backend.redactor,
            )
        report = ContainmentReport(
            level="unavailable",
            adapter=backend.id,
            provider=backend.provider,
            required=False,
            planes=(),
            network=self.policy.network,
            local_processes=False,
            reason=backend.redactor.redact(reason),
            warnings=tuple(self.profile.warnings),
        )
        return Sandbox(
            report=report, profile=self.profile, backend=backend, engine=None, env=self.env
        )


class _Failure(Exception):
    """An activation step failed for ``reason`` (already redacted).

    ``code``, ``retryable`` and ``user_action`` are kept from a cause that says better
    than ``SANDBOX_UNAVAILABLE`` what to do (an unreachable service, a missing key).
    """

    def __init__(
        self,
        reason: str,
        *,
        code: str = SANDBOX_UNAVAILABLE,
        retryable: bool = False,
        user_action: str = UNSANDBOXED_ACTION,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.retryable = retryable
        self.user_action = user_action

    def within(self, context: str) -> _Failure:
        """The same failure, its reason prefixed with ``context``."""
        return _Failure(
            f"{context}: {self.reason}",
            code=self.code,
            retryable=self.retryable,
            user_action=self.user_action,
        )


def _call_reporting(step: Callable[[], _T], redactor: Redactor) -> _T | _Failure:
    """Run an activation step; an exception becomes a :class:`_Failure` with a redacted reason."""
    try:
        return step()
    except PiShipError as e:
        reason = reason_text(str(e) or type(e).__name__, redactor)
        if e.code not in ACTIONABLE_CODES:
            return _Failure(reason)
        return _Failure(
            reason,
            code=e.code,
            retryable=e.retryable,
            user_action=e.user_action or UNSANDBOXED_ACTION,
        )
    except Exception as e:
        return _Failure(reason_text(str(e) or type(e).__name__, redactor))


def _mismatch_action(mismatch: str, network: str) -> str:
    if network == "deny" and "network-deny" in mismatch:
        return (
            'Use network "allow" (piship-remote --network allow) and enforce egress rules'
            " in the cluster: this backend cannot prove a deny policy"
        )
    return UNSANDBOXED_ACTION


def _verdict(exit_code: int, output: str) -> str | None:
    lines = [line.strip() for line in output.splitlines()]
    marker = next((line for line in lines if line.startswith(f"{READY_MARKER} ")), None)
    if exit_code != 0 or marker is None:
        return f"the sandbox check command did not report back (exit {exit_code})"
    if marker != f"{READY_MARKER} unset":
        return "an unapproved environment variable reached the sandboxed command"
    return None


def _track(sandbox: Sandbox, engine: ExecEngine | None) -> int | None:
    """Register an active sandbox for deletion at exit; the disposer holds the engine only."""
    if engine is None:
        return None
    return lifecycle.track(sandbox, f"{sandbox.report.adapter} sandbox", engine.dispose)


def _real_path(path: PathLike) -> str:
    """The real path of ``path``'s nearest existing ancestor, plus the missing tail."""
    absolute = os.path.abspath(os.fspath(path))
    tail: list[str] = []
    current = absolute
    while not os.path.exists(current):
        parent = os.path.dirname(current)
        if parent == current:
            break
        tail.append(os.path.basename(current))
        current = parent
    return os.path.join(os.path.realpath(current), *reversed(tail))


def _quietly(action: Callable[[], object]) -> None:
    try:
        action()
    except Exception:
        pass
