"""One running command's events, shared by every stream that follows it (Start and Connect).

A :class:`ProcessFeed` reads a :class:`LocalProcess` on its own
``piship-local-process`` thread and hands each event to every subscriber; a
subscriber sees what happens from the moment it subscribes, and the end is kept
for those who come after it. A slow subscriber slows the command (its output
pipe fills), as a slow reader of envd's stream does::

    feed = ProcessFeed(process, on_end=lambda: sandbox.forget(process))
    follower = feed.subscribe()
    feed.start()
    event = follower.next(timeout=5.0)   # Output | Exited, or None when nothing came
    follower.close()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

from piship_remote.local.isolation.process import Exited, LocalProcess, Output

__all__ = ["Follower", "ProcessFeed"]

BACKLOG = 256
PUT_WAIT = 0.5
# The thread reports no keepalives of its own: each stream keeps its own interval.
_QUIET = 24 * 3600.0


class Follower:
    """One subscriber's queue of a feed's events."""

    def __init__(self, feed: ProcessFeed) -> None:
        self._feed = feed
        self.pid = feed.process.pid
        self._queue: queue.Queue[Output | Exited] = queue.Queue(BACKLOG)
        self.closed = threading.Event()

    def next(self, timeout: float) -> Output | Exited | None:
        """The next event, or ``None`` when none came within ``timeout`` seconds."""
        try:
            return self._queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def close(self) -> None:
        """Stop following (the command keeps running)."""
        self.closed.set()
        self._feed.unsubscribe(self)

    def put(self, event: Output | Exited) -> None:
        """Queue ``event``, waiting while the queue is full and the follower still follows."""
        while not self.closed.is_set():
            try:
                self._queue.put(event, timeout=PUT_WAIT)
                return
            except queue.Full:
                continue


class ProcessFeed:
    """Fans a command's events out to its followers."""

    def __init__(self, process: LocalProcess, *, on_end: Callable[[], None]) -> None:
        self.process = process
        self._on_end = on_end
        self._lock = threading.Lock()
        self._followers: list[Follower] = []
        self._ended: Exited | None = None
        self._thread = threading.Thread(
            target=self._pump, name=f"piship-local-process-{process.pid}", daemon=True
        )

    def start(self) -> None:
        """Start reading the command (subscribe the first follower before)."""
        self._thread.start()

    def subscribe(self) -> Follower:
        """A follower of what happens from now on (just the end, if it has ended)."""
        follower = Follower(self)
        with self._lock:
            ended = self._ended
            if ended is None:
                self._followers.append(follower)
        if ended is not None:
            follower.put(ended)
        return follower

    def unsubscribe(self, follower: Follower) -> None:
        with self._lock:
            if follower in self._followers:
                self._followers.remove(follower)

    def _pump(self) -> None:
        try:
            for event in self.process.events(deadline=None, keepalive=_QUIET):
                if isinstance(event, Exited):
                    with self._lock:
                        self._ended = event
                    # Before any follower hears of the end: a List after it no longer shows it.
                    self._end()
                if isinstance(event, (Output, Exited)):
                    with self._lock:
                        followers = list(self._followers)
                    for follower in followers:
                        follower.put(event)
        finally:
            self._end()

    def _end(self) -> None:
        """Call ``on_end`` (once)."""
        on_end, self._on_end = self._on_end, lambda: None
        on_end()
