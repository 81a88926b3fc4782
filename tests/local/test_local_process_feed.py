"""A command's output feed holds back a command nobody takes the output of: while it is
followed, and for a grace after its last follower left, it reads no more than
``HELD_BYTES`` unsent per stream (the command waits, its memory bounded), and after the
grace a command nobody follows runs on, its ring dropping the oldest."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar, cast

import pytest

from piship_remote.local.envd import process_feed
from piship_remote.local.envd.process_feed import Follower, ProcessFeed
from piship_remote.local.isolation.process import Exited, LocalProcess, Output

pytestmark = pytest.mark.timeout(30)

CHUNK = 1024
HELD = 64 * CHUNK
RING = 32 * CHUNK


class Writer:
    """A stand-in command writing ``total`` bytes of stdout in ``CHUNK`` pieces, as fast
    as it is read; ``read`` says how many bytes were taken from it."""

    pid = 4242
    tag = "writer"
    made: ClassVar[list[Writer]] = []

    def __init__(self, total: int) -> None:
        Writer.made.append(self)
        self.total = total
        self.read = 0
        self.reached = threading.Event()  # more than HELD read
        self.killed: str | None = None

    def events(self, *, deadline: float | None, keepalive: float) -> Iterator[Output | Exited]:
        while self.read < self.total:
            self.read += CHUNK
            if self.read > HELD:
                self.reached.set()
            yield Output("stdout", bytes([self.read // CHUNK % 256]) * CHUNK)
        yield Exited(0)

    def kill(self, reason: str, sig: int = 9) -> None:
        if self.killed is None:
            self.killed = reason


@pytest.fixture(autouse=True)
def small_rings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_feed, "HELD_BYTES", HELD)
    monkeypatch.setattr(process_feed, "RING_BYTES", RING)


@pytest.fixture(autouse=True)
def no_feed_left() -> Iterator[None]:
    """Each test's stand-in commands are killed at its end, and their feeds end with them."""
    yield
    for writer in Writer.made:
        writer.kill("test over")
        writer.total = writer.read
    Writer.made.clear()
    end = time.monotonic() + 10
    while feed_threads() and time.monotonic() < end:
        threading.Event().wait(0.05)
    assert feed_threads() == []


def feed_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("piship-local-process-")]


def feed_of(writer: Writer) -> tuple[ProcessFeed, Follower, threading.Event]:
    ended = threading.Event()
    feed = ProcessFeed(cast(LocalProcess, writer), on_end=ended.set, deadline=None)
    follower = feed.subscribe()
    feed.start()
    return feed, follower, ended


def take(follower: Follower, size: int) -> int:
    """Take ``size`` bytes of output as a connection would; the bytes taken."""
    taken = 0
    while taken < size:
        event = follower.next(5.0)
        assert isinstance(event, Output)
        follower.delivered(event)
        taken += len(event.data)
    return taken


def settled(writer: Writer) -> int:
    """What the writer has been read of, once the feed stopped reading it."""
    before = -1
    while before != writer.read:
        before = writer.read
        threading.Event().wait(0.2)
    return writer.read


def test_a_followed_command_is_read_no_further_than_the_held_bytes_ahead_of_its_reader() -> None:
    writer = Writer(total=100 * HELD)
    _, follower, _ = feed_of(writer)
    assert writer.reached.wait(5.0)
    assert settled(writer) == HELD + CHUNK
    follower.close()


def test_what_a_connection_takes_lets_the_command_write_as_much_again() -> None:
    writer = Writer(total=100 * HELD)
    _, follower, _ = feed_of(writer)
    settled(writer)
    take(follower, 16 * CHUNK)
    assert settled(writer) == HELD + 17 * CHUNK
    follower.close()


def test_within_the_grace_a_command_whose_follower_left_waits_and_nothing_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_feed, "GRACE", 30.0)
    writer = Writer(total=100 * HELD)
    feed, follower, _ = feed_of(writer)
    taken = take(follower, 8 * CHUNK)
    follower.close()
    assert settled(writer) == taken + HELD + CHUNK  # a chunk read waits to be kept
    resumed = feed.resume({"stdout": 0, "stderr": 0})
    assert resumed.starts["stdout"] == 0
    assert sum(len(o.data) for o in resumed.replay) == taken + HELD
    resumed.follower.close()


def test_after_the_grace_a_command_nobody_follows_runs_to_its_end_keeping_its_last_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_feed, "GRACE", 0.2)
    writer = Writer(total=100 * HELD)
    feed, follower, ended = feed_of(writer)
    follower.close()
    assert ended.wait(10.0)
    resumed = feed.resume({"stdout": 0, "stderr": 0})
    assert resumed.starts["stdout"] == writer.total - RING
    assert sum(len(o.data) for o in resumed.replay) == RING
    event: Any = resumed.follower.next(1.0)
    assert isinstance(event, Exited) and event.exit_code == 0


def test_after_the_grace_a_command_is_not_killed_before_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(process_feed, "GRACE", 0.2)
    writer = Writer(total=100 * HELD)
    ended = threading.Event()
    deadline = time.monotonic() + 600
    feed = ProcessFeed(cast(LocalProcess, writer), on_end=ended.set, deadline=deadline)
    feed.subscribe().close()
    feed.start()
    assert ended.wait(10.0)
    assert writer.killed is None


def test_a_held_command_is_killed_at_its_deadline() -> None:
    writer = Writer(total=100 * HELD)
    feed = ProcessFeed(cast(LocalProcess, writer), on_end=lambda: None, deadline=0.0)
    follower = feed.subscribe()
    feed.start()
    settled(writer)
    assert writer.killed == "deadline"
    follower.close()


def test_a_held_command_that_is_killed_is_held_no_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_feed, "GRACE", 30.0)
    writer = Writer(total=100 * HELD)
    _, follower, ended = feed_of(writer)
    follower.close()
    settled(writer)
    writer.kill("sandbox deleted")  # as when its sandbox is deleted or the service closes
    assert ended.wait(10.0)
    assert writer.read == writer.total
