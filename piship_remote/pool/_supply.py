"""The sandboxes of one pool: at most ``size`` of them, ``warm`` kept ready ahead.

    supply = SandboxSupply(activate, size=4, warm=2, throttle=CreateThrottle(None))
    sandbox = supply.take(Deadline.never(), cancel=None)
    ...
    supply.give_back(sandbox, keep=True)
    supply.close()

``size`` counts every sandbox that exists: ready, leased, being activated and being
deleted. The warm sandboxes are activated by ``piship-pool-warm-N`` threads, one per
warm sandbox, which start at construction and refill as sandboxes are taken; a task
that finds none ready activates its own on its own thread when ``size`` allows.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import deque
from collections.abc import Callable

from piship_remote.model.errors import (
    CommandCancelled,
    PiShipError,
    SandboxUnavailable,
)
from piship_remote.pool._throttle import CreateThrottle
from piship_remote.pool.result import is_refusal
from piship_remote.sandbox.sandbox import Sandbox
from piship_remote.telemetry import carried
from piship_remote.transport.deadline import Deadline

__all__ = [
    "CLOSED_BY_CALLER",
    "CLOSE_DEADLINE",
    "INTERRUPTED",
    "NoSandboxInTime",
    "SandboxSupply",
    "closed_error",
]

_LOG = logging.getLogger("piship_remote")
CLOSE_DEADLINE = 10.0  # seconds close() waits for deletions and activations in flight
_WAKE = 0.05  # how often a waiting take() looks at its cancel event
_WARM_BACKOFF = (0.5, 5.0)  # a failed warm activation's first and longest pause
_BUSY_BACKOFF = (0.5, 10.0)  # a full service's first and longest wait without Retry-After
_BUSY = re.compile(r"HTTP 429\b|too many sandboxes", re.IGNORECASE)


class NoSandboxInTime(Exception):
    """No sandbox could be had before the deadline."""


def service_busy(error: BaseException) -> bool:
    """Whether a create failed because the service is full or rate-limited (429, "too many
    sandboxes"): nothing was created, and waiting helps."""
    if not isinstance(error, PiShipError):
        return False
    return error.retry_after is not None or _BUSY.search(error.message) is not None


def busy_delay(error: BaseException | None, waits: int) -> float:
    """Seconds to wait before wait number ``waits`` (from 1): ``Retry-After`` when the
    service sent one, else 0.5 s doubling up to 10 s."""
    asked = error.retry_after if isinstance(error, PiShipError) else None
    if asked is not None:
        return max(asked, 0.0)
    return min(_BUSY_BACKOFF[0] * 2.0 ** (waits - 1), _BUSY_BACKOFF[1])


CLOSED_BY_CALLER = "closed by the caller (close() or the end of its with block)"
INTERRUPTED = "interrupted (Ctrl-C or the kernel's stop): its running commands were killed"


def closed_error(reason: str) -> PiShipError:
    return SandboxUnavailable(
        f"the sandbox pool was {reason}; its sandboxes were disposed",
        component="pool",
        user_action="Make a new SandboxPool to run more tasks",
    )


class SandboxSupply:
    """Ready, leased and activating sandboxes under one condition variable."""

    def __init__(
        self,
        activate: Callable[[], Sandbox],
        *,
        size: int,
        warm: int,
        throttle: CreateThrottle,
    ) -> None:
        self._activate = activate
        self._size = size
        self._warm = min(warm, size)
        self._throttle = throttle
        lock = threading.RLock()
        self._cond = threading.Condition(lock)  # takers wait on it
        # The warm threads wait on their own condition (the same lock), woken only when a
        # warm slot may have opened: waking every idle warm thread at each take and
        # give-back cost a futex round trip per warm thread and task.
        self._refill = threading.Condition(lock)
        self._ready: deque[Sandbox] = deque()
        self._leased: set[Sandbox] = set()
        self._activating = 0
        self._warming = 0
        self._deleting = 0
        self._closed = threading.Event()
        # A create the service refused for good (a wrong key, an unknown template): every
        # later take() raises it at once instead of sending another doomed create.
        self._refusal: BaseException | None = None
        self._close_reason = CLOSED_BY_CALLER
        self._warmers = [
            # The pool's creator's span is the parent of the warm activations'.
            threading.Thread(
                target=carried(self._keep_warm), name=f"piship-pool-warm-{n}", daemon=True
            )
            for n in range(1, self._warm + 1)
        ]
        for thread in self._warmers:
            thread.start()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def closed_error(self) -> PiShipError:
        """The error of a task or call that finds the pool closed, saying why it closed."""
        return closed_error(self._close_reason)

    def counts(self) -> tuple[int, int, int]:
        """``(ready, leased, existing)``: existing counts activating and deleting ones."""
        with self._cond:
            return len(self._ready), len(self._leased), self._existing()

    def _existing(self) -> int:
        return len(self._ready) + len(self._leased) + self._activating + self._deleting

    def take(self, deadline: Deadline, cancel: threading.Event | None) -> Sandbox:
        """A ready sandbox, else a new one when ``size`` allows, else wait for either.

        Raises :class:`NoSandboxInTime` at ``deadline``,
        ``CommandCancelled`` when ``cancel`` is set, the closed error once closed, and
        the activation's own error when a create fails; once a create was refused for
        good (:func:`~piship_remote.pool.result.is_refusal`), that error, with no create.
        """
        with self._cond:
            while True:
                if self._closed.is_set():
                    raise self.closed_error()
                if cancel is not None and cancel.is_set():
                    raise CommandCancelled()
                if self._refusal is not None:
                    raise self._refusal
                if self._ready:
                    sandbox = self._ready.popleft()
                    self._leased.add(sandbox)
                    self._refill.notify()  # a warm thread refills
                    return sandbox
                if self._existing() < self._size:
                    self._activating += 1
                    break
                self._cond.wait(_wait_time(deadline, cancel))
        return self._lease(self._create(deadline))

    def _lease(self, sandbox: Sandbox) -> Sandbox:
        with self._cond:
            self._activating -= 1
            if not self._closed.is_set():
                self._leased.add(sandbox)
                return sandbox
            self._deleting += 1
        self._delete(sandbox)
        raise self.closed_error()

    def _create(self, deadline: Deadline) -> Sandbox:
        """Activate one sandbox (counted as activating), throttled; on failure uncounted."""
        try:
            if not self._throttle.wait_turn(self._closed, deadline.at):
                if self._closed.is_set():
                    raise self.closed_error()
                raise NoSandboxInTime()
            return self._activate()
        except BaseException as error:
            with self._cond:
                self._activating -= 1
                if is_refusal(error) and self._refusal is None:
                    self._refusal = error
                self._wake_all()
            raise

    def _wake_all(self) -> None:
        """Room may have opened (a sandbox fewer) or the pool closed: every waiter looks."""
        self._cond.notify_all()
        self._refill.notify_all()

    def give_back(self, sandbox: Sandbox, *, keep: bool) -> None:
        """Return a leased sandbox: ready for the next task when ``keep``, else deleted."""
        with self._cond:
            self._leased.discard(sandbox)
            if keep and not self._closed.is_set():
                self._ready.append(sandbox)
                self._cond.notify_all()
                return
            self._deleting += 1
        self._delete(sandbox)

    def _delete(self, sandbox: Sandbox) -> None:
        """Dispose ``sandbox`` (counted as deleting until it is done)."""
        try:
            sandbox.dispose()
        except Exception:  # a failed deletion is logged; the sandbox expires on its own
            _LOG.warning("disposing a pool sandbox failed", exc_info=True)
        finally:
            with self._cond:
                self._deleting -= 1
                self._wake_all()

    def close(self, reason: str = CLOSED_BY_CALLER) -> None:
        """Dispose every sandbox, ready or leased (their commands end at once); idempotent.
        ``reason`` (the first call's) completes "the sandbox pool was ..." in later errors.

        Waits (up to :data:`CLOSE_DEADLINE`) for the deletions and for the activations
        in flight, a task's too (the sandbox one makes is deleted), never for a task.
        """
        with self._cond:
            if self._closed.is_set():
                return
            self._close_reason = reason
            self._closed.set()
            doomed = [*self._ready, *self._leased]
            self._ready.clear()
            self._deleting += len(doomed)
            self._wake_all()
        deleters = [
            threading.Thread(
                target=self._delete, args=(sandbox,), name=f"piship-pool-close-{n}", daemon=True
            )
            for n, sandbox in enumerate(doomed, 1)
        ]
        for thread in deleters:
            thread.start()
        end = Deadline.after(CLOSE_DEADLINE)
        for thread in deleters + self._warmers:
            if thread is not threading.current_thread():
                thread.join(end.remaining())
        with self._cond:  # a task's create that lands now is deleted by _lease
            self._cond.wait_for(
                lambda: self._activating == 0 and self._deleting == 0, end.remaining()
            )

    # -- the warm threads ----------------------------------------------------------------

    def _keep_warm(self) -> None:
        backoff = _WARM_BACKOFF[0]
        while self._claim_warm_slot():
            try:
                sandbox = self._create(Deadline.never())
            except Exception as error:
                with self._cond:
                    self._warming -= 1
                _LOG.warning("activating a warm pool sandbox failed: %s", error)
                asked = error.retry_after if isinstance(error, PiShipError) else None
                if self._closed.wait(max(backoff, asked or 0.0)):
                    return
                backoff = min(backoff * 2, _WARM_BACKOFF[1])
                continue
            backoff = _WARM_BACKOFF[0]
            self._add_ready(sandbox)

    def _claim_warm_slot(self) -> bool:
        """Wait until a warm sandbox is missing and ``size`` allows one; False once closed
        or refused."""
        with self._cond:
            while not self._closed.is_set() and self._refusal is None:
                short = len(self._ready) + self._warming < self._warm
                if short and self._existing() < self._size:
                    self._activating += 1
                    self._warming += 1
                    return True
                self._refill.wait()
            return False

    def _add_ready(self, sandbox: Sandbox) -> None:
        with self._cond:
            self._activating -= 1
            self._warming -= 1
            if not self._closed.is_set():
                self._ready.append(sandbox)
                self._cond.notify_all()
                return
            self._deleting += 1
        self._delete(sandbox)


def _wait_time(deadline: Deadline, cancel: threading.Event | None) -> float | None:
    """How long a take() sleeps before it looks again; raises at the deadline."""
    remaining = deadline.remaining()
    if remaining is None:
        return _WAKE if cancel is not None else None
    if remaining <= 0:
        raise NoSandboxInTime()
    return min(remaining, _WAKE) if cancel is not None else remaining
