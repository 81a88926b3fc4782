"""The lease of one E2B sandbox: a renewal per command, overlapped and shared, and a keepalive.

Every command renews the sandbox's timeout, but it does not wait for the answer
before it sends Start: the command's own thread writes the renewal, sends Start
as soon as the renewal is on the wire (from the transport's ``when_sent``
callback, before the renewal's answer is read), then reads the renewal's
answer before it reports anything. Commands that start while one renewal is in
flight share it. The ``piship-e2b-lease-…`` worker renews an idle sandbox
``keepalive_every`` seconds after the last renewal, so a short lifetime is safe
between commands. A command's renewal is part of the command (``renew``); the
worker's stands alone (``keepalive``), so the two are given separately.

The clock rules of a Kubernetes claim apply: elapsed time is the larger advance
of the wall and monotonic clocks, the committed end only moves later, and a
sandbox whose committed end has passed is never renewed (a renewal would
revive nothing and could hide that its processes are gone)::

    lease = SandboxLease(renew, keepalive, clock, anchor, keepalive_every=900.0, name="sbx1",
                         errors=e)
    response = lease.cover(lambda: send_start(...), token, refused=kill)
    # the renewal was answered: nothing is reported from a sandbox it failed for
    lease.dispose()
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from piship_remote.backends._common import SandboxErrors
from piship_remote.backends.lifetime import Anchor, ClaimClock
from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.transport import TransportError, when_sent
from piship_remote.transport._cancel import CancelToken

__all__ = ["Renewal", "SandboxLease"]

Renew = Callable[[CancelToken], None]


class _Closeable(Protocol):
    def close(self) -> None: ...


Started = TypeVar("Started", bound=_Closeable)

# What a renewal's refusal is (its failures below HTTP, too); anything else ends the command.
_REFUSALS = (PiShipError, TransportError)


class _Flag:
    """Set once; runs the callbacks registered before (what ``_wait`` needs of a token).

    Lighter than a ``CancelToken`` (an event, a condition and two locks): every
    command makes two, and only a command sharing the renewal waits on them.
    """

    __slots__ = ("_callbacks", "_lock", "_set")

    def __init__(self) -> None:
        self._set = False
        self._lock = threading.Lock()
        self._callbacks: dict[int, Callable[[], None]] = {}

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set = True
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` when set (at once if it is); returns what unregisters it."""
        with self._lock:
            if not self._set:
                key = id(callback)
                self._callbacks[key] = callback
                return lambda: self._forget(key)
        callback()
        return _nothing

    def _forget(self, key: int) -> None:
        with self._lock:
            self._callbacks.pop(key, None)


def _nothing() -> None:
    return None


class Renewal:
    """One renewal request: on the wire (``sent``), then answered (``done``)."""

    __slots__ = ("_done", "_error", "_sent")

    def __init__(self) -> None:
        self._sent = _Flag()
        self._done = _Flag()
        self._error: BaseException | None = None

    @property
    def finished(self) -> bool:
        """Whether the answer arrived (or the renewal failed)."""
        return self._done.is_set()

    def wait_sent(self, cancel: CancelToken) -> None:
        """Wait until the request was written (or the renewal ended); raise its failure."""
        _wait(self._sent, cancel)
        if self._done.is_set():
            self.result(cancel)

    def result(self, cancel: CancelToken) -> None:
        """Wait for the answer; raise the refusal or the failure."""
        _wait(self._done, cancel)
        if self._error is not None:
            raise self._error.with_traceback(None)

    def _mark_sent(self) -> None:
        self._sent.set()

    def _finish(self, error: BaseException | None) -> None:
        self._error = error
        self._done.set()
        self._sent.set()


def _wait(state: _Flag, cancel: CancelToken) -> None:
    """Wait until ``state`` is set; ``CommandCancelled`` if ``cancel`` fires first."""
    if state.is_set():
        return
    woken: queue.SimpleQueue[None] = queue.SimpleQueue()  # lighter than an Event to wait on

    def wake() -> None:
        woken.put(None)

    forget = (state.on_cancel(wake), cancel.on_cancel(wake))
    try:
        woken.get()
    finally:
        for unsubscribe in forget:
            unsubscribe()
    if not state.is_set():
        raise CommandCancelled()


class _Follow:
    """What a command sends once its renewal is on the wire, and what came of it."""

    __slots__ = ("failure", "ran", "renewal", "send", "started")

    def __init__(self, renewal: Renewal, send: Callable[[], _Closeable] | None) -> None:
        self.renewal = renewal
        self.send = send
        self.ran = send is None
        self.started: _Closeable | None = None
        self.failure: BaseException | None = None

    def on_sent(self) -> None:
        """The renewal is written: let sharers go, then send (once; never raises)."""
        if self.renewal._sent.is_set():
            return  # the follow-up's own write, or the renewal repeated after a 401
        self.renewal._mark_sent()
        self.run()

    def run(self) -> None:
        if self.ran:
            return
        self.ran = True
        assert self.send is not None
        try:
            self.started = self.send()
        except BaseException as error:
            self.failure = error


