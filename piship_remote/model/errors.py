"""The exceptions of piship_remote.

Every failure of an activation or a command is a :class:`PiShipError` carrying a
stable ``code`` (``SANDBOX_UNAVAILABLE``, ``CONFIG_INVALID``, ...), a one-line
message that never contains a secret, and optionally the action a user can take.
Each code has a subclass named after it, so a caller catches the kind it handles::

    try:
        sandbox = activate_sandbox(policy, backend=backend, workspace=".")
    except SandboxUnavailable as e:
        print(f"no sandbox: {e}")
    except PiShipError as e:
        print(f"{e.code}: {e}")

Two outcomes are not failures of the sandbox and so are not ``PiShipError``:
:class:`CommandTimeout` (the caller's deadline passed) and :class:`CommandCancelled`
(the caller cancelled).
"""

from __future__ import annotations

import traceback
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, ClassVar

from piship_remote.model.redact import redaction

if TYPE_CHECKING:
    from piship_remote.model.redact import Redactor
    from piship_remote.model.result import CommandResult

__all__ = [
    "COMMAND_FAILED",
    "CONFIG_INVALID",
    "CONFIG_UNAVAILABLE",
    "CREDENTIAL_DENIED",
    "CREDENTIAL_REQUIRED",
    "ERROR_CLASSES",
    "ERROR_CODES",
    "FILE_NOT_FOUND",
    "FILE_WRITE_FAILED",
    "GATEWAY_PROTOCOL_ERROR",
    "GATEWAY_UNREACHABLE",
    "NETWORK_DENIED",
    "SANDBOX_UNAVAILABLE",
    "TLS_POLICY_VIOLATION",
    "CommandCancelled",
    "CommandFailed",
    "CommandTimeout",
    "ConfigInvalid",
    "ConfigUnavailable",
    "CredentialDenied",
    "CredentialRequired",
    "FileNotFound",
    "FileWriteFailed",
    "GatewayProtocolError",
    "GatewayUnreachable",
    "NetworkDenied",
    "PiShipError",
    "SandboxUnavailable",
    "TlsPolicyViolation",
    "error_for",
]

# Error codes: every PiShipError carries one of these.
CONFIG_INVALID = "CONFIG_INVALID"
CONFIG_UNAVAILABLE = "CONFIG_UNAVAILABLE"
CREDENTIAL_REQUIRED = "CREDENTIAL_REQUIRED"
CREDENTIAL_DENIED = "CREDENTIAL_DENIED"
GATEWAY_UNREACHABLE = "GATEWAY_UNREACHABLE"
GATEWAY_PROTOCOL_ERROR = "GATEWAY_PROTOCOL_ERROR"
NETWORK_DENIED = "NETWORK_DENIED"
TLS_POLICY_VIOLATION = "TLS_POLICY_VIOLATION"
SANDBOX_UNAVAILABLE = "SANDBOX_UNAVAILABLE"
COMMAND_FAILED = "COMMAND_FAILED"
FILE_NOT_FOUND = "FILE_NOT_FOUND"
# A file could not be written where it was asked (read-only, full disk, a file where a
# folder must be), in the sandbox or on this host; the sandbox stays usable.
FILE_WRITE_FAILED = "FILE_WRITE_FAILED"

ERROR_CODES = frozenset(
    {
        CONFIG_INVALID,
        CONFIG_UNAVAILABLE,
        CREDENTIAL_REQUIRED,
        CREDENTIAL_DENIED,
        GATEWAY_UNREACHABLE,
        GATEWAY_PROTOCOL_ERROR,
        NETWORK_DENIED,
        TLS_POLICY_VIOLATION,
        SANDBOX_UNAVAILABLE,
        COMMAND_FAILED,
        FILE_NOT_FOUND,
        FILE_WRITE_FAILED,
    }
)


