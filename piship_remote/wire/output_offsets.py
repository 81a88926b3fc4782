"""The output-offset extension of envd's ``Connect``: replaying what a command wrote while
nobody listened.

A client that follows a command again after its stream dropped sends
``Piship-Output-Offset: stdout=<n>,stderr=<m>`` on ``/process.Process/Connect``: the bytes
of each stream it already has. A service that keeps recent output (the local service)
answers with the same header naming where its replay of each stream begins (later than
asked when its ring no longer holds the start) and streams from there; envd and the
official SDKs neither send nor read it, so the wire stays envd's::

    >>> format_offsets({"stdout": 10, "stderr": 0})
    'stdout=10,stderr=0'
    >>> parse_offsets("stdout=10, stderr=0")
    {'stdout': 10, 'stderr': 0}
    >>> parse_offsets("stdout=x") is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["OFFSET_HEADER", "OUTPUT_STREAMS", "format_offsets", "parse_offsets"]

OFFSET_HEADER = "Piship-Output-Offset"
OUTPUT_STREAMS = ("stdout", "stderr")
_MAX_DIGITS = 19


def format_offsets(offsets: Mapping[str, int]) -> str:
    """The header's value for ``offsets`` (stdout, then stderr)."""
    return ",".join(f"{stream}={int(offsets.get(stream, 0))}" for stream in OUTPUT_STREAMS)


def parse_offsets(value: str | None) -> dict[str, int] | None:
    """The offsets in a header's value; ``None`` for a missing or malformed one."""
    if value is None:
        return None
    offsets: dict[str, int] = {}
    for part in value.split(","):
        name, sep, number = part.strip().partition("=")
        if not sep or name not in OUTPUT_STREAMS or name in offsets:
            return None
        if not number.isdigit() or not number.isascii() or len(number) > _MAX_DIGITS:
            return None
        offsets[name] = int(number)
    return {stream: offsets.get(stream, 0) for stream in OUTPUT_STREAMS}
