"""Cancellation that reaches a blocked socket.

A :class:`CancelToken` is a ``threading.Event`` whose ``set()`` also runs the
callbacks registered with :meth:`CancelToken.on_cancel`, on the setting thread.
The transport registers "shut this socket down" there, so a read blocked in
another thread ends within milliseconds instead of at its socket timeout.

A plain ``threading.Event`` given by a caller is bridged with :func:`bridge`:
a :class:`EventWatcher` thread notices it being set and sets the token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["CancelToken", "EventWatcher", "bridge"]

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
    """Sets tokens when the plain ``threading.Event`` they mirror gets set.

    One lazily started daemon thread (``piship-cancel-watch``) per watcher; it
    sleeps while nothing is watched and stops on :meth:`close`.
    """

    def __init__(self, interval: float = 0.002) -> None:
        self._interval = interval
        self._lock = threading.Condition()
        self._watched: dict[int, tuple[threading.Event, CancelToken]] = {}
        self._next_key = 0
        self._thread: threading.Thread | None = None
        self._closed = False

    def watch(self, event: threading.Event, token: CancelToken) -> Callback:
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._watched[key] = (event, token)
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
                fired = [token for event, token in self._watched.values() if event.is_set()]
            for token in fired:
                token.set()
            with self._lock:
                if not self._closed:
                    self._lock.wait(self._interval)


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