class SandboxLease:
    """The renewals of one sandbox: on the commands' threads, and a keepalive worker."""

    def __init__(
        self,
        renew: Renew,
        keepalive: Renew,
        clock: ClaimClock,
        anchor: Anchor,
        *,
        keepalive_every: float,
        name: str,
        errors: SandboxErrors,
    ) -> None:
        self._renew = renew
        self._keepalive = keepalive
        self._clock = clock
        self._anchor = anchor
        self._committed = anchor.expires
        self._every = keepalive_every
        self._name = f"piship-e2b-lease-{name}"
        self._errors = errors
        self._wake = threading.Condition()
        self._flight: Renewal | None = None  # the renewal commands may still share
        self._renewed_at = time.monotonic()  # when the last renewal went out (real time)
        self._worker: threading.Thread | None = None
        self._closing = CancelToken()
        self._disposed = False

    def start(self) -> None:
        """Start the keepalive (idempotent)."""
        with self._wake:
            self._ensure_worker()

    def cover(
        self,
        send: Callable[[], Started],
        cancel: CancelToken,
        *,
        refused: Callable[[], None],
    ) -> Started:
        """``send()`` under a renewal: sent once the renewal is on the wire, returned once
        it was answered.

        A refused or failed renewal closes what ``send`` returned, calls ``refused``
        (the command it started must not run on) and raises the refusal. When ``send``
        fails, a failed renewal is the better explanation and is raised instead.
        """
        while True:
            renewal, own = self._claim()
            if own:
                started = self._send_covered(renewal, send, cancel, refused)
                assert started is not None
                return started
            try:
                renewal.wait_sent(cancel)
            except CommandCancelled:
                if cancel.is_set():
                    raise
                continue  # the command that owned it was cancelled: renew afresh
            return self._after_shared(renewal, send, cancel, refused)

    def dispose(self) -> None:
        """Stop the keepalive; idempotent (renewals in flight end with their commands)."""
        with self._wake:
            self._disposed = True
            worker, self._worker = self._worker, None
            self._wake.notify()
        self._closing.set()
        if worker is not None and worker is not threading.current_thread():
            worker.join()

    # -- a command's renewal ----------------------------------------------------------------

    def _claim(self) -> tuple[Renewal, bool]:
        """The renewal covering a command starting now, and whether the caller sends it."""
        with self._wake:
            if self._disposed:
                raise self._errors("the sandbox was disposed")
            if self._expired():
                raise self._expired_error()
            flight = self._flight
            if flight is not None and not flight.finished:
                return flight, False
            flight = self._flight = Renewal()
            return flight, True

    def _after_shared(
        self,
        renewal: Renewal,
        send: Callable[[], Started],
        cancel: CancelToken,
        refused: Callable[[], None],
    ) -> Started:
        """Send on another command's renewal, then wait for its answer."""
        try:
            started = send()
        except _REFUSALS:
            with contextlib.suppress(CommandCancelled):
                renewal.result(cancel)  # a refusal explains the failure better
            raise
        try:
            renewal.result(cancel)
        except CommandCancelled:
            if cancel.is_set():
                started.close()
                raise
            # The owner was cancelled before the answer: this command renews on its own.
            self._confirm_alone(started, cancel, refused)
        except _REFUSALS:
            started.close()
            refused()
            raise
        except BaseException:
            started.close()
            raise
        return started

    def _confirm_alone(
        self, started: _Closeable, cancel: CancelToken, refused: Callable[[], None]
    ) -> None:
        while True:
            renewal, own = self._claim()
            try:
                if own:
                    self._send_covered(renewal, None, cancel, refused)
                else:
                    renewal.result(cancel)
                return
            except CommandCancelled:
                if cancel.is_set():
                    started.close()
                    raise
            except _REFUSALS:
                started.close()
                refused()
                raise
            except BaseException:
                started.close()
                raise

    def _send_covered(
        self,
        renewal: Renewal,
        send: Callable[[], Started] | None,
        cancel: CancelToken,
        refused: Callable[[], None],
    ) -> Started | None:
        """Send ``renewal`` on this thread, ``send()`` as soon as it is written."""
        follow = _Follow(renewal, send)
        error = self._renew_now(self._renew, renewal, cancel, follow.on_sent)
        if error is None:
            follow.run()  # a client that never reports the write: send after the answer
        started, failure = follow.started, follow.failure
        if failure is not None and not isinstance(failure, (*_REFUSALS, CommandCancelled)):
            raise failure  # Ctrl-C or a bug while sending: not hidden by the renewal's outcome
        if error is not None:
            if started is not None:
                started.close()
                if isinstance(error, _REFUSALS):
                    refused()
            raise error.with_traceback(None)
        if failure is not None:
            raise failure
        return started  # type: ignore[return-value]

    def _renew_now(
        self, renew: Renew, renewal: Renewal, cancel: CancelToken, on_sent: Callable[[], None]
    ) -> BaseException | None:
        """One renewal on this thread; its failure (also given to the sharers) or ``None``."""
        with self._wake:
            elapsed = self._clock.claim_time(self._anchor)
            if elapsed >= self._committed:
                error: BaseException = self._expired_error()
                renewal._finish(error)
                return error
            self._renewed_at = time.monotonic()
        try:
            with when_sent(on_sent):
                renew(cancel)
        except BaseException as failure:
            renewal._finish(failure)
            return failure
        with self._wake:
            # The service counts from when it got the request, which is later than this.
            self._committed = max(self._committed, elapsed + self._clock.lifetime)
        renewal._finish(None)
        return None

    # -- the keepalive worker ---------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._worker is None and not self._disposed:
            self._worker = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while True:
            with self._wake:
                while not self._disposed:
                    idle = self._renewed_at + self._every - time.monotonic()
                    if idle <= 0:
                        break
                    self._wake.wait(idle)
                if self._disposed or self._expired():
                    return  # disposed, or nothing left to keep alive
            renewal = Renewal()
            self._renew_now(self._keepalive, renewal, self._closing, renewal._mark_sent)

    def _expired(self) -> bool:
        return self._clock.claim_time(self._anchor) >= self._committed

    def _expired_error(self) -> PiShipError:
        return self._errors(
            "the sandbox's lifetime ended, so it is gone; activate a new sandbox",
        )
