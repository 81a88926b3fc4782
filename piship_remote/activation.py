"""Activating a sandbox under a policy, and the governed ``exec`` of an active one.

    >>> backend = E2bCompatibleBackend(endpoint="https://api.e2b.app", credential=read_key)
    >>> with activate_sandbox(policy, backend=backend, workspace=".") as sandbox:
    ...     print(describe_containment(sandbox.report))
    ...     sandbox.exec("make test", on_data=sys.stdout.buffer.write, timeout=600)

Activation follows ``reference/activation-and-report.md`` §1: availability, the
capability check (before anything is created), prepare, the readiness check
command, the network-denial evidence, then the report. On the main thread a
command's backend call runs on a reusable worker while the main thread forwards
its output to ``on_data`` through a bounded channel and watches the deadline,
the cancel event and Ctrl-C; any other thread makes the backend call itself
(see :mod:`piship_remote.exec_workers`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, Union

import attrs

from piship_remote.backends.base import Backend, BackendResult, ExecRequest, Instance
from piship_remote.cancel import EventWatcher, bridge
from piship_remote.environment import command_environment, screen_environment
from piship_remote.errors import (
    CONFIG_INVALID,
    SANDBOX_UNAVAILABLE,
    CommandCancelled,
    CommandFailed,
    CommandTimeout,
    PiShipError,
)
from piship_remote.exec_workers import DeadlineTimer, DirectCall, Outcome, WorkerCall, WorkerPool
from piship_remote.output import CommandResult, OutputCapture
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

__all__ = ["CHANNEL_BYTES", "CommandResult", "ExecResult", "Sandbox", "activate_sandbox"]

PathLike = Union[str, "os.PathLike[str]"]
_T = TypeVar("_T")
OnData = Callable[[bytes], None]
Sink = Callable[[str, bytes], None]

READY_MARKER = "piship-sandbox-ready"
PROBE_VARIABLE = "PISHIP_PROBE_UNLISTED"
CHECK_COMMAND = f"printf '%s %s\\n' {READY_MARKER} \"${{{PROBE_VARIABLE}:-unset}}\""
CHECK_OUTPUT_LIMIT = 4096
REASON_LIMIT = 400
INTERRUPT_POLL = 0.05
CHANNEL_BYTES = 1024 * 1024  # output a main-thread command may buffer ahead of ``on_data``
UNSANDBOXED_ACTION = (
    "Fix the sandbox backend reported above; PiShip does not fall back to running unsandboxed"
)
NO_PROBE_REASON = "the backend declares no network probe to check it with"
UNCHECKED_PROBE_REASON = "piship_remote does not run the backend's network probe"


@attrs.frozen
class ExecResult:
    """How a command ended: its exit code (``128 + n`` for signal ``n``)."""

    exit_code: int


class _Aborted(Exception):
    """Why the calling thread stopped waiting for a command."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind  # "timeout", "cancel", "interrupt" or "disposed"


