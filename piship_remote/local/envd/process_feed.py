"""One running command's events, shared by every stream that follows it (Start and Connect).

A :class:`ProcessFeed` reads a :class:`LocalProcess` on its own
``piship-local-process`` thread and hands each event to every subscriber; a
subscriber sees what happens from the moment it subscribes, and the end is kept
for those who come after it. A slow subscriber slows the command (its output
pipe fills), as a slow reader of envd's stream does::

    feed = ProcessFeed(process, on_end=lambda: sandbox.forget(process), deadline=None)
    follower = feed.subscribe()
    feed.start()
    event = follower.next(timeout=5.0)   # Output | Exited, or None when nothing came
    follower.delivered(event)            # an Output the connection took
    follower.close()

Each stream's recent output stays in an :class:`OutputRing`; ``resume(offsets)``
subscribes with a replay of what was written after ``offsets``. No byte a client may
not have received is dropped while it can come back: while the command is followed,
and for :data:`GRACE` seconds after its last follower left, the feed stops reading the
command once :data:`~output_ring.HELD_BYTES` of a stream are unsent (the command waits
on its write, as behind a slow reader). After the grace, a command nobody follows (a
background command, an SDK's ``disconnect()``) runs on and its ring drops the oldest.
The feed also kills the command at its Start's ``deadline``.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections.abc import Callable, Mapping

from piship_remote.local.envd.output_ring import HELD_BYTES, REPLAY_CHUNK, RING_BYTES, OutputRing
from piship_remote.local.isolation.process import Exited, LocalProcess, Output, Stream
from piship_remote.wire.output_offsets import OUTPUT_STREAMS

__all__ = ["GRACE", "Follower", "ProcessFeed", "Resumed"]

BACKLOG = 256
PUT_WAIT = 0.5
GRACE = 30.0
"""Seconds a command nobody follows any more is still held back for a client to come back."""
# The thread reports no keepalives of its own: each stream keeps its own interval.
_QUIET = 24 * 3600.0
_RECHECK = 1.0  # seconds between looks at the hold while waiting for room


class Follower:
    """One subscriber's queue of a feed's events."""

    def __init__(self, feed: ProcessFeed, positions: dict[str, int]) -> None:
        self._feed = feed
        self.pid = feed.process.pid
        self._queue: queue.Queue[Output | Exited] = queue.Queue(BACKLOG)
        self._positions = positions  # each stream's offset after what this follower took
        self.closed = threading.Event()

    def next(self, timeout: float) -> Output | Exited | None:
        """The next event, or ``None`` when none came within ``timeout`` seconds."""
        try:
            return self._queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None

    def delivered(self, output: Output) -> None:
        """The connection took ``output`` (the next of its stream)."""
        stream = _ring_name(output)
        self._positions[stream] += len(output.data)
        self._feed.mark_sent(stream, self._positions[stream])

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

    def __init__(
        self, process: LocalProcess, *, on_end: Callable[[], None], deadline: float | None
    ) -> None:
        self.process = process
        self._on_end = on_end
        self._deadline = deadline
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # a ring's unsent part shrank
        self._followers: list[Follower] = []
        self._left_at = -math.inf  # when the last follower left
        self._followers_hold = True  # until the command is killed at its deadline
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
        with self._lock:
            follower = Follower(self, {name: ring.end for name, ring in self._rings.items()})
            ended = self._ended
            if ended is None:
                self._followers.append(follower)
        if ended is not None:
            follower.put(ended)
        return follower

    def resume(self, offsets: Mapping[str, int]) -> Resumed:
        """A follower of what happens from now on, with a replay of each stream from
        ``offsets`` (or from the oldest byte kept, when the ring has moved past it)."""
        replay: list[Output] = []
        starts: dict[str, int] = {}
        with self._lock:
            holding = self._hold_left() > 0
            for stream, ring in self._rings.items():
                ring.trim(holding=holding)
                starts[stream], data = ring.since(offsets.get(stream, 0))
                name: Stream = "stderr" if stream == "stderr" else self._stdout_name
                replay += [
                    Output(name, data[i : i + REPLAY_CHUNK])
                    for i in range(0, len(data), REPLAY_CHUNK)
                ]
            follower = Follower(self, dict(starts))
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
                if not self._followers:
                    self._left_at = time.monotonic()
                self._room.notify_all()

    def mark_sent(self, stream: str, offset: int) -> None:
        """A connection took ``stream``'s bytes before ``offset``."""
        with self._lock:
            ring = self._rings[stream]
            full = ring.unsent >= HELD_BYTES
            ring.mark_sent(offset)
            if full:
                self._room.notify_all()

    def _pump(self) -> None:
        try:
            for event in self.process.events(deadline=self._deadline, keepalive=_QUIET):
                if isinstance(event, Exited):
                    with self._lock:
                        self._ended = event
                    # Before any follower hears of the end: a List after it no longer shows it.
                    self._end()
                if isinstance(event, (Output, Exited)):
                    with self._lock:
                        if isinstance(event, Output):
                            self._wait_for_room(self._rings[_ring_name(event)])
                            self._keep(event)
                        followers = list(self._followers)
                    for follower in followers:
                        follower.put(event)
        finally:
            self._end()

    def _keep(self, event: Output) -> None:
        """Add ``event`` to its ring (hold the lock); a terminal's output is its stdout."""
        if event.stream != "stderr":
            self._stdout_name = event.stream
        self._rings[_ring_name(event)].append(event.data, holding=self._hold_left() > 0)

    def _wait_for_room(self, ring: OutputRing) -> None:
        """Wait (hold the lock) while ``ring`` holds all it may unsent, until a connection
        takes some, the hold ends, the command is killed, or its deadline, which kills it."""
        while ring.unsent >= HELD_BYTES:
            deadline = self._deadline
            if deadline is not None and time.monotonic() >= deadline:
                self.process.kill("deadline")
                self._deadline, self._left_at = None, -math.inf
                self._followers_hold = False
                return
            wait = self._hold_left()
            if wait <= 0 or self.process.killed is not None:
                return  # a killed command (its sandbox deleted, the service closing) is not held
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
            self._room.wait(max(min(wait, _RECHECK), 0.0))

    def _hold_left(self) -> float:
        """Seconds the feed still holds back the command's output (hold the lock)."""
        if self._followers and self._followers_hold:
            return math.inf
        return self._left_at + GRACE - time.monotonic()

    def _end(self) -> None:
        """Call ``on_end`` (once)."""
        on_end, self._on_end = self._on_end, lambda: None
        on_end()


def _ring_name(output: Output) -> str:
    """The ring of ``output``'s stream: a terminal's output is stdout."""
    return "stderr" if output.stream == "stderr" else "stdout"
