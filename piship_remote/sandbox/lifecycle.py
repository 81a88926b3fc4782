"""The registry of live sandboxes, and what disposes them when the host process ends.

Every sandbox this library activates is tracked here until it is disposed or
detached. At interpreter exit (normal or by an uncaught exception) an ``atexit``
hook disposes whatever is still live, all at once and within a bounded time; a
sandbox that is garbage-collected undisposed is disposed too, with a
``ResourceWarning``. When Ctrl-C (an uncaught ``KeyboardInterrupt``) ends the main
thread, the live sandboxes are disposed before Python waits for the other threads,
so commands running on worker threads (a ``ThreadPoolExecutor``) are killed instead
of being waited for. Ctrl-C while the main thread waits inside ``with
ThreadPoolExecutor()`` does not end the main thread at once: the block's exit waits
for the workers first. There the registry's ``piship-interrupt-watch`` thread (see
:mod:`piship_remote.sandbox._unwinding`), which runs while a command runs off the
main thread, disposes the live sandboxes, and the exit hooks wait for those deletions.
Signals are opt-in::

    import piship_remote
    piship_remote.cleanup_on_signals()          # SIGTERM and SIGHUP dispose, then the old action

This module holds the library's only process-wide mutable state: the registry.
"""

from __future__ import annotations

import atexit
import concurrent.futures.thread  # noqa: F401 (its exit hook first: see below)
import itertools
import logging
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import FrameType

from piship_remote.sandbox._unwinding import UnwindWatch

__all__ = [
    "EXIT_DEADLINE",
    "cleanup_on_signals",
    "disposal_cause",
    "dispose_all",
    "live_count",
    "running_off_main_thread",
    "track",
    "untrack",
    "working_for_the_main_thread",
    "works_for_the_main_thread",
]

EXIT_DEADLINE = 10.0  # seconds the exit hook waits for every live sandbox's deletion
_AT_EXIT = "closed at interpreter exit"
_LOG = logging.getLogger("piship_remote")

Disposer = Callable[[], object]
_Handler = Callable[[int, FrameType | None], object] | int | None


class _Registry:
    """Live sandboxes by token: each with the callable that deletes it (never the façade)."""

    def __init__(self) -> None:
        # Re-entrant: a signal handler (cleanup_on_signals) runs on the main thread and may
        # interrupt it inside any block that holds this lock.
        self._lock = threading.RLock()
        self._live: dict[int, tuple[str, Disposer]] = {}
        self._tokens = itertools.count(1)
        self._finalizers: dict[int, weakref.finalize[..., object]] = {}
        self._signals: dict[int, _Handler] = {}
        self._deleting: dict[threading.Thread, str] = {}  # deletions under way, by name
        # Why the latest disposal started, for owners that tell their users (a closed pool).
        self.cause = _AT_EXIT
        self.unwinding = UnwindWatch(self._dispose_on_interrupt)
        # Set on a thread whose commands run for a main thread that handles Ctrl-C itself.
        self.for_the_main_thread = threading.local()

    def track(self, owner: object, name: str, disposer: Disposer) -> int:
        token = next(self._tokens)
        finalizer = weakref.finalize(owner, self._collected, token)
        finalizer.atexit = False
        with self._lock:
            self._live[token] = (name, disposer)
            self._finalizers[token] = finalizer
        return token

    def untrack(self, token: int | None) -> None:
        if token is None:
            return
        with self._lock:
            self._live.pop(token, None)
            finalizer = self._finalizers.pop(token, None)
        if finalizer is not None:
            finalizer.detach()

    def live_count(self) -> int:
        with self._lock:
            return len(self._live)

    def dispose_all(self, deadline: float, cause: str = "") -> list[str]:
        """Dispose every live sandbox in parallel; the names not done within ``deadline``.

        Deletions already under way (a collected sandbox's, an earlier call's) are waited
        for too: a process must not end in the middle of one.
        """
        with self._lock:
            self.cause = cause or _AT_EXIT
            entries = list(self._live.items())
            self._live.clear()
            finalizers = list(self._finalizers.values())
            self._finalizers.clear()
        for finalizer in finalizers:
            finalizer.detach()
        for token, (name, disposer) in entries:
            self._delete(f"piship-exit-{token}", name, disposer)
        with self._lock:
            deleting = list(self._deleting.items())
        end = time.monotonic() + deadline
        return [name for thread, name in deleting if not _join_by(thread, end)]

    def _dispose_on_interrupt(self) -> None:
        # On the watch thread: start the deletions and return, so that the workers'
        # commands end at once; the exit hooks wait for the deletions.
        _LOG.info("Ctrl-C while the main thread waits for its workers: disposing the sandboxes")
        self.dispose_all(0.0, "interrupted (Ctrl-C while the main thread waited for threads)")

    def _collected(self, token: int) -> None:
        with self._lock:
            entry = self._live.pop(token, None)
            self._finalizers.pop(token, None)
        if entry is None:
            return
        name, disposer = entry
        with self._lock:
            self.cause = "garbage-collected without close()"
        warnings.warn(
            f"sandbox {name} was garbage-collected without dispose(); deleting it now",
            ResourceWarning,
            stacklevel=2,
        )
        self._delete(f"piship-reap-{token}", name, disposer)

    def _delete(self, thread_name: str, name: str, disposer: Disposer) -> None:
        """Run ``disposer`` on a thread of its own, listed in ``_deleting`` until it ends."""

        def delete() -> None:
            try:
                _quietly(disposer)
            finally:
                with self._lock:
                    self._deleting.pop(threading.current_thread(), None)

        thread = threading.Thread(target=delete, name=thread_name, daemon=True)
        with self._lock:  # listed before it can end and unlist itself
            self._deleting[thread] = name
        thread.start()  # not under the lock: a signal handler may wait for this thread

    def install(self, signals: Iterable[int]) -> None:
        for number in signals:
            previous = signal.signal(number, self._on_signal)
            # Each access makes a new bound method, so `is` never matches: installed twice,
            # the handler would chain to itself and recurse on the signal.
            if previous != self._on_signal:
                self._signals[number] = previous

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        left = self.dispose_all(EXIT_DEADLINE, f"closed on {signal.Signals(number).name}")
        if left:
            _LOG.warning("not deleted before exit (they expire on their own): %s", ", ".join(left))
        previous = self._signals.get(number, signal.SIG_DFL)
        if callable(previous):
            previous(number, frame)
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)