class Sandbox:
    """An active sandbox: run commands in it, read its report, dispose of it.

    Returned by :func:`activate_sandbox`; a context manager that disposes on exit::

        with activate_sandbox(policy, backend=backend, workspace=ws) as sandbox:
            result = sandbox.exec("pytest -q", on_data=print_bytes, timeout=900)
    """

    def __init__(
        self,
        *,
        report: ContainmentReport,
        profile: SandboxProfile,
        backend: Backend,
        instance: Instance | None,
        env: Mapping[str, str],
        settle_timeout: float,
    ) -> None:
        self.report = report
        self.profile = profile
        self._backend = backend
        self._instance = instance
        self._env = dict(env)
        self._settle_timeout = settle_timeout
        self._workspace_root = _real_path(profile.workspace)
        self._lock = threading.Lock()
        self._calls: set[WorkerCall | DirectCall] = set()
        self._watcher = EventWatcher()
        self._workers = WorkerPool()
        self._timer = DeadlineTimer()
        self._disposed = False
        self._retired = False

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
    ) -> CommandResult:
        """Run ``command`` and capture its output, like ``subprocess.run``.

        ``check=True`` raises :class:`CommandFailed` for a non-zero exit;
        ``echo=True`` also writes the output live to ``sys.stdout``/``sys.stderr``
        (in Jupyter: the running cell)::

            result = sandbox.run("python -V", check=True)
            print(result.stdout)
        """
        capture = OutputCapture(echo=echo)
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
        instance = self._usable_instance()
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
        result = self._governed(instance, request, sink, timeout or None, cancel, retire=True)
        return ExecResult(exit_code=_exit_code(result))

    def workspace(self) -> WorkspaceReport | None:
        """The live workspace report (a snapshot's never changes); ``None`` when not enforced."""
        return self.report.workspace

    def dispose(self) -> None:
        """Delete the remote sandbox or claim. Idempotent, thread-safe, never waits for commands.

        Commands still running end at once with an error that mentions "disposed".
        """
        with self._lock:
            if self._disposed:
                return
            self._disposed = True
            retired = self._retired
            calls = list(self._calls)
        for call in calls:
            call.abort("disposed")
        if self._instance is not None and not retired:
            _quietly(self._instance.dispose)
        self._watcher.close()
        self._workers.close()
        self._timer.close()

    # -- the governed call -------------------------------------------------

    def _governed(
        self,
        instance: Instance,
        request: ExecRequest,
        sink: Sink | None,
        timeout: float | None,
        cancel: threading.Event | None,
        *,
        retire: bool,
    ) -> BackendResult:
        call: WorkerCall | DirectCall
        if threading.current_thread() is threading.main_thread():
            call = WorkerCall(instance, request, CHANNEL_BYTES)
        else:
            direct = DirectCall(sink, lambda kind: self._watch_settle(direct, kind, retire))
            call = direct
        with self._lock:
            if self._disposed:
                raise self._retired_error()
            self._calls.add(call)
        try:
            with bridge(cancel, self._watcher) as user_cancel:
                forget = user_cancel.on_cancel(lambda: call.abort("cancel"))
                try:
                    if isinstance(call, WorkerCall):
                        outcome = self._on_worker(call, sink, timeout, retire=retire)
                    else:
                        outcome = self._on_caller(call, instance, request, timeout)
                finally:
                    forget()
        finally:
            with self._lock:
                self._calls.discard(call)
        kind, value = outcome
        if kind == "error":
            raise self._backend_error(value)
        return value  # type: ignore[no-any-return]

    # The main thread: a worker makes the call, the main thread reads its channel.

    def _on_worker(
        self, call: WorkerCall, sink: Sink | None, timeout: float | None, *, retire: bool
    ) -> Outcome:
        worker = self._workers.submit(call)
        if worker is None:  # disposed since the call was registered
            raise self._abort_error("disposed", timeout)
        try:
            return self._drain(call, sink, timeout)
        except _Aborted as aborted:
            self._settle(call, retire=retire and aborted.kind != "disposed")
            raise self._abort_error(aborted.kind, timeout) from None
        except BaseException:  # Ctrl-C, or on_data failed
            self._settle(call, retire=retire)
            raise
        finally:
            if call.finished.is_set():
                self._workers.reap(worker, self._settle_timeout)

    def _drain(self, call: WorkerCall, sink: Sink | None, timeout: float | None) -> Outcome:
        deadline = None if timeout is None else time.monotonic() + timeout
        channel = call.channel
        while True:
            # A signal delivered to another thread does not wake a blocked wait, so the
            # main thread wakes now and then to let Python raise KeyboardInterrupt.
            for kind, value in channel.take(_wait_slice(deadline, INTERRUPT_POLL)):
                if kind == "abort":
                    raise _Aborted(value)
                if kind not in ("stdout", "stderr"):
                    return (kind, value)
                if channel.aborted is not None:  # nothing is forwarded after an abort
                    raise _Aborted(channel.aborted)
                if sink is not None:
                    sink(kind, value)
            if deadline is not None and time.monotonic() >= deadline:
                raise _Aborted("timeout")

    def _settle(self, call: WorkerCall, *, retire: bool) -> None:
        call.stop()
        if call.finished.wait(self._settle_timeout) or not retire:
            return
        self._retire()

    # Any other thread: it makes the call itself; the timer thread fires its deadline.

    def _on_caller(
        self,
        call: DirectCall,
        instance: Instance,
        request: ExecRequest,
        timeout: float | None,
    ) -> Outcome:
        unschedule = None
        if timeout is not None:
            unschedule = self._timer.schedule(timeout, lambda: call.abort("timeout"))
        try:
            outcome = call.run(instance, request)
        finally:
            if unschedule is not None:
                unschedule()
        if call.failure is not None:
            raise call.failure
        if call.aborted is not None:
            raise self._abort_error(call.aborted, timeout)
        return outcome

    def _watch_settle(self, call: DirectCall, kind: str, retire: bool) -> None:
        """Retire the sandbox if the aborted ``call`` has not returned in settle_timeout."""
        if not retire or kind == "disposed":
            return

        def check() -> None:
            if not call.finished.is_set():
                self._retire()

        self._timer.schedule(self._settle_timeout, check)

    def _retire(self) -> None:
        with self._lock:
            if self._retired or self._disposed:
                return
            self._retired = True
        instance = self._instance
        if instance is not None:
            threading.Thread(
                target=_quietly, args=(instance.dispose,), name="piship-retire", daemon=True
            ).start()

    def _abort_error(self, kind: str, timeout: float | None) -> BaseException:
        if kind == "timeout":
            return CommandTimeout(timeout or 0)
        if kind == "disposed":
            return PiShipError(
                SANDBOX_UNAVAILABLE,
                f"The {self.report.adapter} sandbox was disposed while the command ran; "
                "check its effects before running it again",
                component="sandbox",
            )
        return CommandCancelled()

    def _backend_error(self, error: BaseException) -> BaseException:
        if isinstance(error, (PiShipError, CommandCancelled, CommandTimeout)):
            return error
        if not isinstance(error, Exception):
            return error
        return PiShipError(
            SANDBOX_UNAVAILABLE,
            _truncate(self.redactor.redact(str(error) or type(error).__name__)),
            component="sandbox",
            redactor=self.redactor,
        )

    # -- helpers -------------------------------------------------------------

    def _usable_instance(self) -> Instance:
        with self._lock:
            if self._instance is None:
                raise PiShipError(
                    SANDBOX_UNAVAILABLE,
                    f"No {self.report.adapter} sandbox is active "
                    f"({self.report.level}); piship_remote never runs commands unsandboxed",
                    component="sandbox",
                    user_action="Fix the sandbox backend, then activate the sandbox again",
                )
            if self._retired or self._disposed:
                raise self._retired_error()
            return self._instance

    def _retired_error(self) -> PiShipError:
        if self._disposed and not self._retired:
            text = (
                f"The {self.report.adapter} sandbox was disposed, so PiShip retired it; "
                "start a new session"
            )
        else:
            text = (
                f"The {self.report.adapter} sandbox backend did not stop a timed-out or "
                "cancelled command, so PiShip retired it; start a new session"
            )
        return PiShipError(SANDBOX_UNAVAILABLE, text, component="sandbox")

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
) -> Sandbox:
    """Prepare a sandbox on ``backend`` that enforces ``policy`` and check it works.

    A required policy that cannot be enforced raises ``PiShipError`` with code
    ``SANDBOX_UNAVAILABLE``; an optional one gives a sandbox whose report has
    level ``unavailable`` and whose ``exec`` refuses to run anything.
    """
    if not isinstance(policy, SandboxPolicy):
        policy = SandboxPolicy.from_dict(policy)
    profile = resolve_profile(policy, workspace=workspace, home_dir=home_dir)
    source = dict(os.environ if env is None else env)
    activation = _Activation(policy, profile, backend, source, settle_timeout, probe_timeout)
    return activation.run()


