"""The Connect protocol's streaming envelope: encode one, decode a byte stream of them.

An envelope is one flags byte, a 4-byte big-endian payload length, then the
payload (compact UTF-8 JSON here)::

    >>> connect_envelope({"a": 1})
    b'\\x00\\x00\\x00\\x00\\x07{"a":1}'
    >>> EnvelopeReader().push(connect_envelope({}, END_STREAM))
    [Frame(flags=2, message={})]
"""

from __future__ import annotations

import json
import struct
from typing import Any

import attrs

__all__ = [
    "COMPRESSED",
    "END_STREAM",
    "MAX_FRAME_BYTES",
    "EnvelopeReader",
    "Frame",
    "connect_envelope",
]

COMPRESSED = 0x01
END_STREAM = 0x02
MAX_FRAME_BYTES = 16 * 1024 * 1024
_HEADER = struct.Struct(">BI")


@attrs.frozen
class Frame:
    """One decoded envelope; ``message`` is the JSON object (``{}`` when empty or not an object)."""

    flags: int
    message: dict[str, Any]

    @property
    def end_stream(self) -> bool:
        return bool(self.flags & END_STREAM)


def connect_envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    """Encode ``message`` as one envelope with ``flags``."""
    payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    return _HEADER.pack(flags, len(payload)) + payload


class EnvelopeReader:
    """Turns chunks of a Connect stream, split anywhere, into :class:`Frame` objects.

    Raises ``ValueError`` for a frame over ``max_frame_bytes`` (``"oversized"``,
    before its payload arrives), a compressed frame, or a payload that is not JSON.
    Bytes are copied once into the buffer and consumed by offset, so a large frame
    arriving in many small chunks costs linear time.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buffer = bytearray()
        self._offset = 0

    def push(self, data: bytes) -> list[Frame]:
        """Add ``data``; the frames it completed, in order (none while one is partial)."""
        self._buffer += data
        frames: list[Frame] = []
        while (frame := self._next()) is not None:
            frames.append(frame)
        self._compact()
        return frames

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buffer) - self._offset

    def _next(self) -> Frame | None:
        if self.pending < _HEADER.size:
            return None
        flags, length = _HEADER.unpack_from(self._buffer, self._offset)
        if length > self._max:
            raise ValueError("the sandbox sent an oversized stream frame")
        if flags & COMPRESSED:
            raise ValueError("the sandbox sent a compressed frame, which is not negotiated")
        start = self._offset + _HEADER.size
        if len(self._buffer) - start < length:
            return None
        payload = bytes(self._buffer[start : start + length])
        self._offset = start + length
        return Frame(flags, _decode(payload))

    def _compact(self) -> None:
        if self._offset:
            del self._buffer[: self._offset]
            self._offset = 0


def _decode(payload: bytes) -> dict[str, Any]:
    if not payload:
        return {}
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError("the sandbox sent a stream frame that is not JSON") from None
    return value if isinstance(value, dict) else {}