def _join_by(thread: threading.Thread, end: float) -> bool:
    """Wait until ``thread`` ends or the monotonic instant ``end``; whether it ended. A listed
    thread may not have started yet (a signal handler interrupted the one starting it)."""
    while True:
        try:
            thread.join(max(0.0, end - time.monotonic()))
            return not thread.is_alive()
        except RuntimeError:  # not started yet
            if time.monotonic() >= end:
                return False
            time.sleep(0.01)


def _quietly(disposer: Disposer) -> None:
    try:
        disposer()
    except Exception:  # a failed deletion is logged; the sandbox still expires on its own
        _LOG.warning("deleting a sandbox at exit failed", exc_info=True)


_REGISTRY = _Registry()


def track(owner: object, name: str, disposer: Disposer) -> int:
    """Track ``owner`` (a live sandbox) until :func:`untrack`; returns its token.

    ``disposer`` deletes the remote sandbox; it must not hold a reference to ``owner``,
    so that an undisposed, unreachable owner can be collected (and then disposed).
    """
    return _REGISTRY.track(owner, name, disposer)


def untrack(token: int | None) -> None:
    """Stop tracking (the sandbox was disposed or detached); idempotent."""
    _REGISTRY.untrack(token)


def live_count() -> int:
    """How many sandboxes are tracked now."""
    return _REGISTRY.live_count()


def running_off_main_thread() -> AbstractContextManager[None]:
    """Mark a command running on a thread other than the main one for the block, so
    that Ctrl-C while the main thread waits for that thread disposes the sandboxes.

    A thread that works for the main thread (:func:`working_for_the_main_thread`) needs
    no watch: the main thread kills its commands itself on Ctrl-C.
    """
    if works_for_the_main_thread():
        return nullcontext()
    return _REGISTRY.unwinding.watching()


@contextmanager
def working_for_the_main_thread() -> Iterator[None]:
    """In the block, this thread's commands run for the main thread, which handles Ctrl-C
    itself (a pool's ``map`` called there kills them and disposes its sandboxes)."""
    local = _REGISTRY.for_the_main_thread
    before = getattr(local, "working", False)
    local.working = True
    try:
        yield
    finally:
        local.working = before


def works_for_the_main_thread() -> bool:
    """Whether this thread is inside :func:`working_for_the_main_thread`."""
    return bool(getattr(_REGISTRY.for_the_main_thread, "working", False))


def dispose_all(deadline: float = EXIT_DEADLINE) -> list[str]:
    """Dispose every tracked sandbox in parallel; returns the names not deleted in time."""
    return _REGISTRY.dispose_all(deadline)


def disposal_cause() -> str:
    """Why the registry's latest disposal started ("closed on SIGTERM", ...), for a
    disposer that tells its users."""
    return _REGISTRY.cause


def cleanup_on_signals(signals: Iterable[int] | None = None) -> None:
    """Make ``signals`` (default SIGTERM and SIGHUP) dispose every live sandbox first.

    After the cleanup the previous handler runs, or the default action (so a script
    killed by SIGTERM still ends with status 128+15). Call it from the main thread;
    the library never installs a signal handler unless asked.
    """
    if signals is None:
        signals = [signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])
    _REGISTRY.install(signals)


@atexit.register
def _at_exit() -> None:
    left = dispose_all(EXIT_DEADLINE)
    if left:
        _LOG.warning("not deleted before exit (they expire on their own): %s", ", ".join(left))


def _on_interrupted_shutdown() -> None:
    """At shutdown after an uncaught ``KeyboardInterrupt``: dispose before threads are joined."""
    if isinstance(getattr(sys, "last_value", None), KeyboardInterrupt):
        _at_exit()


def _before_threads_are_joined(hook: Callable[[], None]) -> None:
    # atexit hooks run only after Python has joined every non-daemon thread, and a
    # ThreadPoolExecutor's workers first finish their commands. threading's own exit
    # hooks run before that join, last registered first; the standard library has no
    # public way to register one, so without it (another Python) only atexit is left.
    # concurrent.futures.thread is imported above so that its hook, which joins the
    # workers, is registered before this one and therefore runs after it.
    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(hook)


_before_threads_are_joined(_on_interrupted_shutdown)