class PiShipError(Exception):
    """A failure with a stable code and a redacted, user-facing message.

    ``redactor`` (optional) also removes the secrets registered with it; the
    pattern rules (bearer tokens, API-key shapes, ...) always apply.
    """

    code: str
    retryable: bool
    not_started: bool
    retry_after: float | None
    user_action: str | None
    component: str | None
    # The code of the failure underneath, where ``code`` is pinned and says less (a key
    # the service refused, under activation's SANDBOX_UNAVAILABLE); not in to_dict().
    cause_code: str | None
    # What a command wrote before this error stopped it (Sandbox.run sets it), or None.
    output: CommandResult | None = None
    cause: BaseException | None

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retryable: bool = False,
        not_started: bool = False,
        retry_after: float | None = None,
        user_action: str | None = None,
        component: str | None = None,
        redactor: Redactor | None = None,
        cause_code: str | None = None,
        cause: BaseException | None = None,
    ) -> None:
        """``cause``: the internal error behind this one, kept for debugging (``e.cause``)
        where the raise leaves it out of the traceback (``raise ... from None``)."""
        clean = redaction(redactor)
        self.code = code
        self.message = clean(message)
        self.retryable = retryable
        self.not_started = not_started
        self.retry_after = retry_after
        self.user_action = clean(user_action) if user_action is not None else None
        self.component = component
        self.cause_code = cause_code
        self.cause = cause
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"

    def to_dict(self) -> dict[str, object]:
        """The JSON form: ``code``, ``message``, ``retryable`` and, when set, the others."""
        data: dict[str, object] = {
            "code": self.code,
            "message": self.message,
            "retryable": self.retryable,
        }
        if self.retry_after is not None:
            data["retryAfterMs"] = int(self.retry_after * 1000)
        if self.user_action is not None:
            data["userAction"] = self.user_action
        if self.component is not None:
            data["component"] = self.component
        return data

    def render(self) -> str:
        """The command-line rendering: ``<CODE>: <message>`` plus retry and action lines."""
        lines = [f"{self.code}: {self.message}"]
        if self.retry_after is not None and self.retry_after > 0:
            lines.append(f"Retry after: {-int(-self.retry_after // 1)} s")
        if self.user_action:
            lines.append(f"Action: {self.user_action}")
        return "\n".join(lines)

    def _render_traceback_(self) -> list[str]:
        """How IPython and Jupyter show this error: the caller's own frames (the library's
        are left out), then :meth:`render`'s code, message and action."""
        frames = traceback.StackSummary.extract(
            (frame, line)
            for frame, line in traceback.walk_tb(self.__traceback__)
            if not _hidden(frame)
        )
        shown = ["Traceback (most recent call last):\n", *frames.format()]
        shown.append(f"PiShipError: {self.render()}")  # the family; render() names the code
        return [line for chunk in shown for line in chunk.rstrip("\n").split("\n")]


_PACKAGE = Path(__file__).resolve().parents[1]


def _hidden(frame: FrameType) -> bool:
    """A frame of this library, or one that hides itself (IPython's ``run_code``)."""
    if frame.f_locals.get("__tracebackhide__"):
        return True
    return Path(frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)


class _CodedError(PiShipError):
    """A :class:`PiShipError` whose class names its code: ``SandboxUnavailable("...")``."""

    CODE: ClassVar[str]

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        not_started: bool = False,
        retry_after: float | None = None,
        user_action: str | None = None,
        component: str | None = None,
        redactor: Redactor | None = None,
        cause: BaseException | None = None,
        cause_code: str | None = None,
    ) -> None:
        super().__init__(
            self.CODE,
            message,
            retryable=retryable,
            not_started=not_started,
            retry_after=retry_after,
            user_action=user_action,
            component=component,
            redactor=redactor,
            cause=cause,
            cause_code=cause_code,
        )


class ConfigInvalid(_CodedError, ValueError):
    """An argument, option or policy is wrong; the message names it and what to write."""

    CODE = CONFIG_INVALID


class ConfigUnavailable(_CodedError):
    """Configuration the library needs (a kubeconfig, a service account) cannot be read."""

    CODE = CONFIG_UNAVAILABLE


class CredentialRequired(_CodedError):
    """The service asked for a credential and none was given."""

    CODE = CREDENTIAL_REQUIRED


class CredentialDenied(_CodedError):
    """The service refused the credential it was given."""

    CODE = CREDENTIAL_DENIED


class GatewayUnreachable(_CodedError):
    """A request to the service failed below HTTP (refused, reset, dropped, timed out)."""

    CODE = GATEWAY_UNREACHABLE


class GatewayProtocolError(_CodedError):
    """The service answered something this library cannot read."""

    CODE = GATEWAY_PROTOCOL_ERROR


class NetworkDenied(_CodedError):
    """The policy denies the network the request needed."""

    CODE = NETWORK_DENIED


