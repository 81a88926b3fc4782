"""A marked gap in a command's output: where bytes may be missing after a dropped stream.

When a command's stream dropped and was followed again, the output written meanwhile is
replayed where the service keeps it. Where it does not, the output callback gets an
:class:`OutputGap` in the place of the missing bytes, never silently joined text. It is a
``bytes`` whose text says what happened, so a caller that just prints chunks shows it; a
caller that needs the figure checks ``isinstance(chunk, OutputGap)``::

    >>> gap = OutputGap("stdout", 1200)
    >>> bytes(gap)
    b'\\n[piship-remote: 1200 bytes of stdout may be missing here]\\n'
    >>> gap.stream, gap.size
    ('stdout', 1200)
    >>> OutputGap("stderr", UNKNOWN_SIZE)
    OutputGap('stderr', -1)
"""

from __future__ import annotations

__all__ = ["UNKNOWN_SIZE", "GapTally", "OutputGap", "add_missing", "nothing_missing"]

UNKNOWN_SIZE = -1
"""``OutputGap.size`` (and ``CommandResult.missing``'s value) when the service cannot say
how many bytes were written while nobody listened."""


class OutputGap(bytes):
    """A marker chunk: up to ``size`` bytes of ``stream`` may be missing at this point
    (``UNKNOWN_SIZE``: an unknown number)."""

    stream: str
    size: int

    def __new__(cls, stream: str, size: int) -> OutputGap:
        amount = "an unknown number of" if size == UNKNOWN_SIZE else str(size)
        text = f"\n[piship-remote: {amount} bytes of {stream} may be missing here]\n"
        gap = super().__new__(cls, text.encode("ascii"))
        gap.stream = stream
        gap.size = size
        return gap

    def __repr__(self) -> str:
        return f"OutputGap({self.stream!r}, {self.size})"

    def __reduce__(self) -> tuple[type[OutputGap], tuple[str, int]]:
        return (OutputGap, (self.stream, self.size))


def add_missing(total: int, size: int) -> int:
    """``total`` bytes missing so far plus a gap of ``size`` (unknown stays unknown)."""
    if UNKNOWN_SIZE in (total, size):
        return UNKNOWN_SIZE
    return total + size


def nothing_missing() -> dict[str, int]:
    """Each output stream with no byte missing: a result's ``missing`` when nothing was cut."""
    return {"stdout": 0, "stderr": 0}


class GapTally:
    """Per stream, the bytes that may be missing: the sizes of the gaps seen so far::

        >>> tally = GapTally()
        >>> tally.see("stdout", OutputGap("stdout", 10)), tally.see("stdout", b"12\\n")
        (True, False)
        >>> tally.missing
        {'stdout': 10, 'stderr': 0}
    """

    def __init__(self) -> None:
        self.missing = nothing_missing()

    def see(self, stream: str, chunk: bytes) -> bool:
        """Count ``chunk`` if it is an :class:`OutputGap`; whether it was one."""
        if not isinstance(chunk, OutputGap):
            return False
        self.missing[stream] = add_missing(self.missing[stream], chunk.size)
        return True
