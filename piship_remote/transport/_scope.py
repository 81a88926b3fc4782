"""The cancellable call scope: the sockets one request uses, and what ends them.

While a call runs, the calling thread's :class:`CallScope` lives in :data:`CURRENT`.
The pool's connection class registers its socket with that scope when it connects and
again just before it waits for the response headers. Two things shut those sockets
down, so a blocked connect, header wait or body read ends within milliseconds:

- the call's ``cancel`` (:meth:`CallScope.cancel`, raised as ``CommandCancelled``);
- its deadline (:meth:`CallScope.expire`, fired by :class:`DeadlineWatch`, raised as a
  timed-out ``TransportError``). Per-read socket timeouts alone cannot bound an
  exchange: a server sending one byte per second resets them with every byte.

A connection that goes back to the pool is detached from its scope (under the scope's
lock) before it is used again, so a late cancel never hits a connection another call
has since taken from the pool.
"""

from __future__ import annotations

import contextlib
import contextvars
import heapq
import itertools
import socket
import threading
import time
from contextlib import ExitStack

from piship_remote.cancel import CancelToken, EventWatcher, bridge
from piship_remote.errors import CommandCancelled
from piship_remote.redact import Redactor
from piship_remote.transport.failures import (
    NETWORK_ERRORS,
    TransportError,
    failure_code,
    timed_out,
)

__all__ = ["CURRENT", "Call", "CallScope", "DeadlineWatch"]

# Finished calls whose deadline entries are dropped at once (rather than at their
# deadline) when the watch holds more than this many.
_PRUNE_AT = 4096


class CallScope:
    """The sockets one call uses; :meth:`cancel` and :meth:`expire` shut them all down."""

    __slots__ = (
        "_lock",
        "_over",
        "_owned",
        "_sockets",
        "cancelled",
        "deadline",
        "expired",
        "sent",
        "socket",
    )

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.cancelled = False
        self.expired = False  # the deadline passed while the exchange was running
        self.sent = False  # the request may have reached the server
        self.socket: socket.socket | None = None  # the one the response arrives on
        self._over = False  # the deadline no longer applies (finished, or a stream's body)
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._owned: list[socket.socket] = []

    @property
    def stopped(self) -> bool:
        """Cancelled or past its deadline: its sockets are (being) shut down."""
        return self.cancelled or self.expired

    @property
    def over(self) -> bool:
        return self._over

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def attach(self, sock: socket.socket, *, owned: bool = False) -> None:
        """Track ``sock``; shut it down at once if the call is already stopped."""
        with self._lock:
            if owned:
                self._owned.append(sock)
            if not any(s is sock for s in self._sockets):
                self._sockets.append(sock)
            if self.cancelled or self.expired:
                shut(sock)

    def detach(self, sock: socket.socket | None) -> bool:
        """Stop tracking ``sock``; ``False`` when the call was stopped (do not reuse it)."""
        with self._lock:
            self._sockets = [s for s in self._sockets if s is not sock]
            if self.socket is sock:
                # Back in the pool, another thread may own it: never touch it again.
                self.socket = None
            return not (self.cancelled or self.expired)

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

    def expire(self) -> None:
        """The deadline passed: shut the sockets down, unless the deadline no longer applies."""
        with self._lock:
            if self._over or self.cancelled:
                return
            self.expired = True
            for sock in self._sockets:
                shut(sock)

    def end_deadline(self) -> None:
        """From now on the deadline does not apply (a stream's body has its own rules)."""
        with self._lock:
            self._over = True

    def release(self) -> None:
        """Forget every socket and the deadline: a later cancel or expiry touches nothing."""
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


class DeadlineWatch:
    """Expires call scopes at their deadline.

    One lazily started daemon thread (``piship-transport-deadline``) per watch; it
    sleeps until the earliest deadline and stops on :meth:`close`. Watching a call
    costs a heap push; the thread is woken only when that deadline is the new earliest.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._due: list[tuple[float, int, CallScope]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, scope: CallScope) -> None:
        deadline = scope.deadline
        if deadline is None:
            return
        with self._lock:
            if self._closed:
                return
            earliest = not self._due or deadline < self._due[0][0]
            if len(self._due) >= _PRUNE_AT:
                self._due = [entry for entry in self._due if not entry[2].over]
                heapq.heapify(self._due)
            heapq.heappush(self._due, (deadline, next(self._order), scope))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="piship-transport-deadline", daemon=True
                )
                self._thread.start()
            elif earliest:
                self._lock.notify()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._due = []
            thread, self._thread = self._thread, None
            self._lock.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                due = self._wait_for_due()
                if due is None:
                    return
            for scope in due:
                scope.expire()

    def _wait_for_due(self) -> list[CallScope] | None:
        """The scopes whose deadline has passed (``None``: closed); holds the lock."""
        while not self._closed:
            if not self._due:
                self._lock.wait()
                continue
            now = time.monotonic()
            wait = self._due[0][0] - now
            if wait > 0:
                self._lock.wait(wait)
                continue
            due: list[CallScope] = []
            while self._due and self._due[0][0] <= now:
                due.append(heapq.heappop(self._due)[2])
            return due
        return None


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
        deadline: float | None,
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
        self._cleanup: ExitStack | None = None

    def watch(self, cancel: threading.Event, watcher: EventWatcher) -> None:
        stack = self._cleanup = ExitStack()
        token = (
            cancel
            if isinstance(cancel, CancelToken)
            else stack.enter_context(bridge(cancel, watcher))
        )
        stack.callback(token.on_cancel(self.scope.cancel))

    def finish(self) -> None:
        """Stop listening for cancellation and forget the sockets (idempotent)."""
        self.scope.release()
        stack, self._cleanup = self._cleanup, None
        if stack is not None:
            stack.close()

    def error(self, exc: BaseException) -> BaseException:
        """The exception to raise for ``exc``: cancelled, timed out, failed, or ``exc``."""
        if isinstance(exc, NETWORK_ERRORS):
            if self.scope.cancelled:
                return CommandCancelled()
            if self.scope.expired:
                return self.failed("timed out")
        if isinstance(exc, ValueError) or not isinstance(exc, NETWORK_ERRORS):
            return exc  # a bad argument or a bug, not a network failure
        return self.failed("timed out" if timed_out(exc) else f"failed: {failure_code(exc)}")

    def stopped_error(self) -> BaseException | None:
        """What a read on a stopped call raises (a shut-down socket can look like an end)."""
        if self.scope.cancelled:
            return CommandCancelled()
        if self.scope.expired:
            return self.failed("timed out")
        return None

    def failed(self, outcome: str) -> TransportError:
        return TransportError(
            f"{self.component} request to {self.label} {outcome}",
            request_sent=self.scope.sent,
            component=self.component,
        )
