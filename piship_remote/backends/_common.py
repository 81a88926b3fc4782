"""What both backends share: the remote directory, exit codes, errors and cancel links.

One rule each, so the E2B and Kubernetes backends cannot drift apart::

    remote_directory("/home/user", "sub")           # '/home/user/sub'
    exit_code_of(3.0)                               # 3
    errors = SandboxErrors(redactor)
    raise errors("the sandbox was disposed")        # SANDBOX_UNAVAILABLE, redacted
"""

from __future__ import annotations

import email.utils
import math
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, overload

import attrs

from piship_remote.model.errors import (
    SANDBOX_UNAVAILABLE,
    ConfigInvalid,
    PiShipError,
    error_for,
)

if TYPE_CHECKING:
    from piship_remote.backends.base import BackendResult, Instance
    from piship_remote.model.redact import Redactor

__all__ = [
    "DETAIL_LIMIT",
    "CountedChunks",
    "OpenInstances",
    "SandboxErrors",
    "exit_code_of",
    "exit_status",
    "is_success",
    "remote_directory",
    "retry_after_seconds",
]

# How many characters of a service's failure text an error message quotes.
DETAIL_LIMIT = 300


@overload
def remote_directory(workdir: str, workspace_path: str | None) -> str: ...


@overload
def remote_directory(workdir: None, workspace_path: str | None) -> str | None: ...


def remote_directory(workdir: str | None, workspace_path: str | None) -> str | None:
    """The remote cwd for a workspace-relative path: under ``workdir``, or relative to
    the service's own directory when there is no ``workdir`` (``None`` = that directory).

    >>> remote_directory("/home/user", "sub")
    '/home/user/sub'
    >>> remote_directory("/", "sub")
    '/sub'
    >>> remote_directory(None, ".") is None
    True
    """
    path = workspace_path or "."
    relative = path != "."
    if relative and (path.startswith("/") or ".." in path.split("/")):
        raise ConfigInvalid("the working directory is outside the workspace", component="sandbox")
    if workdir is None:
        return path if relative else None
    if not relative:
        return workdir
    base = "" if workdir == "/" else workdir.rstrip("/")
    return f"{base}/{path}"


def exit_code_of(value: object) -> int | None:
    """An integer exit code from a decoded JSON value; anything else is ``None``.

    A bool is not a code; a float counts only when it is integral.

    >>> exit_code_of(3.0), exit_code_of(True), exit_code_of("1")
    (3, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def exit_status(result: BackendResult) -> int:
    """The process exit status of a backend result: its code, ``128 + n`` for signal n, else 1.

    >>> from piship_remote.backends.base import BackendResult
    >>> exit_status(BackendResult(None, "SIGKILL"))
    137
    """
    code = exit_code_of(result.exit_code)
    if code is not None:
        return code
    if result.signal:
        try:
            return 128 + int(signal.Signals[result.signal.upper()])
        except KeyError:
            return 1
    return 1


def is_success(status: int) -> bool:
    """Whether an HTTP status is 2xx."""
    return 200 <= status < 300


def retry_after_seconds(value: str | None) -> float | None:
    """``Retry-After`` as seconds (a number or an HTTP date); ``None`` when absent or bad.

    >>> retry_after_seconds("2.5"), retry_after_seconds("soon")
    (2.5, None)
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, seconds) if math.isfinite(seconds) else None


@attrs.frozen
class SandboxErrors:
    """Makes a backend's errors: ``SANDBOX_UNAVAILABLE`` unless told, always redacted."""

    redactor: Redactor | None = None

    def __call__(
        self,
        message: str,
        *,
        code: str = SANDBOX_UNAVAILABLE,
        retryable: bool = False,
        not_started: bool = False,
        retry_after: float | None = None,
        user_action: str | None = None,
    ) -> PiShipError:
        return error_for(
            code,
            message,
            retryable=retryable,
            not_started=not_started,
            retry_after=retry_after,
            user_action=user_action,
            component="sandbox",
            redactor=self.redactor,
        )


class OpenInstances:
    """The instances a backend prepared and has not yet seen disposed.

    ``close()`` on a backend means the same on both: no instance is prepared after
    it, and every instance still held is disposed (its sandbox or claim deleted)::

        if not open_instances.admit(instance):   # the backend was closed meanwhile
            instance.dispose()
    """

    def __init__(self) -> None:
        self.closed = threading.Event()
        self._lock = threading.Lock()
        self._instances: set[Instance] = set()

    def admit(self, instance: Instance) -> bool:
        """Hold ``instance``; ``False`` (not held) when the backend is already closed."""
        with self._lock:
            if self.closed.is_set():
                return False
            self._instances.add(instance)
            return True

    def forget(self, instance: Instance) -> None:
        """``instance`` was disposed: nothing to do for it at close."""
        with self._lock:
            self._instances.discard(instance)

    def close(self) -> None:
        """Admit nothing more and dispose every instance still held."""
        with self._lock:
            self.closed.set()
            instances = list(self._instances)
        for instance in instances:
            instance.dispose()


class CountedChunks:
    """A body's chunks, passed through while their bytes are counted (``total``)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = chunks
        self.total = 0

    def __iter__(self) -> Iterator[bytes]:
        for chunk in self._chunks:
            self.total += len(chunk)
            yield chunk