@attrs.define
class _Activation:
    policy: SandboxPolicy
    profile: SandboxProfile
    backend: Backend
    env: dict[str, str]
    settle_timeout: float
    probe_timeout: float

    def run(self) -> Sandbox:
        instance: Instance | None = None
        sandbox: Sandbox | None = None
        try:
            capabilities = self._capabilities()
            instance = self._prepare()
            sandbox = self._sandbox(instance, self._report(capabilities))
            sandbox.report = self._checked(sandbox, capabilities)
        except _Failure as failure:
            self._discard(instance, sandbox)
            return self._unavailable(failure.reason)
        except BaseException:
            self._discard(instance, sandbox)
            raise
        return sandbox

    @staticmethod
    def _discard(instance: Instance | None, sandbox: Sandbox | None) -> None:
        """Dispose what a failed activation built: its sandbox (and threads) or instance."""
        if sandbox is not None:
            sandbox.dispose()
        elif instance is not None:
            _quietly(instance.dispose)

    def _capabilities(self) -> Capabilities:
        backend = self.backend
        availability = _call_reporting(backend.available, backend.redactor)
        if isinstance(availability, _Failure):
            raise availability
        if not availability.available:
            raise _Failure(_reason(availability.reason or "unknown reason", backend.redactor))
        capabilities = _call_reporting(backend.capabilities, backend.redactor)
        if isinstance(capabilities, _Failure):
            raise _Failure(
                f"the {backend.id} sandbox backend reported no capabilities: {capabilities.reason}"
            )
        mismatch = capability_mismatch(capabilities, self.policy.network)
        if mismatch is not None:
            raise _Failure(
                f"the {backend.id} sandbox backend cannot enforce this policy: {mismatch}"
            )
        return capabilities

    def _prepare(self) -> Instance:
        instance = _call_reporting(
            lambda: self.backend.prepare(self.profile), self.backend.redactor
        )
        if isinstance(instance, _Failure):
            what = f"the {self.backend.id} sandbox backend could not prepare a sandbox"
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
        )

    def _sandbox(self, instance: Instance, report: ContainmentReport) -> Sandbox:
        return Sandbox(
            report=report,
            profile=self.profile,
            backend=self.backend,
            instance=instance,
            env=self.env,
            settle_timeout=self.settle_timeout,
        )

    def _checked(self, sandbox: Sandbox, capabilities: Capabilities) -> ContainmentReport:
        """Run the readiness check; the report with the network-denial evidence."""
        failure = _readiness_failure(sandbox, self.env, self.probe_timeout)
        if failure is not None:
            raise _Failure(f"the {self.backend.id} sandbox backend failed its check: {failure}")
        report = sandbox.report
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

    def _unavailable(self, reason: str) -> Sandbox:
        backend = self.backend
        if self.policy.required:
            raise PiShipError(
                SANDBOX_UNAVAILABLE,
                f"The distribution requires a sandbox, but it cannot be enforced: {reason}",
                component="sandbox",
                user_action=UNSANDBOXED_ACTION,
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
            report=report,
            profile=self.profile,
            backend=backend,
            instance=None,
            env=self.env,
            settle_timeout=self.settle_timeout,
        )


