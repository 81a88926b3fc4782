"""A command's recent output, kept by byte offset so a stream that dropped can be replayed.

Each stream of a command the local service runs keeps the last :data:`RING_BYTES`
(16 MiB) it handed to a connection in an :class:`OutputRing`, and what it read but
handed to nobody yet; a ``Connect`` carrying the ``Piship-Output-Offset`` extension
header is answered from the offset it asks for, or from the oldest byte still kept
when the ring has moved past it::

    ring = OutputRing(RING_BYTES)
    ring.append(b"hello", holding=True)
    ring.mark_sent(2)    # a connection took the first two bytes
    ring.since(2)        # (2, b"llo"): where the replay starts, and its bytes

While the command is followed (or was, within its feed's grace) the ring is *holding*:
it drops nothing of the last ``limit`` bytes sent (a cut loses what the kernel and any
proxy buffered, which the client asks for again) nor anything unsent; its feed stops
reading the command once :data:`HELD_BYTES` are unsent. Otherwise it keeps the last
``limit`` bytes, oldest dropped first.
"""

from __future__ import annotations

__all__ = ["HELD_BYTES", "REPLAY_CHUNK", "RING_BYTES", "OutputRing"]

RING_BYTES = 16 * 1024 * 1024
"""The sent bytes of each stream (stdout, stderr) a command keeps for a replay: what a
stalled proxy's kernel buffers may hold past what its client got (8 MiB was short of that
on loopback, where a receive buffer grows to 32 MiB)."""
HELD_BYTES = 4 * 1024 * 1024
"""The unsent bytes of a stream at most, while holding: then the command waits."""
REPLAY_CHUNK = 64 * 1024
"""The largest data event a replay sends."""


class OutputRing:
    """One stream's bytes from ``start`` to ``end``, and how far a connection took them."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept = bytearray()
        self.start = 0  # the stream offset of self._kept[0]
        self.sent = 0  # the furthest offset a connection took

    @property
    def end(self) -> int:
        """The stream offset after the last byte written."""
        return self.start + len(self._kept)

    @property
    def unsent(self) -> int:
        """Bytes written that no connection took yet."""
        return self.end - max(self.sent, self.start)

    @property
    def kept(self) -> int:
        return len(self._kept)

    def append(self, data: bytes, *, holding: bool) -> None:
        """Add ``data``; drop the oldest bytes beyond the limit (when ``holding``, only
        sent ones beyond it)."""
        self._kept += data
        self.trim(holding=holding)

    def trim(self, *, holding: bool = False) -> None:
        """Drop the oldest bytes beyond the limit (when ``holding``, only sent ones)."""
        floor = self.end - self._limit
        if holding:
            floor = min(floor, self.sent - self._limit)
        excess = floor - self.start
        if excess > 0:
            del self._kept[:excess]  # cheap: a bytearray drops its front by moving its start
            self.start += excess

    def mark_sent(self, offset: int) -> None:
        """A connection took the bytes before ``offset``."""
        self.sent = min(max(self.sent, offset), self.end)

    def since(self, offset: int) -> tuple[int, bytes]:
        """``(where the replay starts, the bytes from there)`` for a reader holding
        ``offset`` bytes; the start is later than ``offset`` when those bytes are gone."""
        begin = min(max(offset, self.start), self.end)
        return begin, bytes(self._kept[begin - self.start :])
