"""The lease of one E2B sandbox: a renewal per command, overlapped and shared, and a keepalive.

Every command renews the sandbox's timeout, but it does not wait for the answer
before it sends Start: the renewal is put on the wire first (by the
``piship-e2b-lease-…`` worker), Start follows at once, and the command waits
for the renewal's answer only before it reports anything. Commands that start
while one renewal is in flight share it. The same worker renews an idle sandbox
every ``keepalive_every`` seconds, so a short lifetime is safe between commands.

The clock rules of a Kubernetes claim apply: elapsed time is the larger advance
of the wall and monotonic clocks, the committed end only moves later, and a
sandbox whose committed end has passed is never renewed (a renewal would
revive nothing and could hide that its processes are gone)::

    lease = SandboxLease(renew, clock, anchor, keepalive_every=900.0, name="sbx1", errors=e)
    renewal = lease.begin()          # per command; raises once the sandbox expired
    renewal.wait_sent(token)         # the renewal is on the wire: send Start now
    renewal.result(token)            # before reporting: raises the refusal
    lease.dispose()
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from piship_remote._cancel import CancelToken
from piship_remote.backends._common import SandboxErrors
from piship_remote.backends.lifetime import Anchor, ClaimClock
from piship_remote.errors import CommandCancelled, PiShipError
from piship_remote.transport import when_sent

__all__ = ["Renewal", "SandboxLease"]

Renew = Callable[[CancelToken], None]


class Renewal:
    """One renewal request: on the wire (``sent``), then answered (``done``)."""

    __slots__ = ("_done", "_error", "_sent")

    def __init__(self) -> None:
        self._sent = CancelToken()
        self._done = CancelToken()
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


def _wait(state: CancelToken, cancel: CancelToken) -> None:
    """Wait until ``state`` is set; ``CommandCancelled`` if ``cancel`` fires first."""
    if state.is_set():
        return
    woken = threading.Event()
    forget = (state.on_cancel(woken.set), cancel.on_cancel(woken.set))
    try:
        woken.wait()
    finally:
        for unsubscribe in forget:
            unsubscribe()
    if not state.is_set():
        raise CommandCancelled()


class SandboxLease:
    """The renewals of one sandbox, on one worker thread; thread-safe."""

    def __init__(
        self,
        renew: Renew,
        clock: ClaimClock,
        anchor: Anchor,
        *,
        keepalive_every: float,
        name: str,
        errors: SandboxErrors,
    ) -> None:
        self._renew = renew
        self._clock = clock
        self._anchor = anchor
        self._committed = anchor.expires
        self._every = keepalive_every
        self._name = f"piship-e2b-lease-{name}"
        self._errors = errors
        self._wake = threading.Condition()
        self._pending: Renewal | None = None  # asked for, not yet taken by the worker
        self._flight: Renewal | None = None  # the renewal commands may still share
        self._worker: threading.Thread | None = None
        self._closing = CancelToken()
        self._disposed = False

    def start(self) -> None:
        """Start the keepalive (idempotent)."""
        with self._wake:
            self._ensure_worker()

    def begin(self) -> Renewal:
        """The renewal covering a command starting now: the one in flight, or a new one."""
        with self._wake:
            if self._disposed:
                raise self._errors("the sandbox was disposed")
            if self._expired():
                raise self._expired_error()
            flight = self._flight
            if flight is None or flight.finished:
                flight = Renewal()
                self._flight = self._pending = flight
                self._ensure_worker()
                self._wake.notify()
            return flight

    def dispose(self) -> None:
        """Stop the keepalive and abort a renewal in flight; idempotent."""
        with self._wake:
            self._disposed = True
            worker, self._worker = self._worker, None
            self._wake.notify()
        self._closing.set()
        if worker is not None and worker is not threading.current_thread():
            worker.join()

    # -- the worker ---------------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        if self._worker is None and not self._disposed:
            self._worker = threading.Thread(target=self._work, name=self._name, daemon=True)
            self._worker.start()

    def _work(self) -> None:
        while True:
            with self._wake:
                if self._pending is None and not self._disposed:
                    self._wake.wait(self._every)
                if self._disposed:
                    pending, self._pending = self._pending, None
                    break
                renewal, self._pending = self._pending, None
                if renewal is None:  # idle for a whole interval: the keepalive
                    if self._expired():
                        return  # nothing left to keep alive
                    renewal = Renewal()
            self._send(renewal)
        if pending is not None:
            pending._finish(self._errors("the sandbox was disposed"))

    def _send(self, renewal: Renewal) -> None:
        with self._wake:
            elapsed = self._clock.claim_time(self._anchor)
            if elapsed >= self._committed:
                renewal._finish(self._expired_error())
                return
        try:
            with when_sent(renewal._mark_sent):
                self._renew(self._closing)
        except BaseException as error:
            renewal._finish(error)
            return
        with self._wake:
            # The service counts from when it got the request, which is later than this.
            self._committed = max(self._committed, elapsed + self._clock.lifetime)
        renewal._finish(None)

    def _expired(self) -> bool:
        return self._clock.claim_time(self._anchor) >= self._committed

    def _expired_error(self) -> PiShipError:
        return self._errors(
            "the sandbox's lifetime ended, so it is gone; start a new session",
        )
