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

Each stream's recent output stays in an :class:`OutputRing`; ``resume(offsets)``
subscribes with a replay of what was written after ``offsets``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Mapping

from piship_remote.local.envd.output_ring import REPLAY_CHUNK, RING_BYTES, OutputRing
from piship_remote.local.isolation.process import Exited, LocalProcess, Output, Stream
from piship_remote.wire.output_offsets import OUTPUT_STREAMS

__all__ = ["Follower", "ProcessFeed", "Resumed"]

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


class Resumed:
    """A follower that resumed: the replay to send before its events, and where each
    stream's replay begins."""

    def __init__(self, follower: Follower, starts: dict[str, int], replay: list[Output]) -> None:
        self.follower = follower
        self.starts = starts
        self.replay = replay


class ProcessFeed:
    """Fans a command's events out to its followers, keeping each stream's recent output."""

    def __init__(self, process: LocalProcess, *, on_end: Callable[[], None]) -> None:
        self.process = process
        self._on_end = on_end
        self._lock = threading.Lock()
        self._followers: list[Follower] = []
        self._ended: Exited | None = None
        self._rings = {stream: OutputRing(RING_BYTES) for stream in OUTPUT_STREAMS}
        self._stdout_name: Stream = "stdout"  # "pty" for a command on a terminal
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

    def resume(self, offsets: Mapping[str, int]) -> Resumed:
        """A follower of what happens from now on, with a replay of each stream from
        ``offsets`` (or from the oldest byte kept, when the ring has moved past it)."""
        follower = Follower(self)
        replay: list[Output] = []
        starts: dict[str, int] = {}
        with self._lock:
            for stream, ring in self._rings.items():
                starts[stream], data = ring.since(offsets.get(stream, 0))
                name: Stream = "stderr" if stream == "stderr" else self._stdout_name
                replay += [
                    Output(name, data[i : i + REPLAY_CHUNK])
                    for i in range(0, len(data), REPLAY_CHUNK)
                ]
            ended = self._ended
            if ended is None:
                self._followers.append(follower)
        if ended is not None:
            follower.put(ended)
        return Resumed(follower, starts, replay)

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
                        if isinstance(event, Output):
                            self._keep(event)
                        followers = list(self._followers)
                    for follower in followers:
                        follower.put(event)
        finally:
            self._end()

    def _keep(self, event: Output) -> None:
        """Add ``event`` to its ring (hold the lock); a terminal's output is its stdout."""
        if event.stream == "stderr":
            self._rings["stderr"].append(event.data)
            return
        self._stdout_name = event.stream
        self._rings["stdout"].append(event.data)

    def _end(self) -> None:
        """Call ``on_end`` (once)."""
        on_end, self._on_end = self._on_end, lambda: None
        on_end()
