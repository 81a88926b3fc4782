"""The steps of an activation, in order, and how each failure becomes the error or report.

Availability, the capability check (before anything is created), prepare (or
attach), the readiness check command, the network-denial evidence, the report,
then the workspace push when sync asks for it. :func:`~piship_remote.sandbox.activation.
activate_sandbox` runs them; a failed step of a required policy raises, one of an
optional policy gives a sandbox whose report says why.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TypeVar, Union

import attrs

from piship_remote.backends._common import exit_status
from piship_remote.backends.base import (
    Backend,
    Detachable,
    ExecRequest,
    Instance,
    Reattachable,
    SupportsFiles,
)
from piship_remote.model._capability_rules import (
    capability_mismatch,
    claimed_guarantees,
)
from piship_remote.model.environment import command_environment, screen_environment
from piship_remote.model.errors import (
    CONFIG_INVALID,
    CREDENTIAL_DENIED,
    CREDENTIAL_REQUIRED,
    GATEWAY_UNREACHABLE,
    NETWORK_DENIED,
    SANDBOX_UNAVAILABLE,
    CommandCancelled,
    CommandTimeout,
    ConfigInvalid,
    PiShipError,
    error_for,
)
from piship_remote.model.policy import SandboxPolicy, SandboxProfile
from piship_remote.model.redact import Redactor
from piship_remote.model.report import (
    Capabilities,
    ContainmentReport,
    NetworkDenial,
    snapshot_workspace_report,
)
from piship_remote.sandbox import lifecycle
from piship_remote.sandbox._exec_engine import ExecEngine
from piship_remote.sandbox._exec_errors import reason_text
from piship_remote.sandbox._exec_workers import Stream
from piship_remote.sandbox._sandbox_telemetry import SandboxTelemetry
from piship_remote.sandbox._sandbox_transfers import SandboxTransfers
from piship_remote.sandbox._workspace import real_path
from piship_remote.sandbox.sandbox import Sandbox
from piship_remote.telemetry import Telemetry
from piship_remote.telemetry.logs import info, log_environment_warnings
from piship_remote.telemetry.names import ACTIVATION_SPAN, SANDBOX_ID, STEP_SPANS
from piship_remote.transport.deadline import Deadline

__all__ = ["Activation", "unenforceable_message"]

_LOG = logging.getLogger("piship_remote")

PathLike = Union[str, "os.PathLike[str]"]
_T = TypeVar("_T")

READY_MARKER = "piship-sandbox-ready"
PROBE_VARIABLE = "PISHIP_PROBE_UNLISTED"
CHECK_COMMAND = f"printf '%s %s\\n' {READY_MARKER} \"${{{PROBE_VARIABLE}:-unset}}\""
CHECK_OUTPUT_LIMIT = 4096
UNREACHABLE_ACTION = (
    "Check that the sandbox service is running and reachable at the address named above, then retry"
)
# Causes whose own code and action say better what to do than SANDBOX_UNAVAILABLE.
ACTIONABLE_CODES = frozenset(
    {GATEWAY_UNREACHABLE, CREDENTIAL_REQUIRED, CONFIG_INVALID, NETWORK_DENIED}
)
UNSANDBOXED_ACTION = (
    "Fix the sandbox backend reported above; piship_remote never runs a command outside a sandbox"
)
NO_PROBE_REASON = "the backend declares no network probe to check it with"
UNCHECKED_PROBE_REASON = "piship_remote does not run the backend's network probe"


@attrs.define
class Activation:
    policy: SandboxPolicy
    profile: SandboxProfile
    backend: Backend
    env: dict[str, str]
    settle_timeout: float
    probe_timeout: float
    sync: str = "none"
    sync_ignore: bool = True
    attach: str | None = None
    # The caller passed env= on purpose: the names it does not allow are named too.
    env_given: bool = attrs.field(default=False, kw_only=True)
    telemetry: Telemetry = attrs.field(kw_only=True)

    def run(self) -> Sandbox:
        telemetry = self.telemetry
        with telemetry.span(ACTIVATION_SPAN, ended=telemetry.activation_ended) as span:
            sandbox, sandbox_telemetry = self._steps()
            if sandbox.report.level != "enforced":
                span.outcome("unavailable")
                return sandbox
            sandbox_id = _quietly_id(lambda: sandbox.id)
            span.set(SANDBOX_ID, sandbox_id)
        sandbox_telemetry.activated()
        what = "attached to" if self.attach is not None else "created"
        info("%s sandbox %s %s", self.backend.id, sandbox_id, what, redactor=self.backend.redactor)
        return sandbox

    def _steps(self) -> tuple[Sandbox, SandboxTelemetry]:
        instance: Instance | None = None
        engine: ExecEngine | None = None
        activating: int | None = None
        step = self.telemetry.span
        try:
            with step(STEP_SPANS["health"]):
                capabilities = self._capabilities()
            with step(STEP_SPANS["create"]) as created:
                instance = self._prepare()
                activating = self._track_activating(instance)
                created.set(SANDBOX_ID, _quietly_id(instance.epoch))
            engine = self._engine(instance)
            with step(STEP_SPANS["readiness"]):
                report = self._checked(engine, self._report(capabilities), capabilities)
            transfers = self._transfers(instance, engine)
        except _Failure as failure:
            self._discard(instance, engine, activating)
            return self._unavailable(failure)
        except KeyboardInterrupt:
            self._discard(instance, engine, activating)
            raise KeyboardInterrupt(self._interrupted()) from None  # no internal frames
        except BaseException:
            self._discard(instance, engine, activating)
            raise
        sandbox_telemetry = SandboxTelemetry(self.telemetry, engine)
        sandbox = Sandbox(
            report=report,
            profile=self.profile,
            backend=self.backend,
            engine=engine,
            env=self.env,
            telemetry=sandbox_telemetry,
            transfers=transfers,
        )
        lifecycle.untrack(activating)  # the sandbox is tracked on its own now
        if transfers is not None and self.sync != "none":
            try:
                with self.telemetry.span(STEP_SPANS["push"]):
                    transfers.push()
            except BaseException as error:
                if self.attach is not None:
                    _quietly(sandbox.detach)  # it was there before: let go, never delete
                else:
                    sandbox.dispose()
                if isinstance(error, KeyboardInterrupt):
                    raise KeyboardInterrupt(self._interrupted()) from None
                raise
            sandbox.report = attrs.evolve(sandbox.report, workspace=transfers.workspace_report())
        return sandbox, sandbox_telemetry

    def _transfers(self, instance: Instance, engine: ExecEngine) -> SandboxTransfers | None:
        """The sandbox's file side, when the backend moves files (else sync is refused)."""
        if not isinstance(instance, SupportsFiles):
            if self.sync != "none":
                raise ConfigInvalid(
                    f"the {self.backend.id} sandbox backend cannot move files, so sync"
                    f" {self.sync!r} is not possible",
                    component="files",
                )
            return None
        return SandboxTransfers(
            instance,
            engine,
            self.profile,
            mode=self.sync,
            use_gitignore=self.sync_ignore,
            adapter=self.backend.id,
            telemetry=self.telemetry,
        )

    def _track_activating(self, instance: Instance) -> int | None:
        """Track a sandbox still being checked, so that the exit hooks and
        :func:`~piship_remote.sandbox.lifecycle.cleanup_on_signals` delete it too.

        One attached to is not tracked: it was there before and must outlive this process.
        """
        if self.attach is not None:
            return None
        return lifecycle.track(self, f"activating {self.backend.id} sandbox", instance.dispose)

    def _discard(
        self, instance: Instance | None, engine: ExecEngine | None, activating: int | None
    ) -> None:
        """Dispose what a failed activation built: its engine (and threads) or instance.

        A sandbox it attached to is let go of, never deleted: it was there before.
        """
        lifecycle.untrack(activating)
        if self.attach is not None:
            if engine is not None:
                _quietly(engine.detach)
            elif isinstance(instance, Detachable):
                _quietly(instance.detach)
            return
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
            if availability.code == CREDENTIAL_REQUIRED:
                raise _Failure(
                    reason,
                    code=CREDENTIAL_REQUIRED,
                    user_action=availability.user_action or UNSANDBOXED_ACTION,
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
            self.profile.environment_allow,
            self.env,
            secrets=self.backend.redactor,
            name_unlisted=self.env_given,
        )
        log_environment_warnings(screened.warnings)
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
            cwd=real_path(self.profile.workspace),
            workspace_path=".",
            env=command_environment(
                self.profile.environment_allow,
                {**self.env, PROBE_VARIABLE: "1"},
                secrets=self.backend.redactor,
            ),
        )
        try:
            result = engine.run(
                request, collect, Deadline.after(self.probe_timeout), None, retire=False
            )
        except (CommandTimeout, CommandCancelled):
            return "the sandbox check command timed out"
        except Exception as e:
            reason = reason_text(str(e), self.backend.redactor)
            # The failure's own advice (which option to set) goes with it: the error
            # activation raises gives its own user_action.
            action = e.user_action if isinstance(e, PiShipError) else None
            advice = f" ({action})" if action else ""
            return f"the sandbox check command failed: {reason}{advice}"
        return _verdict(exit_status(result), output.decode("utf-8", "replace"))

    def _interrupted(self) -> str:
        """The message of the ``KeyboardInterrupt`` that ends an interrupted activation."""
        if self.attach is not None:
            return "interrupted: the activation stopped; the attached sandbox was let go"
        return "interrupted: the activation stopped and its sandbox was deleted"

    def _unavailable(self, failure: _Failure) -> tuple[Sandbox, SandboxTelemetry]:
        backend = self.backend
        reason = failure.reason
        if self.policy.required:
            raise error_for(
                failure.code,
                unenforceable_message(reason),
                component="sandbox",
                retryable=failure.retryable,
                retry_after=failure.retry_after,
                user_action=failure.user_action,
                redactor=backend.redactor,
                cause_code=failure.cause_code,
                cause=failure.cause or failure,
            ) from None
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
        sandbox_telemetry = SandboxTelemetry(self.telemetry, None)
        sandbox = Sandbox(
            report=report,
            profile=self.profile,
            backend=backend,
            engine=None,
            env=self.env,
            telemetry=sandbox_telemetry,
        )
        return sandbox, sandbox_telemetry


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
        retry_after: float | None = None,
        cause_code: str | None = None,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.retryable = retryable
        self.user_action = user_action
        self.retry_after = retry_after
        self.cause_code = cause_code
        self.cause = cause  # the error the step raised, for the PiShipError's ``cause``

    def within(self, context: str) -> _Failure:
        """The same failure, its reason prefixed with ``context``."""
        return _Failure(
            f"{context}: {self.reason}",
            code=self.code,
            retryable=self.retryable,
            user_action=self.user_action,
            retry_after=self.retry_after,
            cause_code=self.cause_code,
            cause=self.cause,
        )


