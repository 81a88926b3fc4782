"""The refcounted claim manager behind one prepared Kubernetes sandbox.

Commands share one live SandboxClaim (a *lease*). The manager

- creates it once for any number of concurrent commands (on a
  ``piship-claim-create`` thread, so a command that is cancelled while waiting
  does not cancel the creation the others wait for);
- before a command, replaces a claim that expired locally or that the cluster
  lost, renews one with less than half its lifetime left, and checks that the
  cluster still has it, except before a direct command within the *existence
  window* (below): then a ``piship-claim-check`` thread refreshes the sighting once
  past half the window;
- counts the commands running in each lease and ticks a ``piship-keepalive-…``
  timer every ``max(0.25, lifetime / 4)`` seconds from the first claim on: a tick
  renews a lease commands run in, and an idle one once less than half its lifetime
  is left (never one past its committed shutdownTime), so a short lifetime is
  safe between commands;
- deletes a *retired* lease (cancelled in, outcome unknown, gone) once its last
  command has left, and never renews it again;
- on :meth:`ClaimManager.dispose` aborts everything in flight, deletes every
  claim it holds and never creates another one.

One lock guards all of this state and is never held during HTTP. The HTTP side
is a :class:`ClaimApi`, so the manager can be driven by a fake in tests::

    manager = ClaimManager(api, ClaimClock.for_lifetime(3600), keepalive_every=900,
                           existence_window=1.0)
    manager.prepare()                      # the first claim, synchronously
    with manager.command(token, direct=True) as use:    # token: a CancelToken
        run_in(use.claim)                  # use.retire() if the sandbox is in doubt
    manager.dispose()

The existence window (:class:`ExistenceWindow`): a claim the API saw alive (its
readiness, an existence check or a renewal) less than the window ago runs a direct
command without a check; past half the window a background check refreshes the
sighting, past the whole window the command checks first. A sighting is timed from
when its request was *sent*; its age is, like a claim's elapsed lifetime, the larger
advance of the wall and the monotonic clock (a suspend counts, a backward jump does
not). A window of 0 checks before every command::

    window = ExistenceWindow(existence_window_seconds(1.0), clock)
    sent = window.now()           # read just before the request is sent
    window.verdict(sent)          # TRUST, REFRESH (trust, check in the background) or CHECK

The module also holds the values the manager hands out (:class:`Claim`,
:class:`ClaimUse`, :class:`ClaimGone`) and its threads' helpers (the re-arming
:class:`Keepalive` timer, the cancellable :func:`wait_for`).
"""

from __future__ import annotations

import enum
import math
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager, suppress
from typing import Protocol

import attrs

from piship_remote.backends._common import SandboxErrors
from piship_remote.backends.lifetime import Anchor, ClaimClock, Freshness, micros
from piship_remote.model.errors import CommandCancelled, ConfigInvalid, PiShipError
from piship_remote.telemetry import Telemetry
from piship_remote.telemetry.logs import info
from piship_remote.telemetry.names import CLAIM_RENEW_SPAN
from piship_remote.transport._cancel import CancelToken

__all__ = [
    "DEFAULT_EXISTENCE_WINDOW",
    "Claim",
    "ClaimApi",
    "ClaimGone",
    "ClaimManager",
    "ClaimUse",
    "ExistenceWindow",
    "Keepalive",
    "Sighting",
    "Trust",
    "disposed_error",
    "existence_window_seconds",
    "wait_for",
]


DEFAULT_EXISTENCE_WINDOW = 1.0


