"""Ctrl-C while the main thread waits for a thread pool's workers.

A ``KeyboardInterrupt`` raised inside ``with ThreadPoolExecutor() as pool:`` does not
end the main thread: the block's end first calls ``pool.shutdown(wait=True)``, which
waits for the workers, and a worker blocked in ``Sandbox.exec`` waits for its command.
No library code runs on the main thread then, and the library installs no SIGINT
handler unasked. So while some command runs off the main thread, :class:`UnwindWatch`
keeps a ``piship-interrupt-watch`` thread that looks, every ``WATCH_POLL`` seconds, at
what the main thread does; once the main thread waits in a ``ThreadPoolExecutor``'s
shutdown with a ``KeyboardInterrupt`` in flight (the block's end, or a ``shutdown()``
in a ``finally`` or ``except`` clause), the watch calls its action once (the registry
disposes every live sandbox, which ends the workers' commands) and stops.

A ``KeyboardInterrupt`` that ends the main thread anywhere else (``future.result()``,
``thread.join()``) reaches the registry's own hook at interpreter shutdown instead.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

__all__ = ["THREAD_NAME", "WATCH_POLL", "UnwindWatch", "waits_for_workers_after_interrupt"]

WATCH_POLL = 0.1  # seconds between two looks at the main thread
THREAD_NAME = "piship-interrupt-watch"

_SHUTDOWN = ThreadPoolExecutor.shutdown.__code__


def waits_for_workers_after_interrupt(thread_id: int) -> bool:
    """Whether thread ``thread_id`` waits in a ``ThreadPoolExecutor``'s shutdown while it
    handles a ``KeyboardInterrupt`` (the one a ``with`` block's end passes on counts)."""
    current_exceptions = getattr(sys, "_current_exceptions", None)
    if current_exceptions is None:  # another Python: only the exit hook is left
        return False
    handled = current_exceptions().get(thread_id)
    if isinstance(handled, tuple):  # before Python 3.12, the sys.exc_info() triple
        handled = handled[1]
    if not isinstance(handled, KeyboardInterrupt):
        return False
    frame = sys._current_frames().get(thread_id)
    while frame is not None:
        if frame.f_code is _SHUTDOWN:
            return True
        frame = frame.f_back
    return False


class UnwindWatch:
    """Calls ``on_unwinding`` once when the main thread waits for a pool after Ctrl-C.

    The watch thread runs while at least one :meth:`watching` block is open, and the
    last block to close stops it and waits for it to end.
    """

    def __init__(self, on_unwinding: Callable[[], object], poll: float = WATCH_POLL) -> None:
        self._on_unwinding = on_unwinding
        self._poll = poll
        self._lock = threading.Lock()
        self._open = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @contextmanager
    def watching(self) -> Iterator[None]:
        """Keep the watch on for the block (a command running off the main thread)."""
        self._enter()
        try:
            yield
        finally:
            self._leave()

    def _enter(self) -> None:
        with self._lock:
            self._open += 1
            if self._thread is not None:
                return
            self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._watch, args=(self._stop,), name=THREAD_NAME, daemon=True
            )
            self._thread.start()

    def _leave(self) -> None:
        with self._lock:
            self._open -= 1
            if self._open:
                return
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _watch(self, stop: threading.Event) -> None:
        main = threading.main_thread().ident
        if main is None:
            return
        while not stop.wait(self._poll):
            if waits_for_workers_after_interrupt(main):
                self._on_unwinding()
                return
