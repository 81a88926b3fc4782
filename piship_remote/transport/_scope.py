"""The cancellable call scope: the sockets one request uses, its deadline, its cancel.

While a call runs, the calling thread's :class:`CallScope` lives in :data:`CURRENT`.
The pool's connection class registers its socket with that scope when it connects and
again just before it waits for the response headers; the call's ``cancel`` shuts
those sockets down (:meth:`CallScope.cancel`), so a blocked connect, header wait or
body read ends within milliseconds with ``CommandCancelled``.

The deadline bounds the whole exchange: every read of the response (headers and
body) gets only the time that is left (:class:`DeadlineReader`), so a server sending
one byte per second cannot stretch it, as it would a per-read socket timeout.

A connection that goes back to the pool is detached from its scope (under the scope's
lock) before it is used again, so a late cancel never hits a connection another call
has since taken from the pool.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any

from piship_remote.model.errors import CommandCancelled
from piship_remote.model.redact import Redactor
from piship_remote.transport._cancel import CancelToken, EventWatcher, bridge
from piship_remote.transport.deadline import Deadline
from piship_remote.transport.failures import (
    NETWORK_ERRORS,
    TransportError,
    failure_code,
    timed_out,
)

__all__ = ["CURRENT", "ON_SENT", "Call", "CallScope", "DeadlineReader", "when_sent"]


class CallScope:
    """The sockets one call uses (:meth:`cancel` shuts them all down) and its deadline."""

    __slots__ = (
        "_lock",
        "_over",
        "_owned",
        "_sockets",
        "cancelled",
        "deadline",
        "sent",
        "socket",
    )

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.cancelled = False
        self.sent = False  # the request may have reached the server
        self.socket: socket.socket | None = None  # the one the response arrives on
        self._over = False  # the deadline no longer applies (finished, or a stream's body)
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._owned: list[socket.socket] = []

    @property
    def over(self) -> bool:
        """The deadline no longer applies (the call finished, or a stream's body began)."""
        return self._over

    def remaining(self) -> float | None:
        return self.deadline.remaining()

    def read_timeout(self) -> float | None:
        """The socket timeout the next read gets: what is left of the deadline.

        Raises ``TimeoutError`` (a socket timeout) once the deadline has passed.
        """
        if self._over:
            return None
        remaining = self.deadline.remaining()
        if remaining is None:
            return None
        if remaining <= 0:
            raise TimeoutError("the deadline passed")
        return remaining

    def attach(self, sock: socket.socket, *, owned: bool = False) -> None:
        """Track ``sock``; shut it down at once if the call is already cancelled."""
        with self._lock:
            if owned:
                self._owned.append(sock)
            if not any(s is sock for s in self._sockets):
                self._sockets.append(sock)
            if self.cancelled:
                shut(sock)

    def detach(self, sock: socket.socket | None) -> bool:
        """Stop tracking ``sock``; ``False`` when the call was cancelled (do not reuse it)."""
        with self._lock:
            self._sockets = [s for s in self._sockets if s is not sock]
            if self.socket is sock:
                # Back in the pool, another thread may own it: never touch it again.
                self.socket = None
            return not self.cancelled

    def drop_owned(self) -> None:
        """Close the duplicates made to cover a TLS handshake (the handshake is over)."""
        if not self._owned:  # only the calling thread adds to it
            return
        with self._lock:
            owned, self._owned = self._owned, []
            self._sockets = [s for s in self._sockets if not any(s is o for o in owned)]
        for sock in owned:
            sock.close()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            for sock in self._sockets:
                shut(sock)

    def end_deadline(self) -> None:
        """From now on the deadline does not apply (a stream's body has its own rules)."""
        with self._lock:
            self._over = True

    def release(self) -> None:
        """Forget every socket and the deadline: a later cancel touches nothing."""
        self.drop_owned()
        with self._lock:
            self._over = True
            self._sockets = []
            self.socket = None


def shut(sock: socket.socket) -> None:
    # socket.socket.shutdown, not SSLSocket.shutdown: the latter also drops the TLS
    # object under a reader that may still be using it. OSError: already closed.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


# The scope of the call the current thread is making (set only while it makes it).
CURRENT: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar(
    "piship_transport_call", default=None
)

# Called by the connection once a request's headers and body are written (see when_sent).
ON_SENT: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "piship_on_sent", default=None
)


@contextlib.contextmanager
def when_sent(callback: Callable[[], None]) -> Iterator[None]:
    """Call ``callback`` as soon as the requests sent in this block are on the wire.

    It fires after the connection wrote the request, before the answer is read,
    so another request can follow without waiting for it.
    """
    token = ON_SENT.set(callback)
    try:
        yield
    finally:
        ON_SENT.reset(token)


class Call:
    """One request's cancellation scope, deadline and the cleanup that ends it."""

    __slots__ = (
        "_cleanup",
        "component",
        "idle_timeout",
        "label",
        "origin",
        "redactor",
        "scope",
        "stream",
    )

    def __init__(
        self,
        component: str,
        redactor: Redactor,
        target: tuple[str, str],
        deadline: Deadline,
        *,
        stream: bool,
        idle_timeout: float | None,
    ) -> None:
        self.component = component
        self.redactor = redactor
        self.label, self.origin = target  # host[:port] for messages, scheme://netloc
        self.scope = CallScope(deadline)
        self.stream = stream
        self.idle_timeout = idle_timeout
        self._cleanup: Callable[[], object] | None = None

    def watch(self, cancel: threading.Event, watcher: EventWatcher) -> None:
        if isinstance(cancel, CancelToken):  # the usual case: nothing to bridge
            self._cleanup = cancel.on_cancel(self.scope.cancel)
            return
        stack = ExitStack()
        token = stack.enter_context(bridge(cancel, watcher))
        stack.callback(token.on_cancel(self.scope.cancel))
        self._cleanup = stack.close

    def finish(self) -> None:
        """Stop listening for cancellation and forget the sockets (idempotent)."""
        self.scope.release()
        cleanup, self._cleanup = self._cleanup, None
        if cleanup is not None:
            cleanup()

    def error(self, exc: BaseException) -> BaseException:
        """The exception to raise for ``exc``: cancelled, timed out, failed, or ``exc``."""
        if self.scope.cancelled and isinstance(exc, NETWORK_ERRORS):
            return CommandCancelled()
        if isinstance(exc, ValueError) or not isinstance(exc, NETWORK_ERRORS):
            return exc  # a bad argument or a bug, not a network failure
        return self.failed("timed out" if timed_out(exc) else f"failed: {failure_code(exc)}")

    def failed(self, outcome: str) -> TransportError:
        return TransportError(
            f"{self.component} request to {self.label} {outcome}",
            request_sent=self.scope.sent,
            component=self.component,
        )


class DeadlineReader(io.RawIOBase):
    """A socket's reader that gives every read only what is left of the call's deadline.

    Wraps the raw reader ``socket.makefile("rb", buffering=0)`` returns (so the socket
    stays open while the response reads, as http.client expects); once the deadline no
    longer applies, reads go straight through.
    """

    def __init__(self, sock: socket.socket, scope: CallScope) -> None:
        super().__init__()
        self._raw = sock.makefile("rb", buffering=0)
        self._sock = sock
        self._scope = scope

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        timeout = self._scope.read_timeout()
        if timeout is not None:
            self._sock.settimeout(timeout)
        return self._raw.readinto(buffer)

    def close(self) -> None:
        self._raw.close()
        super().close()