def existence_window_seconds(value: object) -> float:
    """``value`` as a window in seconds; ``PiShipError`` (``CONFIG_INVALID``) unless >= 0.

    >>> existence_window_seconds(0)
    0.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _invalid(f"existence_window must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise _invalid(f"existence_window must be a finite number of seconds >= 0, not {value!r}")
    return seconds


def _invalid(message: str) -> PiShipError:
    return ConfigInvalid(
        message,
        user_action="Pass existence_window=0 to check the claim before every command, "
        "or a positive number of seconds",
        component="sandbox",
    )


@attrs.frozen
class Sighting:
    """Both clocks (µs) read just before a request that found the claim alive was sent."""

    wall: int
    monotonic: int


class Trust(enum.Enum):
    """Whether a direct command may skip the existence check."""

    TRUST = "trust"  # seen alive less than half the window ago
    REFRESH = "refresh"  # within the window, past its half: trust, and check in the background
    CHECK = "check"  # never seen, seen too long ago, or a window of 0: check first


@attrs.frozen
class ExistenceWindow:
    """The existence window of one backend, in microseconds, on its claim clock."""

    span: int
    clock: ClaimClock

    @classmethod
    def of(cls, seconds: float, clock: ClaimClock) -> ExistenceWindow:
        """A window of ``seconds`` (validated by :func:`existence_window_seconds`)."""
        return cls(micros(existence_window_seconds(seconds)), clock)

    def now(self) -> Sighting:
        """Both clocks now: read it just before sending a request that may see the claim."""
        return Sighting(micros(self.clock.now()), micros(self.clock.monotonic()))

    def age(self, seen: Sighting) -> int:
        """Microseconds since ``seen``: the larger advance of the two clocks, never negative."""
        wall = micros(self.clock.now()) - seen.wall
        monotonic = micros(self.clock.monotonic()) - seen.monotonic
        return max(wall, monotonic, 0)

    def verdict(self, seen: Sighting | None) -> Trust:
        """What a direct command needs before it runs, given the latest sighting."""
        if seen is None or self.span <= 0:
            return Trust.CHECK
        age = self.age(seen)
        if age >= self.span:
            return Trust.CHECK
        return Trust.REFRESH if 2 * age >= self.span else Trust.TRUST

    def newer(self, seen: Sighting | None, other: Sighting) -> Sighting:
        """The more recent of two sightings (``other`` when ``seen`` is missing)."""
        if seen is None:
            return other
        return other if self.age(other) < self.age(seen) else seen


class ClaimGone(Exception):
    """The claim cannot be used any more: expired locally, or the cluster lost it."""


@attrs.frozen
class Claim:
    """A ready SandboxClaim: its name, the router's id for its sandbox, and its clock anchor.

    ``seen``: when the request that found it ready was sent (``None``: unknown, the
    manager then counts from the start of its creation).
    """

    name: str
    sandbox: str
    anchor: Anchor
    pod_ip: str | None = None
    seen: Sighting | None = attrs.field(default=None, eq=False)
    uid: str | None = None
    """The Sandbox's UID, when it was read (the router's ``X-Sandbox-UID``)."""
    service_fqdn: str | None = None
    """The Sandbox's Service name (``status.serviceFQDN``; only sandboxes with a Service)."""
    node_name: str | None = None
    """The node its pod runs on (``status.nodeName``)."""
    pod_name: str | None = None
    """Its pod (the ``agents.x-k8s.io/pod-name`` annotation, else the Sandbox's name)."""
    sandboxd_grpc: str | None = None
    """Where its pod's sandboxd serves gRPC (``SANDBOXD_GRPC_ADDR``), when it runs one."""
    sandboxd_rest: str | None = None
    """Where its pod's sandboxd serves REST (``SANDBOXD_REST_ADDR``)."""


class ClaimApi(Protocol):
    """The cluster calls the manager needs (:mod:`piship_remote.backends.kubernetes.backend`)."""

    def create(self, anchor: Anchor, cancel: CancelToken) -> Claim:
        """Create a claim whose shutdownTime is ``anchor.expires`` and wait until it is ready.

        On any failure it deletes what it created before raising.
        """
        ...

    def renew(self, claim: Claim, shutdown: int, cancel: CancelToken) -> None:
        """Move the claim's shutdownTime to ``shutdown`` (µs); :class:`ClaimGone` on 404."""
        ...

    def check(self, claim: Claim, cancel: CancelToken) -> None:
        """Confirm the claim still exists and has not failed; :class:`ClaimGone` otherwise."""
        ...

    def delete(self, claim: Claim) -> None:
        """Delete the claim (errors are ignored by the manager)."""
        ...


