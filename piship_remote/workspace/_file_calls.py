"""The governed run of one file operation: its timeout, its cancel event, and dispose.

    calls = FileCalls(adapter="e2b")
    with calls.begin(timeout=30, cancel=event) as call:
        remote.read(path, sink, cancel=call.cancel, deadline=call.deadline)
    calls.dispose()                      # every operation still running ends at once

A file operation is governed like a command. It gets a
:class:`~piship_remote.transport._cancel.CancelToken` (``call.cancel``) that its
requests and helper commands carry down to the socket, and that three things set:
the caller's ``cancel`` event (bridged once, here), the deadline (the
``piship-files-timer`` thread) and :meth:`FileCalls.dispose`. Setting it shuts down
the sockets of whatever request is in flight, so a stalled transfer ends within
milliseconds. The deadline also goes down as ``call.deadline`` (a
:class:`~piship_remote.transport.deadline.Deadline`), so each request is bounded by
what is left of it.

Whatever the operation raises once its token was set is replaced by the reason:
:class:`CommandTimeout` for the deadline, :class:`CommandCancelled` for the event,
``PiShipError`` ``SANDBOX_UNAVAILABLE`` mentioning "disposed" for dispose.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from piship_remote.model.errors import (
    CONFIG_INVALID,
    FILE_NOT_FOUND,
    FILE_WRITE_FAILED,
    CommandCancelled,
    CommandTimeout,
    ConfigInvalid,
    PiShipError,
    SandboxUnavailable,
)
from piship_remote.transport._cancel import (
    CancelToken,
    DeadlineTimer,
    EventWatcher,
    when_cancelled,
)
from piship_remote.transport.deadline import timeout_deadline

__all__ = ["FileCall", "FileCalls", "check_timeout"]

Reason = Literal["timeout", "cancel", "disposed"]


def check_timeout(timeout: float | None) -> None:
    """A file operation's ``timeout``: ``None`` (none) or a positive number of seconds."""
    if timeout is not None and not timeout > 0:
        raise ConfigInvalid(
            f"timeout must be a positive number of seconds (or None for none), not {timeout!r}",
            component="files",
        )


class FileCall:
    """One running file operation: the token and deadline its requests carry."""

    __slots__ = ("_lock", "_reason", "cancel", "deadline", "timeout")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.deadline = timeout_deadline(timeout)
        self.cancel = CancelToken()
        self._reason: Reason | None = None
        self._lock = threading.Lock()

    @property
    def stopped_by(self) -> Reason | None:
        """Why the operation was stopped (``None``: it was not)."""
        return self._reason

    def remaining(self) -> float | None:
        """Seconds left before the deadline (``0.0`` once passed); ``None``: no deadline."""
        return self.deadline.remaining()

    def stop(self, reason: Reason) -> None:
        """Stop the operation for ``reason`` (the first reason given is kept)."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self.cancel.set()

    def expired(self) -> bool:
        return self.deadline.expired


class FileCalls:
    """The file operations running on one sandbox; :meth:`dispose` ends them all.

    ``disposal`` is set at dispose only: clean-up requests (removing a staged archive
    after a failure) carry it, so they survive a timeout or a cancel but not dispose.
    """

    def __init__(self, *, adapter: str = "remote") -> None:
        self._adapter = adapter
        self._lock = threading.Lock()
        self._running: set[FileCall] = set()
        self._disposed = False
        self._watcher = EventWatcher()
        self._timer = DeadlineTimer("piship-files-timer")
        self.disposal = CancelToken()
        # A sandbox collected undisposed (the lifecycle registry deletes it) ends these too.
        weakref.finalize(self, _close, self._watcher, self._timer)

    @contextmanager
    def begin(
        self, timeout: float | None = None, cancel: threading.Event | None = None
    ) -> Iterator[FileCall]:
        """Run the block as one operation under ``timeout`` (seconds) and ``cancel``.

        A ``timeout`` that is not positive is ``CONFIG_INVALID``; a ``cancel`` already
        set raises ``CommandCancelled`` before anything is sent.
        """
        check_timeout(timeout)
        if cancel is not None and cancel.is_set():
            raise CommandCancelled()
        call = FileCall(timeout)
        with self._lock:
            if self._disposed:
                raise self._disposed_error(running=False)
            self._running.add(call)
        forget = when_cancelled(cancel, self._watcher, lambda: call.stop("cancel"))
        unschedule = (
            None if timeout is None else self._timer.schedule(timeout, lambda: call.stop("timeout"))
        )
        try:
            yield call
        except Exception as error:  # KeyboardInterrupt and the like pass as they are
            reason = call.stopped_by
            if reason is None and call.expired() and _may_be_the_deadline(error):
                reason = "timeout"  # a request's own bound, cut to the deadline, came first
            if reason is None:
                raise
            raise self._stopped_error(reason, call) from None
        finally:
            if unschedule is not None:
                unschedule()
            forget()
            with self._lock:
                self._running.discard(call)

    def dispose(self) -> None:
        """Stop every running operation (each raises its "disposed" error) and refuse new
        ones; the threads stop. Idempotent."""
        with self._lock:
            if self._disposed:
                return
            self._disposed = True
            running = list(self._running)
        self.disposal.set()
        for call in running:
            call.stop("disposed")
        _close(self._watcher, self._timer)

    def _stopped_error(self, reason: Reason, call: FileCall) -> BaseException:
        if reason == "timeout":
            return CommandTimeout(call.timeout or 0)
        if reason == "cancel":
            return CommandCancelled()
        return self._disposed_error(running=True)

    def _disposed_error(self, *, running: bool) -> PiShipError:
        if running:
            text = (
                f"The {self._adapter} sandbox was disposed while a file operation ran; "
                "check what it wrote before trying again"
            )
        else:
            text = f"The {self._adapter} sandbox was disposed; activate a new sandbox"
        return SandboxUnavailable(text, component="files")


def _close(watcher: EventWatcher, timer: DeadlineTimer) -> None:
    watcher.close()
    timer.close()


def _may_be_the_deadline(error: Exception) -> bool:
    """Whether ``error`` may be a request giving up at the deadline (a transport timeout,
    a stream cut, a helper command timed out) rather than a verdict such as a missing
    file."""
    if isinstance(error, (CommandCancelled, TimeoutError)):
        return True
    return isinstance(error, PiShipError) and error.code not in _VERDICTS


_VERDICTS = frozenset({CONFIG_INVALID, FILE_NOT_FOUND, FILE_WRITE_FAILED})