class _Failure(Exception):
    """An activation step failed for ``reason`` (already redacted)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _call_reporting(step: Callable[[], _T], redactor: Redactor) -> _T | _Failure:
    """Run an activation step; an exception becomes a :class:`_Failure` with a redacted reason."""
    try:
        return step()
    except Exception as e:
        return _Failure(_reason(str(e) or type(e).__name__, redactor))


def _readiness_failure(sandbox: Sandbox, env: Mapping[str, str], timeout: float) -> str | None:
    """Run the readiness check command; the failure text, or ``None`` when it passed."""
    output = bytearray()

    def collect(_stream: str, chunk: bytes) -> None:
        if len(output) < CHECK_OUTPUT_LIMIT:
            output.extend(chunk)

    source = {**env, PROBE_VARIABLE: "1"}
    request = ExecRequest(
        command=CHECK_COMMAND,
        cwd=sandbox._workspace_root,
        workspace_path=".",
        env=command_environment(
            sandbox.profile.environment_allow, source, secrets=sandbox.redactor
        ),
    )
    instance = sandbox._usable_instance()
    try:
        result = sandbox._governed(instance, request, collect, timeout, None, retire=False)
    except (CommandTimeout, CommandCancelled):
        return "the sandbox check command timed out"
    except Exception as e:
        return f"the sandbox check command failed: {_reason(str(e), sandbox.redactor)}"
    return _verdict(_exit_code(result), output.decode("utf-8", "replace"))


def _verdict(exit_code: int, output: str) -> str | None:
    lines = [line.strip() for line in output.splitlines()]
    marker = next((line for line in lines if line.startswith(f"{READY_MARKER} ")), None)
    if exit_code != 0 or marker is None:
        return f"the sandbox check command did not report back (exit {exit_code})"
    if marker != f"{READY_MARKER} unset":
        return "an unapproved environment variable reached the sandboxed command"
    return None


def _exit_code(result: BackendResult) -> int:
    if isinstance(result.exit_code, int) and not isinstance(result.exit_code, bool):
        return result.exit_code
    if result.signal:
        try:
            return 128 + int(signal.Signals[result.signal.upper()])
        except KeyError:
            return 1
    return 1


def _reason(text: str, redactor: Redactor) -> str:
    return _truncate(redactor.redact(text))


def _truncate(text: str, limit: int = REASON_LIMIT) -> str:
    return text if len(text) <= limit else text[:limit]


def _wait_slice(deadline: float | None, poll: float | None) -> float | None:
    if deadline is None:
        return poll
    remaining = max(0.0, deadline - time.monotonic())
    return remaining if poll is None else min(remaining, poll)


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
