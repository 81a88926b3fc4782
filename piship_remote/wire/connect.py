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
    "encoded_envelope",
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
        """Whether this is the end-of-stream frame (flag ``0x02``).

        Its message holds the stream's outcome: ``{"error": {...}}`` for a failed
        stream (errors arrive inside HTTP 200), else ``{}`` or trailers under
        ``"metadata"``. A stream that ends without one was cut off.
        """
        return bool(self.flags & END_STREAM)

    @classmethod
    def parse(cls, flags: int, payload: bytes | memoryview) -> Frame:
        """The frame for one envelope's ``flags`` and raw ``payload``.

        Raises ``ValueError`` when the payload is not JSON.
        """
        return cls(flags, _decode(payload))


def connect_envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    """Encode ``message`` as one envelope with ``flags``."""
    payload = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
    return _HEADER.pack(flags, len(payload)) + payload


def encoded_envelope(payload: bytes, flags: int = 0) -> bytes:
    """One envelope with ``flags`` around ``payload``, JSON already encoded."""
    return _HEADER.pack(flags, len(payload)) + payload


class EnvelopeReader:
    """Turns chunks of a Connect stream, split anywhere, into :class:`Frame` objects.

    Raises ``ValueError`` for a frame over ``max_frame_bytes`` (``"oversized"``,
    before its payload arrives), a compressed frame, or a payload that is not JSON.
    Whole frames inside a chunk are sliced out of it without copying; only the
    frame a chunk ends in the middle of is buffered, so any split costs linear time.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._buffer = bytearray()

    def push(self, data: bytes | memoryview) -> list[Frame]:
        """Add ``data``; the frames it completed, in order (none while one is partial).

        Raises:
            ValueError: a frame over ``max_frame_bytes`` (``oversized``), a compressed frame, or a
                payload that is not JSON.
        """
        return [Frame.parse(flags, payload) for flags, payload in self.payloads(data)]

    def payloads(self, data: bytes | memoryview) -> list[tuple[int, bytes | memoryview]]:
        """Like :meth:`push`, but each frame as ``(flags, payload)``, its JSON not parsed.

        A payload may be a view into ``data``: ``data`` must not change afterwards
        (``bytes`` never does).
        """
        view = memoryview(data)
        found: list[tuple[int, bytes | memoryview]] = []
        position = self._complete(view, found)
        size = len(view)
        while size - position >= _HEADER.size:
            flags, length = self._header(view, position)
            start = position + _HEADER.size
            if size - start < length:
                break
            position = start + length
            found.append((flags, view[start:position]))
        if position < size:
            self._buffer += view[position:]
            if len(self._buffer) >= _HEADER.size:
                self._header(self._buffer, 0)  # refuse an oversized frame early
        return found

    @property
    def pending(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._buffer)

    def _complete(self, view: memoryview, found: list[tuple[int, bytes | memoryview]]) -> int:
        """Finish the buffered partial frame from ``view``; how much of ``view`` it took."""
        buffer = self._buffer
        if not buffer:
            return 0
        taken = 0
        if len(buffer) < _HEADER.size:
            taken = min(_HEADER.size - len(buffer), len(view))
            buffer += view[:taken]
            if len(buffer) < _HEADER.size:
                return taken
        flags, length = self._header(buffer, 0)
        more = min(_HEADER.size + length - len(buffer), len(view) - taken)
        buffer += view[taken : taken + more]
        taken += more
        if len(buffer) == _HEADER.size + length:
            found.append((flags, bytes(buffer[_HEADER.size :])))
            buffer.clear()
        return taken

    def _header(self, data: bytes | bytearray | memoryview, offset: int) -> tuple[int, int]:
        flags, length = _HEADER.unpack_from(data, offset)
        if length > self._max:
            raise ValueError("the sandbox sent an oversized stream frame")
        if flags & COMPRESSED:
            raise ValueError("the sandbox sent a compressed frame, which is not negotiated")
        return int(flags), int(length)


def _decode(payload: bytes | memoryview) -> dict[str, Any]:
    if not payload:
        return {}
    try:
        value = json.loads(bytes(payload) if isinstance(payload, memoryview) else payload)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ValueError("the sandbox sent a stream frame that is not JSON") from None
    return value if isinstance(value, dict) else {}
