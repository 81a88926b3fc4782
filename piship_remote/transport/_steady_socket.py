"""A TCP socket whose timeout changes only when the change matters.

CPython's ``socket.settimeout`` releases the GIL on every call (it sets the
descriptor's blocking mode with an ``ioctl``, even when the mode stays the same).
A request sets its socket's timeout up to four times (before the write, before
the response head, per read of the head, for the body), each time to what is
left of the same deadline, microseconds apart. With many threads every release
is a turn given away, so a change smaller than :data:`TOLERANCE` of the new
value is skipped: a wait may then end that fraction later, never earlier.
"""

from __future__ import annotations

import socket

__all__ = ["TOLERANCE", "SteadyTimeoutSocket"]

TOLERANCE = 0.001


class SteadyTimeoutSocket(socket.socket):
    """A ``socket.socket`` that keeps its timeout when the new one is within
    :data:`TOLERANCE` below it::

        sock = SteadyTimeoutSocket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(30.0)
        sock.settimeout(29.99999)  # kept at 30.0: no system call
        sock.settimeout(31.0)  # applied: a wait never ends before its timeout
    """

    __slots__ = ()

    def settimeout(self, value: float | None) -> None:
        current = self.gettimeout()
        if value == current:
            return
        if (
            value is not None
            and current is not None
            and 0 < value <= current <= value * (1 + TOLERANCE)
        ):
            return
        super().settimeout(value)
