"""Following a command again after its stream dropped: envd's ``Connect`` by tag, the
output replayed by offset where the service keeps it, and a marked gap where it does not.

envd keeps a command running when its Start stream breaks (a proxy's idle cut, a reset).
:func:`follow` reads the stream; when it drops, it reconnects to the same process with
``Connect`` (never a second Start) within the command's deadline, tells the service what
it already has (the ``Piship-Output-Offset`` extension), and goes on until the end event.
A service that replays (the local service) answers where its replay begins; output
before that, or all of it on a service that keeps nothing, reaches the callbacks as an
:class:`~piship_remote.OutputGap`. When no reconnect succeeds the first drop's error is
raised: the outcome stays unknown::

    cursor = OutputCursor(on_stdout, on_stderr)
    result = follow(response, read, reconnect, cursor, token, deadline)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs

from piship_remote.backends.base import BackendResult, OutputCallback
from piship_remote.backends.e2b._stream import StreamDropped
from piship_remote.model.errors import PiShipError
from piship_remote.model.output_gap import UNKNOWN_SIZE, GapTally, OutputGap
from piship_remote.transport import HttpReply, TransportError
from piship_remote.transport._cancel import CancelToken
from piship_remote.transport.deadline import Deadline
from piship_remote.wire.output_offsets import OFFSET_HEADER, OUTPUT_STREAMS, parse_offsets

__all__ = ["MAX_REATTACHES", "OutputCursor", "follow", "reconnect_within"]

MAX_REATTACHES = 64
"""Drops one command survives; past them its outcome is unknown."""
CONNECT_TRIES = 6
"""Connects tried after one drop (backing off from :data:`FIRST_BACKOFF`) before giving up."""
FIRST_BACKOFF = 0.05

Read = Callable[[HttpReply], BackendResult]
Reconnect = Callable[[Mapping[str, int]], HttpReply]
SpoolReader = Callable[[str, int], "bytes | None"]
"""``(stream, offset)`` → the stream's spooled bytes from ``offset`` (``None``: unreadable)."""


class OutputCursor:
    """The output callbacks of one command, with the bytes each stream delivered, so a
    replay is joined at its offset (duplicates dropped) and a hole is marked."""

    def __init__(
        self,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        spool: SpoolReader | None = None,
    ) -> None:
        self._outputs = {"stdout": on_stdout, "stderr": on_stderr}
        self.offsets = dict.fromkeys(OUTPUT_STREAMS, 0)  # bytes delivered
        self._positions = dict.fromkeys(OUTPUT_STREAMS, 0)  # offset of the next byte read
        self._spool = spool
        self.spooling = False  # the rest comes from the spool, once the command ended
        # Gaps are told once the new stream delivers: a Connect refused tells nothing.
        self._pending: list[tuple[str, int]] = []
        self.gaps = GapTally()  # the gaps told

    def stdout(self, chunk: bytes) -> None:
        self._receive("stdout", chunk)

    def stderr(self, chunk: bytes) -> None:
        self._receive("stderr", chunk)

    def resumed(self, starts: Mapping[str, int] | None) -> None:
        """A new stream follows; ``starts``: where the service's replay of each stream
        begins (``None``: it replays nothing, so an unknown amount may be missing)."""
        if starts is None and self._spool is not None:
            self.spooling = True  # live bytes have no offset: the spool has them all
            return
        self._pending = []
        for stream in OUTPUT_STREAMS:
            have = self.offsets[stream]
            if starts is None:
                self._pending.append((stream, UNKNOWN_SIZE))
                self._positions[stream] = have
                continue
            start = starts[stream]
            if start > have:
                self._pending.append((stream, start - have))
                self.offsets[stream] = start
            self._positions[stream] = start

    def finish(self) -> None:
        """The command ended: tell the gaps still pending, and read the spool back."""
        self._tell_gaps()
        self._backfill()

    def _backfill(self) -> None:
        """After the end: deliver what the spool holds past each stream's offset (a gap
        of unknown size where it cannot be read)."""
        if not self.spooling or self._spool is None:
            return
        self.spooling = False
        for stream in OUTPUT_STREAMS:
            rest = self._spool(stream, self.offsets[stream])
            if rest is None:
                self._gap(stream, UNKNOWN_SIZE)
                continue
            self.offsets[stream] += len(rest)
            callback = self._outputs[stream]
            if callback is not None and rest:
                callback(rest)

    def _receive(self, stream: str, chunk: bytes) -> None:
        if self.spooling:
            return
        if self._pending:
            self._tell_gaps()
        position = self._positions[stream]
        end = position + len(chunk)
        self._positions[stream] = end
        have = self.offsets[stream]
        if end <= have:
            return  # replayed bytes already delivered
        if position < have:
            chunk = chunk[have - position :]
        self.offsets[stream] = end
        callback = self._outputs[stream]
        if callback is not None:
            callback(chunk)

    def _tell_gaps(self) -> None:
        pending, self._pending = self._pending, []
        for stream, size in pending:
            self._gap(stream, size)

    def _gap(self, stream: str, size: int) -> None:
        gap = OutputGap(stream, size)
        self.gaps.see(stream, gap)
        callback = self._outputs[stream]
        if callback is not None:
            callback(gap)


def follow(
    response: HttpReply,
    read: Read,
    reconnect: Reconnect,
    cursor: OutputCursor,
    token: CancelToken,
    deadline: Deadline | None,
    first: PiShipError | None = None,
) -> BackendResult:
    """Read ``response`` to the command's end, reconnecting after each drop (see the module).

    ``read`` raises :class:`StreamDropped` for a stream that broke; ``reconnect`` opens a
    Connect stream given the offsets the cursor holds. ``first``: the error to raise if
    following fails, when ``response`` is already a Connect (Start's answer was lost).
    """
    for _ in range(MAX_REATTACHES + 1):
        with response:
            try:
                result = read(response)
                cursor.finish()
                return attrs.evolve(result, missing=dict(cursor.gaps.missing))
            except StreamDropped as dropped:
                first = first or dropped.error
            except PiShipError:
                if first is None:
                    raise
                raise first.with_traceback(None) from None  # a Connect refused: unknown
        again = reconnect_within(reconnect, cursor, token, deadline)
        if again is None:
            break
        response = again
        cursor.resumed(parse_offsets(response.headers.get(OFFSET_HEADER)))
    assert first is not None
    raise first.with_traceback(None)


def reconnect_within(
    reconnect: Reconnect, cursor: OutputCursor, token: CancelToken, deadline: Deadline | None
) -> HttpReply | None:
    """A Connect stream to the command, tried a few times within the deadline; ``None``
    when none could be opened (or the command was cancelled meanwhile)."""
    backoff = FIRST_BACKOFF
    for _ in range(CONNECT_TRIES):
        if token.is_set() or (deadline is not None and deadline.expired):
            return None
        try:
            return reconnect(dict(cursor.offsets))
        except TransportError:
            pass  # the way back is not open yet: try again
        except PiShipError:
            return None  # the service answered: it cannot follow the command
        left = None if deadline is None else deadline.remaining()
        pause = backoff if left is None else min(backoff, max(left, 0.0))
        if token.wait(pause):
            return None
        backoff *= 2
    return None