def unenforceable_message(reason: str) -> str:
    """The fixed message of a required sandbox that could not be had, for ``reason``."""
    return f"The distribution requires a sandbox, but it cannot be enforced: {reason}"


def _call_reporting(step: Callable[[], _T], redactor: Redactor) -> _T | _Failure:
    """Run an activation step; an exception becomes a :class:`_Failure` with a redacted reason."""
    try:
        return step()
    except PiShipError as e:
        reason = reason_text(str(e) or type(e).__name__, redactor)
        if e.code == CREDENTIAL_DENIED:
            # Activation's code stays SANDBOX_UNAVAILABLE; what to fix is the key.
            return _Failure(
                reason,
                user_action=e.user_action or UNSANDBOXED_ACTION,
                cause_code=e.code,
                cause=e,
            )
        if e.code not in ACTIONABLE_CODES:
            # A service that asked to be retried later (429) says when, and the caller may wait.
            if e.retry_after is not None:
                return _Failure(reason, retryable=e.retryable, retry_after=e.retry_after, cause=e)
            return _Failure(reason, cause=e)
        return _Failure(
            reason,
            code=e.code,
            retryable=e.retryable,
            user_action=e.user_action or UNSANDBOXED_ACTION,
            retry_after=e.retry_after,
            cause=e,
        )
    except Exception as e:
        return _Failure(reason_text(str(e) or type(e).__name__, redactor), cause=e)


def _quietly_id(read: Callable[[], str | None]) -> str | None:
    """The sandbox id ``read`` gives, or ``None`` when it has none (for a span only)."""
    try:
        return read()
    except Exception:
        return None


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


def _quietly(action: Callable[[], object]) -> None:
    try:
        action()
    except Exception:
        pass
