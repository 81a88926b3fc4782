"""A command's recent output, kept by byte offset so a stream that dropped can be replayed.

Each stream of a command the local service runs keeps its last :data:`RING_BYTES`
bytes (8 MiB) in an :class:`OutputRing`; a ``Connect`` carrying the
``Piship-Output-Offset`` extension header is answered from the offset it asks for,
or from the oldest byte still kept when the ring has moved past it::

    ring = OutputRing(RING_BYTES)
    ring.append(b"hello")
    ring.since(2)        # (2, b"llo"): where the replay starts, and its bytes
"""

from __future__ import annotations

__all__ = ["REPLAY_CHUNK", "RING_BYTES", "OutputRing"]

RING_BYTES = 8 * 1024 * 1024
"""The bytes of each stream (stdout, stderr) a command keeps for a replay."""
REPLAY_CHUNK = 64 * 1024
"""The largest data event a replay sends."""


class OutputRing:
    """The last ``limit`` bytes of one stream, with the offset of the first one kept."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept = bytearray()
        self.start = 0  # the stream offset of self._kept[0]

    @property
    def end(self) -> int:
        """The stream offset after the last byte written."""
        return self.start + len(self._kept)

    def append(self, data: bytes) -> None:
        kept = self._kept
        kept += data
        excess = len(kept) - self._limit
        if excess > 0:
            del kept[:excess]  # cheap: a bytearray drops its front by moving its start
            self.start += excess

    def since(self, offset: int) -> tuple[int, bytes]:
        """``(where the replay starts, the bytes from there)`` for a reader holding
        ``offset`` bytes; the start is later than ``offset`` when those bytes are gone."""
        begin = min(max(offset, self.start), self.end)
        return begin, bytes(self._kept[begin - self.start :])