@attrs.frozen
class ClaimUse:
    """The claim one command runs in; :meth:`retire` it when the sandbox is in doubt.

    ``cancel`` fires when the command is cancelled or the manager disposed.
    """

    claim: Claim
    cancel: CancelToken
    _retire: Callable[[bool], None]
    _exists: Callable[[], bool | None] = lambda: None

    def retire(self, *, gone: bool = False) -> None:
        """No later command uses this claim; it is deleted once no command runs in it.

        ``gone=True``: the cluster or router no longer has it, so stop renewing it too.
        """
        self._retire(gone)

    def exists(self) -> bool | None:
        """Ask the API once: ``False`` when the claim is gone (it is then retired as gone),
        ``True`` when the API still has it, ``None`` when the API could not say or the
        command was cancelled meanwhile."""
        return self._exists()


class Keepalive(threading.Timer):
    """A re-arming timer: calls ``tick(self)`` every ``interval`` seconds until stopped."""

    def __init__(self, interval: float, tick: Callable[[Keepalive], None], name: str) -> None:
        super().__init__(interval, tick, args=(self,))
        self.name = name
        self.daemon = True
        self.abort = CancelToken()  # set on stop: ends a renewal in flight

    def run(self) -> None:
        while not self.finished.wait(self.interval):
            self.function(*self.args, **self.kwargs)

    def stop(self, grace: float = 0.0) -> None:
        """Stop ticking; a tick in progress gets ``grace`` seconds, then its request is aborted.

        The grace lets a renewal already answered (say, with "gone") take effect.
        """
        self.cancel()
        if self is threading.current_thread():
            return
        self.join(grace)
        self.abort.set()
        self.join()


def wait_for(future: Future[None], cancel: CancelToken, timeout: float | None = None) -> None:
    """Wait until ``future`` is done; ``CommandCancelled`` when ``cancel`` fires (or
    ``timeout`` seconds pass) first."""
    if future.done():
        return
    woken = threading.Event()
    future.add_done_callback(lambda _future: woken.set())
    forget = cancel.on_cancel(woken.set)
    try:
        woken.wait(timeout)
    finally:
        forget()
    if not future.done():
        raise CommandCancelled()


# How often one command may find its lease replaced under it before giving up.
_ATTEMPTS = 3
# How long the last command leaving a claim lets a renewal in flight finish.
_TICK_GRACE = 0.5
_ERRORS = SandboxErrors()


def disposed_error() -> PiShipError:
    """The error of a command that meets a disposed manager."""
    return _ERRORS("the sandbox was disposed")


@attrs.define(eq=False)
class _Lease:
    """One claim and the commands using it. Mutated only under the manager's lock."""

    future: Future[Claim] = attrs.field(factory=Future)
    users: int = 0
    retired: bool = False  # no new command may use it; deleted once unused
    gone: bool = False  # expired or lost by the cluster: renewing is pointless
    deleted: bool = False  # its DELETE was sent (or is being sent): never twice
    expires: int = 0  # the latest shutdownTime the cluster accepted (µs)
    keepalive: Keepalive | None = None
    creator: threading.Thread | None = None
    checking: Future[None] | None = None  # the check commands starting now share
    seen: Sighting | None = None  # the latest request that found it alive was sent then
    refreshing: bool = False  # a piship-claim-check thread checks it
    renewing: Future[None] | None = None  # the keepalive's renewal in flight, until applied