class TlsPolicyViolation(_CodedError):
    """An endpoint breaks the transport rules (plain HTTP off loopback, credentials in a URL)."""

    CODE = TLS_POLICY_VIOLATION


class SandboxUnavailable(_CodedError):
    """No sandbox could be had, or the sandbox failed under a command (the default code)."""

    CODE = SANDBOX_UNAVAILABLE


class FileNotFound(_CodedError):
    """No file or directory at a path in the sandbox or on this host."""

    CODE = FILE_NOT_FOUND


class FileWriteFailed(_CodedError):
    """A file could not be written where it was asked; the sandbox stays usable."""

    CODE = FILE_WRITE_FAILED


def format_seconds(seconds: float) -> str:
    """Print a duration the way JavaScript prints a number: ``5`` not ``5.0``, ``0.3`` as is."""
    if float(seconds).is_integer():
        return str(int(seconds))
    return repr(float(seconds))


class CommandTimeout(TimeoutError):
    """The command outlived its ``timeout``; the remote process was killed.

    ``str(e)`` is ``timeout:<seconds>`` (``timeout:0.3``, ``timeout:5``).
    """

    output: CommandResult | None = None
    """What the command wrote before it was killed (``Sandbox.run`` sets it), or ``None``."""

    def __init__(self, timeout: float) -> None:
        self.timeout = float(timeout)
        super().__init__(f"timeout:{format_seconds(timeout)}")

    def __str__(self) -> str:
        return f"timeout:{format_seconds(self.timeout)}"


class CommandCancelled(Exception):
    """The caller cancelled the command (its ``cancel`` event was set); ``str(e) == "aborted"``."""

    def __init__(self, message: str = "aborted") -> None:
        super().__init__(message)


class CommandFailed(_CodedError):
    """A command failed: ``Sandbox.run(..., check=True)`` saw a non-zero exit (``result``
    holds its exit code and output), or input went to a command that has ended
    (``result`` is ``None``)."""

    CODE = COMMAND_FAILED
    result: CommandResult | None
    exit_code: int | None

    def __init__(
        self,
        result: CommandResult | str,
        *,
        retryable: bool = False,
        not_started: bool = False,
        retry_after: float | None = None,
        user_action: str | None = None,
        component: str | None = "sandbox",
        redactor: Redactor | None = None,
        cause: BaseException | None = None,
        cause_code: str | None = None,
    ) -> None:
        if isinstance(result, str):
            self.result, self.exit_code, message = None, None, result
        else:
            self.result, self.exit_code = result, result.exit_code
            tail = (result.stderr or result.stdout).strip()[-OUTPUT_TAIL:]
            message = f"the command exited with status {result.exit_code}"
            message = f"{message}: {' '.join(tail.split())}" if tail else message
        super().__init__(
            message,
            retryable=retryable,
            not_started=not_started,
            retry_after=retry_after,
            user_action=user_action,
            component=component,
            redactor=redactor,
            cause=cause,
            cause_code=cause_code,
        )


OUTPUT_TAIL = 300

ERROR_CLASSES: dict[str, type[_CodedError]] = {
    error.CODE: error
    for error in (
        ConfigInvalid,
        ConfigUnavailable,
        CredentialRequired,
        CredentialDenied,
        GatewayUnreachable,
        GatewayProtocolError,
        NetworkDenied,
        TlsPolicyViolation,
        SandboxUnavailable,
        FileNotFound,
        FileWriteFailed,
        CommandFailed,
    )
}


def error_for(
    code: str,
    message: str,
    *,
    retryable: bool = False,
    not_started: bool = False,
    retry_after: float | None = None,
    user_action: str | None = None,
    component: str | None = None,
    redactor: Redactor | None = None,
    cause: BaseException | None = None,
    cause_code: str | None = None,
) -> PiShipError:
    """The error of ``code``'s own class, for a code known only at run time (one carried
    over from another error); a plain :class:`PiShipError` for a code without a class."""
    error = ERROR_CLASSES.get(code)
    if error is None:
        return PiShipError(
            code,
            message,
            retryable=retryable,
            not_started=not_started,
            retry_after=retry_after,
            user_action=user_action,
            component=component,
            redactor=redactor,
            cause=cause,
            cause_code=cause_code,
        )
    return error(
        message,
        retryable=retryable,
        not_started=not_started,
        retry_after=retry_after,
        user_action=user_action,
        component=component,
        redactor=redactor,
        cause=cause,
        cause_code=cause_code,
    )
