"""A watched directory of a local sandbox: envd's filesystem events, as its agent reports them.

The sandbox's agent watches the directory itself, inside the sandbox, as the requesting
user (inotify, see :mod:`piship_remote.local.isolation.agent_watch`), and writes each event
as a JSON line on a socket; the host opens no path of the sandbox. A :class:`DirWatch` holds
the host's end of that socket::

    pump = WatchPump()
    watch = DirWatch(connection)      # a socket: the agent's helper writes the other end
    pump.add(watch)                   # its events are read as they happen
    watch.wait(50.0)                  # True when events wait (or it ended)
    watch.sync(2.0)                   # every event so far is in (the helper says so)
    watch.take()                      # [WatchEvent("a.txt", "EVENT_TYPE_CREATE"), ...]
    pump.remove(watch)                # and closes it: the helper ends

A ``piship-local-watch`` thread reads every watch's events as they happen. It runs while
any watch exists. A watch keeps at most :data:`MAX_EVENTS` untaken events (the oldest are
dropped); it ends when the helper does (the sandbox ended).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import selectors
import threading
from collections import deque

import attrs

__all__ = ["MAX_EVENTS", "DirWatch", "WatchEvent", "WatchPump"]

MAX_EVENTS = 10_000
READ_BYTES = 64 * 1024
MAX_LINE = 64 * 1024
JOIN_TIMEOUT = 5.0


@attrs.frozen
class WatchEvent:
    """One filesystem event: the entry's path relative to the watched directory, its type."""

    name: str
    type: str


class DirWatch:
    """The events of one directory watch, read from the agent's socket (non-blocking)."""

    def __init__(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._fd = fd
        self._buffer = b""
        self._lock = threading.Condition()
        self._pending: deque[WatchEvent] = deque(maxlen=MAX_EVENTS)
        self._closed = False
        self._ended = False
        self._asked = 0  # syncs asked of the helper, and answered
        self._synced = 0

    @property
    def closed(self) -> bool:
        """Whether the watch has ended (closed here, or its helper ended)."""
        return self._closed or self._ended

    def fileno(self) -> int:
        """The socket (readable when events wait)."""
        return self._fd

    def pump(self) -> bool:
        """Read what the helper wrote into the untaken events (the pump thread's work);
        ``False`` once it has ended."""
        with self._lock:
            while not self._closed:
                try:
                    data = os.read(self._fd, READ_BYTES)
                except (BlockingIOError, InterruptedError):
                    break
                if not data:
                    self._ended = True
                    break
                self._consume(data)
            self._lock.notify_all()
            return not self.closed

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for events (or the end); whether any came."""
        with self._lock:
            return self._lock.wait_for(lambda: bool(self._pending) or self.closed, timeout)

    def sync(self, timeout: float) -> None:
        """Wait (up to ``timeout`` seconds) until every event that happened before this call
        is among the untaken ones: the helper reads what the kernel holds and says so."""
        with self._lock:
            if self.closed:
                return
            self._asked += 1
            target = self._asked
            try:
                os.write(self._fd, b"s")
            except OSError:
                return
            self._lock.wait_for(lambda: self._synced >= target or self.closed, timeout)

    def take(self) -> list[WatchEvent]:
        """The events since the last call."""
        with self._lock:
            taken = list(self._pending)
            self._pending.clear()
            return taken

    def close(self) -> None:
        """Stop watching (the helper sees the socket closed and ends); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._fd)
            self._lock.notify_all()

    def _consume(self, data: bytes) -> None:
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        if len(self._buffer) > MAX_LINE:
            self._buffer = b""  # not an event line: dropped
        for line in lines:
            with contextlib.suppress(ValueError, AttributeError):
                event = json.loads(line)
                name, kind = event.get("name"), event.get("type")
                if isinstance(name, str) and isinstance(kind, str):
                    self._pending.append(WatchEvent(name, kind))
                elif event.get("sync") is True:
                    self._synced += 1


class WatchPump:
    """The ``piship-local-watch`` thread: reads the events of every open watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changes: queue.SimpleQueue[tuple[DirWatch, bool, threading.Event]]
        self._changes = queue.SimpleQueue()
        self._count = 0
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] = (-1, -1)

    def add(self, watch: DirWatch) -> None:
        """Start reading ``watch``'s events."""
        with self._lock:
            self._count += 1
            if self._thread is None:
                self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                self._thread = threading.Thread(
                    target=self._run, name="piship-local-watch", daemon=True
                )
                self._thread.start()
            self._change(watch, True)

    def remove(self, watch: DirWatch) -> None:
        """Stop reading ``watch`` and close it; the thread ends with the last watch."""
        with self._lock:
            self._count -= 1
            done = self._change(watch, False)
            thread = self._thread if self._count == 0 else None
        done.wait(JOIN_TIMEOUT)
        watch.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT)

    def _change(self, watch: DirWatch, adding: bool) -> threading.Event:
        done = threading.Event()
        self._changes.put((watch, adding, done))
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake[1], b"x")
        return done

    def _run(self) -> None:
        wake = self._wake[0]
        with selectors.DefaultSelector() as selector:
            selector.register(wake, selectors.EVENT_READ)
            watching = 0
            while True:
                while not self._changes.empty():
                    watch, adding, done = self._changes.get()
                    if adding:
                        selector.register(watch.fileno(), selectors.EVENT_READ, watch)
                        watching += 1
                    else:
                        with contextlib.suppress(KeyError, ValueError):
                            selector.unregister(watch.fileno())
                        watching -= 1
                    done.set()
                with self._lock:
                    if watching <= 0 and self._changes.empty():
                        os.close(self._wake[0])
                        os.close(self._wake[1])
                        self._thread = None
                        return
                for key, _ in selector.select():
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake, 4096)
                    elif not key.data.pump():
                        selector.unregister(key.fd)  # ended: its remove() comes later