class ClaimManager:
    """Creates, shares, renews and deletes the claims of one prepared sandbox."""

    def __init__(
        self,
        api: ClaimApi,
        clock: ClaimClock,
        *,
        keepalive_every: float,
        existence_window: float = 0.0,
        telemetry: Telemetry | None = None,
    ) -> None:
        self._api = api
        self._telemetry = telemetry or Telemetry("kubernetes-agent-sandbox")
        self._clock = clock
        self._every = keepalive_every
        self._window = ExistenceWindow.of(existence_window, clock)
        self._checkers: set[threading.Thread] = set()  # piship-claim-check threads running
        self._lock = threading.Lock()
        self._current: _Lease | None = None
        self._leases: list[_Lease] = []  # every lease whose claim may still exist
        self._disposed = False
        self._last: str | None = None
        self.cancel = CancelToken()  # set by dispose(): aborts creation and requests

    @property
    def disposed(self) -> bool:
        """Whether :meth:`dispose` was called."""
        return self._disposed

    def epoch(self) -> str | None:
        """The claim name of the latest command (``None`` before the first command)."""
        with self._lock:
            return self._last

    def current_claim(self) -> Claim | None:
        """The current claim once it is created and ready (no request is sent, and it
        does not count as a command: :meth:`epoch` is unchanged); ``None`` otherwise."""
        with self._lock:
            lease = self._current
        if lease is None or not lease.future.done():
            return None
        try:
            claim: Claim = lease.future.result()
        except BaseException:
            return None
        return claim

    def prepare(self) -> None:
        """Create the first claim and wait until it is ready; on failure nothing is left."""
        try:
            lease = self._obtain()
            claim = self._claim_of(lease, CancelToken())
        except BaseException:
            self.dispose()
            raise
        with self._lock:
            if not self._disposed and not lease.retired:
                self._arm(lease, claim)

    @contextmanager
    def command(self, cancel: CancelToken, *, direct: bool = False) -> Iterator[ClaimUse]:
        """The live claim for one command, counted as in use until the block ends.

        ``direct``: the command may skip the existence check within the window (its
        caller asks :meth:`ClaimUse.exists` when the router cannot reach the sandbox).
        Raises :class:`CommandCancelled` when ``cancel`` fires while waiting for
        it (nothing is retired then), :func:`disposed_error` after dispose, or the
        creation, renewal or check failure. ``use.cancel`` fires on ``cancel`` and
        on dispose: pass it to the command's own request. A retired claim is
        deleted before the block exits, so before the command's own result or
        error is reported.
        """
        token = CancelToken()
        forget = (cancel.on_cancel(token.set), self.cancel.on_cancel(token.set))
        try:
            try:
                lease, claim = self._acquire(token, direct)
            except CommandCancelled:
                if self._disposed and not cancel.is_set():
                    raise disposed_error() from None
                raise
            try:
                yield ClaimUse(
                    claim,
                    token,
                    lambda gone: self._retire(lease, gone=gone),
                    lambda: self._exists(lease, claim, token),
                )
            finally:
                self._await_keepalive(lease, token)
                self._leave(lease)
        finally:
            for unsubscribe in forget:
                unsubscribe()

    def keepalive_now(self) -> None:
        """Run one keepalive tick now for every claim commands run in (a test seam)."""
        with self._lock:
            running = [
                (lease, lease.keepalive) for lease in self._leases if lease.keepalive is not None
            ]
        for lease, keepalive in running:
            if keepalive is not None:
                self._tick(lease, keepalive)

    def dispose(self) -> None:
        """Abort everything in flight, delete every claim held, create none later.

        Idempotent and thread-safe: a second or concurrent call returns at once.
        """
        with self._lock:
            if self._disposed:
                return
            self._disposed = True
            self._current = None
            leases, self._leases = self._leases, []
            keepalives = [lease.keepalive for lease in leases if lease.keepalive is not None]
            doomed = [lease for lease in leases if not lease.deleted]
            for lease in leases:
                lease.retired = True
                lease.keepalive = None
            for lease in doomed:
                lease.deleted = True
        self.cancel.set()
        for keepalive in keepalives:
            keepalive.stop()
        with self._lock:
            checkers = list(self._checkers)
        for checker in checkers:
            if checker is not threading.current_thread():
                checker.join()
        for lease in leases:
            creator = lease.creator
            if creator is not None and creator is not threading.current_thread():
                creator.join()
        for lease in doomed:
            self._delete(lease)

    # -- acquiring a claim for a command ----------------------------------------

    def _acquire(self, cancel: CancelToken, direct: bool) -> tuple[_Lease, Claim]:
        replaced = False
        for _ in range(_ATTEMPTS):
            lease = self._obtain()
            claim = self._claim_of(lease, cancel)
            try:
                self._ready_for_command(lease, claim, cancel, direct)
            except ClaimGone as gone:
                if replaced:
                    raise _ERRORS(str(gone), retryable=True) from None
                replaced = True
                info("SandboxClaim %s replaced: %s", claim.name, str(gone))
                self._retire(lease, gone=True)
                continue
            if self._join(lease, claim):
                return lease, claim
        raise _ERRORS(
            "the SandboxClaim kept being replaced while the command waited for it", retryable=True
        )

    def _obtain(self) -> _Lease:
        """The current lease, or a new one whose creation has started."""
        with self._lock:
            if self._disposed:
                raise disposed_error()
            current = self._current
            if current is not None:
                if not _failed(current):
                    return current
                if current in self._leases:  # failed while nobody waited: nothing to delete
                    self._leases.remove(current)
            lease = _Lease()
            self._current = lease
            self._leases.append(lease)
            lease.creator = threading.Thread(
                target=self._create, args=(lease,), name="piship-claim-create", daemon=True
            )
            lease.creator.start()
            return lease

    def _create(self, lease: _Lease) -> None:
        started = self._window.now()
        try:
            claim = self._api.create(self._clock.anchor(), self.cancel)
        except BaseException as error:
            lease.future.set_exception(error)
            return
        with self._lock:
            lease.expires = claim.anchor.expires
            lease.seen = claim.seen or started
        info("SandboxClaim %s created", claim.name)
        lease.future.set_result(claim)

    def _claim_of(self, lease: _Lease, cancel: CancelToken) -> Claim:
        """Wait for the lease's claim, or until ``cancel`` fires (the creation goes on)."""
        woken = threading.Event()
        lease.future.add_done_callback(lambda _future: woken.set())
        forget = cancel.on_cancel(woken.set)
        try:
            woken.wait()
        finally:
            forget()
        if not lease.future.done():
            raise CommandCancelled()
        try:
            return lease.future.result()
        except BaseException:
            with self._lock:
                if self._current is lease:
                    self._current = None
                if lease in self._leases:
                    self._leases.remove(lease)
            raise

    def _ready_for_command(
        self, lease: _Lease, claim: Claim, cancel: CancelToken, direct: bool
    ) -> None:
        with self._lock:
            committed, gone = lease.expires, lease.gone
        if gone:
            raise ClaimGone("the SandboxClaim no longer exists")
        freshness = self._clock.before_command(claim.anchor, committed)
        if freshness is Freshness.EXPIRED:
            raise ClaimGone("the SandboxClaim expired")
        if freshness is Freshness.DUE:
            self._renew(lease, claim, cancel)
        with self._lock:
            trust = self._window.verdict(lease.seen) if direct else Trust.CHECK
        if trust is Trust.CHECK:
            self._check(lease, claim, cancel)
        elif trust is Trust.REFRESH:
            self._refresh(lease, claim)

    def _refresh(self, lease: _Lease, claim: Claim) -> None:
        """Check the claim on a ``piship-claim-check`` thread, unless one already does."""
        with self._lock:
            if self._disposed or lease.refreshing or lease.retired:
                return
            lease.refreshing = True
            checker = threading.Thread(
                target=self._background_check,
                args=(lease, claim),
                name="piship-claim-check",
                daemon=True,
            )
            self._checkers.add(checker)
            checker.start()

    def _background_check(self, lease: _Lease, claim: Claim) -> None:
        try:
            self._check(lease, claim, self.cancel)
        except ClaimGone:
            self._retire(lease, gone=True)
        except BaseException:
            pass  # a command past the window checks again itself
        finally:
            with self._lock:
                lease.refreshing = False
                self._checkers.discard(threading.current_thread())

    def _exists(self, lease: _Lease, claim: Claim, cancel: CancelToken) -> bool | None:
        """One GET of the claim (see :meth:`ClaimUse.exists`)."""
        sent = self._window.now()
        try:
            self._api.check(claim, cancel)
        except ClaimGone:
            self._retire(lease, gone=True)
            return False
        except Exception:
            return None
        with self._lock:
            lease.seen = self._window.newer(lease.seen, sent)
        return True

    def _check(self, lease: _Lease, claim: Claim, cancel: CancelToken) -> None:
        """Check the claim, or share the check in flight when this command started.

        A check that ended before the command started never counts for it. When
        the command that sent the shared check was cancelled, the others check again.
        """
        while True:
            with self._lock:
                shared = lease.checking
                if shared is None:
                    mine: Future[None] = Future()
                    lease.checking = mine
            if shared is None:
                self._send_check(lease, claim, cancel, mine)
                return
            wait_for(shared, cancel)
            error = shared.exception()
            if error is None:
                return
            if not isinstance(error, CommandCancelled):
                raise error.with_traceback(None)

    def _send_check(
        self, lease: _Lease, claim: Claim, cancel: CancelToken, mine: Future[None]
    ) -> None:
        failure: BaseException | None = None
        sent = self._window.now()
        try:
            self._api.check(claim, cancel)
        except BaseException as error:
            failure = error
        with self._lock:
            if lease.checking is mine:
                lease.checking = None
            if failure is None:
                lease.seen = self._window.newer(lease.seen, sent)
        if failure is None:
            mine.set_result(None)
            return
        mine.set_exception(failure)
        raise failure

    def _join(self, lease: _Lease, claim: Claim) -> bool:
        """Count the command in; ``False`` when the lease was retired meanwhile."""
        with self._lock:
            if self._disposed:
                raise disposed_error()
            if lease.retired:
                return False
            lease.users += 1
            self._last = claim.name
            self._arm(lease, claim)
            return True

    def _arm(self, lease: _Lease, claim: Claim) -> None:
        """Start the lease's keepalive if it has none (under the lock)."""
        if lease.keepalive is None and not lease.deleted:
            lease.keepalive = Keepalive(
                self._every,
                lambda keepalive: self._tick(lease, keepalive),
                f"piship-keepalive-{claim.name}",
            )
            lease.keepalive.start()

    # -- renewal ----------------------------------------------------------------

    def _renew(self, lease: _Lease, claim: Claim, cancel: CancelToken) -> None:
        with self._lock:
            committed = lease.expires
        target = self._clock.renewal(claim.anchor, committed)
        if target is None:
            raise ClaimGone("the SandboxClaim expired")
        sent = self._window.now()
        with self._telemetry.span(CLAIM_RENEW_SPAN, claim.name):
            self._api.renew(claim, target, cancel)
        with self._lock:
            lease.expires = max(lease.expires, target)
            lease.seen = self._window.newer(lease.seen, sent)

    def _tick(self, lease: _Lease, keepalive: Keepalive) -> None:
        with self._lock:
            if lease.keepalive is not keepalive or lease.gone or lease.deleted:
                return
            idle, committed = lease.users == 0, lease.expires
        claim = lease.future.result()
        if idle and self._clock.before_command(claim.anchor, committed) is Freshness.FRESH:
            return  # an idle lease is renewed only once half its lifetime has passed
        renewing: Future[None] = Future()
        with self._lock:
            lease.renewing = renewing
        try:
            self._renew(lease, claim, keepalive.abort)
        except ClaimGone as gone:
            info("renewing SandboxClaim %s was refused: %s", claim.name, str(gone))
            self._retire(lease, gone=True)
        except Exception:
            pass
        finally:
            with self._lock:
                lease.renewing = None
            renewing.set_result(None)

    def _await_keepalive(self, lease: _Lease, cancel: CancelToken) -> None:
        """Give a keepalive renewal in flight as a command ends a moment to be applied, so
        that a claim it finds gone is retired (and deleted) before the command reports."""
        with self._lock:
            renewing = lease.renewing
        if renewing is not None:
            with suppress(CommandCancelled):
                wait_for(renewing, cancel, _TICK_GRACE)

    # -- retiring and deleting ---------------------------------------------------

    def _retire(self, lease: _Lease, *, gone: bool = False) -> None:
        with self._lock:
            lease.retired = True
            lease.gone = lease.gone or gone
            if self._current is lease:
                self._current = None
        self._release(lease)

    def _leave(self, lease: _Lease) -> None:
        with self._lock:
            lease.users -= 1
        self._release(lease)

    def _release(self, lease: _Lease) -> None:
        """Delete a retired lease nobody uses any more (at most once), and stop its keepalive."""
        with self._lock:
            if lease.users > 0 or not lease.retired or lease.deleted:
                return
            lease.deleted = True
            keepalive, lease.keepalive = lease.keepalive, None
            if lease in self._leases:
                self._leases.remove(lease)
        if keepalive is not None:
            keepalive.stop(_TICK_GRACE)
        self._delete(lease)

    def _delete(self, lease: _Lease) -> None:
        try:
            claim = lease.future.result()
        except BaseException:
            return
        try:
            self._api.delete(claim)
        except Exception:
            return
        info("SandboxClaim %s deleted", claim.name)


def _failed(lease: _Lease) -> bool:
    return lease.future.done() and lease.future.exception() is not None
