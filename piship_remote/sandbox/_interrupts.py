"""Ctrl-C during a backend call that the main thread makes itself.

Python raises ``KeyboardInterrupt`` wherever the main thread happens to be. Raised
inside a backend call, it would skip the call's clean-up (the remote kill, the
socket shut), and it is only raised once a blocked read on the main thread
returns, which it may never do when the signal landed on another thread. So for
the length of one call, :class:`InterruptGuard`:

- puts a handler that only takes note in place of ``signal.default_int_handler``;
- makes its own pipe the signal wakeup fd, so that a SIGINT delivered to any
  thread wakes its ``piship-interrupt`` thread, which aborts the call (the call
  then ends the way a cancelled one does);
- once the call has returned, puts both back and reports whether SIGINT came, so
  that the caller raises ``KeyboardInterrupt`` itself.

A program that installed its own SIGINT handler or wakeup fd keeps them: the
guard declines (``arm`` returns ``None``) and the caller must hand the call to a
worker thread instead. With SIGINT ignored (``SIG_IGN``) or left to the operating
system (``SIG_DFL``), Python never raises, so no guard is needed.

Usage, on the main thread::

    disarm = guard.arm(lambda: call.abort("stopped"))
    if disarm is None:
        ...  # run the call on a worker thread
    try:
        outcome = call.run(instance, request)
    finally:
        if disarm():
            raise KeyboardInterrupt
"""

from __future__ import annotations

import os
import select
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeAlias

__all__ = ["Disarm", "InterruptGuard"]

Disarm = Callable[[], bool]
"""Puts the program's SIGINT handling back; ``True`` when SIGINT came meanwhile."""

Handler: TypeAlias = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_STOP = b"\0"  # written by close(): no signal has the number 0
_SIGINT = bytes([signal.SIGINT])


def _nothing_came() -> bool:
    return False


class InterruptGuard:
    """Turns SIGINT into an abort of the main thread's current backend call.

    One guard serves one sandbox; its thread starts with the first guarded call
    and stops in :meth:`close`. The pipe stays open while it is the wakeup fd, so
    a close during a guarded call leaves the last step to that call's disarm.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abort: Callable[[], None] | None = None
        self._noted = False
        self._armed = False
        self._pipe: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._stopped = False

    def arm(self, abort: Callable[[], None]) -> Disarm | None:
        """Call ``abort`` on SIGINT until the returned function is called.

        Main thread only. ``None`` when the program handles SIGINT itself.
        """
        handler = signal.getsignal(signal.SIGINT)
        if handler in (signal.SIG_IGN, signal.SIG_DFL):
            return _nothing_came
        if handler is not signal.default_int_handler:
            return None
        write_fd = self._take(abort)
        if write_fd is None:
            return None
        try:
            previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except BaseException:
            if self._release():
                self._close_pipe()
            raise
        if previous_fd != -1:
            signal.set_wakeup_fd(previous_fd)
            if self._release():
                self._close_pipe()
            return None
        try:
            signal.signal(signal.SIGINT, self._note)
        except BaseException:  # a Ctrl-C raised before the note-taker was in place
            self._put_back(previous_fd, handler)
            raise
        return lambda: self._put_back(previous_fd, handler)

    def close(self) -> None:
        """Stop the ``piship-interrupt`` thread and close the pipe. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, pipe = self._thread, self._pipe
        if thread is not None and pipe is not None:
            os.write(pipe[1], _STOP)
            if thread is not threading.current_thread():
                thread.join()
        with self._lock:
            self._stopped = True
            last = not self._armed
        if last:
            self._close_pipe()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        # Runs on the main thread between two bytecodes, maybe inside a lock the
        # abort needs: so it only takes note, and the guard's thread aborts.
        self._noted = True

    def _take(self, abort: Callable[[], None]) -> int | None:
        """Aim the guard at ``abort``: the pipe's write end, its reader started."""
        with self._lock:
            if self._closed:
                return None
            if self._pipe is None:
                self._pipe = _nonblocking_pipe()
                self._thread = threading.Thread(
                    target=self._watch,
                    args=(self._pipe[0],),
                    name="piship-interrupt",
                    daemon=True,
                )
                self._thread.start()
            self._drain()  # a SIGINT of an earlier call must not abort this one
            self._noted = False
            self._abort = abort
            self._armed = True
            return self._pipe[1]

    def _put_back(self, previous_fd: int, handler: Handler) -> bool:
        signal.set_wakeup_fd(previous_fd)
        last = self._release()
        signal.signal(signal.SIGINT, handler)
        if last:
            self._close_pipe()
        noted, self._noted = self._noted, False
        return noted

    def _release(self) -> bool:
        """Disarmed; ``True`` when the guard was closed meanwhile and the pipe is ours to close."""
        with self._lock:
            self._abort = None
            self._armed = False
            return self._stopped

    def _watch(self, read_fd: int) -> None:
        while True:
            select.select([read_fd], [], [])
            with self._lock:
                came = self._drain()
                abort = self._abort if _SIGINT in came else None
                closed = self._closed
            if closed:
                return
            if abort is not None:
                abort()

    def _drain(self) -> bytes:
        """Everything waiting in the pipe; the caller holds the lock."""
        assert self._pipe is not None
        came = b""
        while True:
            try:
                chunk = os.read(self._pipe[0], 512)
            except BlockingIOError:
                return came
            if not chunk:
                return came
            came += chunk

    def _close_pipe(self) -> None:
        with self._lock:
            pipe, self._pipe = self._pipe, None
        if pipe is not None:
            os.close(pipe[0])
            os.close(pipe[1])


def _nonblocking_pipe() -> tuple[int, int]:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    os.set_blocking(write_fd, False)
    return read_fd, write_fd
