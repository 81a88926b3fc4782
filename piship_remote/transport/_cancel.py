"""Cancellation that reaches a blocked socket.

A :class:`CancelToken` is a ``threading.Event`` whose ``set()`` also runs the
callbacks registered with :meth:`CancelToken.on_cancel`, on the setting thread.
The transport registers "shut this socket down" there, so a read blocked in
another thread ends within milliseconds instead of at its socket timeout.

A plain ``threading.Event`` given by a caller cannot run callbacks, so an
:class:`EventWatcher` thread polls it: :meth:`EventWatcher.when_set` runs an
action once it is set, and :func:`bridge` mirrors it into a token. A
:class:`DeadlineTimer` thread runs an action (an abort) when a deadline passes.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from itertools import count

__all__ = ["CancelToken", "DeadlineTimer", "EventWatcher", "bridge", "when_cancelled"]

Callback = Callable[[], None]


class CancelToken(threading.Event):
    """An event that runs callbacks when set; callbacks run once, errors ignored."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks_lock = threading.Lock()
        self._callbacks: dict[int, Callback] = {}
        self._next_key = 0

    def set(self) -> None:
        with self._callbacks_lock:
            if self.is_set():
                return
            super().set()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
        for callback in callbacks:
            _call_quietly(callback)

    def on_cancel(self, callback: Callback) -> Callback:
        """Run ``callback`` when the token is set (at once if it already is).

        Returns a function that unregisters it.
        """
        with self._callbacks_lock:
            if not self.is_set():
                key = self._next_key
                self._next_key += 1
                self._callbacks[key] = callback
                return lambda: self._forget(key)
        _call_quietly(callback)
        return _nothing

    def _forget(self, key: int) -> None:
        with self._callbacks_lock:
            self._callbacks.pop(key, None)


def _call_quietly(callback: Callback) -> None:
    try:
        callback()
    except Exception:
        pass


def _nothing() -> None:
    return None


class EventWatcher:
    """Runs actions (or sets tokens) when the plain ``threading.Event`` they watch is set.

    One lazily started daemon thread (``piship-cancel-watch``) per watcher; it
    sleeps while nothing is watched and stops on :meth:`close`.
    """

    def __init__(self, interval: float = 0.002) -> None:
        self._interval = interval
        self._lock = threading.Condition()
        self._watched: dict[int, tuple[threading.Event, Callback]] = {}
        self._next_key = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, event: threading.Event, token: CancelToken) -> Callback:
        """Set ``token`` once ``event`` is set; returns a function that stops watching."""
        return self.when_set(event, token.set)

    def when_set(self, event: threading.Event, action: Callback) -> Callback:
        """Run ``action`` once, on the watcher thread, when ``event`` is set (errors ignored).

        Returns a function that stops watching.
        """
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._watched[key] = (event, action)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="piship-cancel-watch", daemon=True
                )
                self._thread.start()
            self._lock.notify_all()

        def forget() -> None:
            with self._lock:
                self._watched.pop(key, None)

        return forget

    def close(self) -> None:
        with self._lock:
            self._closed = True
            thread, self._thread = self._thread, None
            self._lock.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._watched and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                fired = [key for key, (event, _) in self._watched.items() if event.is_set()]
                actions = [self._watched.pop(key)[1] for key in fired]
            for action in actions:
                _call_quietly(action)
            with self._lock:
                if not self._closed:
                    self._lock.wait(self._interval)


def when_cancelled(
    cancel: threading.Event | None, watcher: EventWatcher, action: Callback
) -> Callback:
    """Run ``action`` once ``cancel`` is set; returns a function that stops listening.

    A token runs it from ``set()`` itself; a plain event is polled by ``watcher``;
    an event already set runs it at once, on the calling thread.
    """
    if cancel is None:
        return _nothing
    if isinstance(cancel, CancelToken):
        return cancel.on_cancel(action)
    if cancel.is_set():
        _call_quietly(action)
        return _nothing
    return watcher.when_set(cancel, action)


@contextmanager
def bridge(cancel: threading.Event | None, watcher: EventWatcher) -> Iterator[CancelToken]:
    """A token for ``cancel``: the same object if it is a token, else a watched mirror."""
    if isinstance(cancel, CancelToken):
        yield cancel
        return
    token = CancelToken()
    if cancel is None:
        yield token
        return
    if cancel.is_set():
        token.set()
    forget = watcher.watch(cancel, token)
    try:
        yield token
    finally:
        forget()


class DeadlineTimer:
    """Runs actions at deadlines on one lazily started thread (``piship-exec-timer``)."""

    def __init__(self, name: str = "piship-exec-timer") -> None:
        self._name = name
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._actions: dict[int, Callback] = {}
        self._keys = count()
        self._thread: threading.Thread | None = None
        self._closed = False

    def schedule(self, delay: float, action: Callback) -> Callback:
        """Run ``action`` in ``delay`` seconds; returns a function that cancels it."""
        when = time.monotonic() + delay
        with self._cond:
            if self._closed:
                return _nothing
            key = next(self._keys)
            self._actions[key] = action
            heapq.heappush(self._heap, (when, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif self._heap[0][1] == key:
                self._cond.notify()
        return lambda: self._cancel(key)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._actions.clear()
            thread, self._thread = self._thread, None
            self._cond.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _cancel(self, key: int) -> None:
        with self._cond:
            if self._actions.pop(key, None) is None:
                return
            if len(self._heap) > 64 + 2 * len(self._actions):
                # Cancelled deadlines would pile up until they are due: drop them.
                self._heap = [entry for entry in self._heap if entry[1] in self._actions]
                heapq.heapify(self._heap)

    def _run(self) -> None:
        while True:
            action = self._next()
            if action is None:
                return
            try:
                action()
            except Exception:
                pass

    def _next(self) -> Callback | None:
        with self._cond:
            while not self._closed:
                if not self._heap:
                    self._cond.wait()
                    continue
                when, key = self._heap[0]
                if key not in self._actions:
                    heapq.heappop(self._heap)
                    continue
                delay = when - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                heapq.heappop(self._heap)
                return self._actions.pop(key)
            return None
