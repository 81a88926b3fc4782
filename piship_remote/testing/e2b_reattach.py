"""The E2B double's followable commands: a Start stream cut after some bytes of output,
and ``Connect`` by tag that follows the same command again.

Armed with ``server.faults.cut_streams_after(...)``, a plain command answer (output and
an exit code) becomes a command that keeps running when its stream is cut: a
``Connect`` naming its tag streams the rest and its end. Like envd, the double keeps
nothing by default: a Connect goes on from where the command is now, past the
``unheard`` bytes of stdout it wrote while nobody listened. ``E2bServer(keep_output=
True)`` keeps the output and honours the ``Piship-Output-Offset`` extension as the
local service does. A ``resumable`` command's spool files get the whole output::

    server = E2bServer(command=lambda start: {"stdout": "1\\n2\\n3\\n"})
    server.faults.cut_streams_after(2, unheard=2)
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator, Mapping

from piship_remote.testing.e2b_commands import PID, CommandAnswer, answer_end, answer_output
from piship_remote.testing.recorder import DropConnection
from piship_remote.wire.e2b_json import end_stream_frame, event_frame
from piship_remote.wire.envd import ConnectError, DataEvent, StartEvent
from piship_remote.wire.output_offsets import OUTPUT_STREAMS

__all__ = ["FollowedCommands", "is_followable", "spooled_output"]

_CHUNK_BYTES = 32 * 1024  # envd's stdChunkSize
_PLAIN_KEYS = frozenset({"stdout", "stderr", "chunks", "exit_code", "omit_zero_exit"})


def is_followable(answer: CommandAnswer) -> bool:
    """Whether ``answer`` is plain output and an exit code (what a cut can apply to)."""
    return set(answer) <= _PLAIN_KEYS


def spooled_output(answer: CommandAnswer) -> dict[str, bytes]:
    """Each stream's whole output in ``answer``, as a spool file would hold it."""
    whole = dict.fromkeys(OUTPUT_STREAMS, b"")
    for stream, piece in answer_output(answer):
        whole[stream] += piece
    return whole


class _Command:
    """One followable command: its whole output, its end, and what has been streamed."""

    def __init__(self, answer: CommandAnswer) -> None:
        self.output = spooled_output(answer)
        self.answer = answer
        self.sent = dict.fromkeys(OUTPUT_STREAMS, 0)  # the furthest offset streamed


class FollowedCommands:
    """The double's commands that a Connect may follow, by tag."""

    def __init__(self, *, keep_output: bool) -> None:
        self.keep_output = keep_output
        self._lock = threading.Lock()
        self._commands: dict[str, _Command] = {}

    def started(self, answer: CommandAnswer, tag: str, cut: int | None) -> Iterator[bytes]:
        """The Start stream of ``answer``, cut after ``cut`` bytes of output."""
        command = _Command(answer)
        with self._lock:
            self._commands[tag] = command
        return self._frames(command, dict.fromkeys(OUTPUT_STREAMS, 0), cut)

    def connect(
        self, tag: str, offsets: Mapping[str, int] | None, cut: int | None, unheard: int
    ) -> tuple[dict[str, int] | None, Iterator[bytes]]:
        """A Connect stream to ``tag`` (``None`` headers: nothing replayed), cut after
        ``cut`` bytes; an unknown tag is envd's ``not_found``."""
        with self._lock:
            command = self._commands.get(tag)
        if command is None:
            error = ConnectError("not_found", f"process with tag '{tag}' not found")
            return None, iter([event_frame("start", StartEvent(PID)), end_stream_frame(error)])
        if self.keep_output and offsets is not None:
            starts = {s: min(offsets[s], len(command.output[s])) for s in OUTPUT_STREAMS}
            return starts, self._frames(command, starts, cut)
        now = dict(command.sent)
        now["stdout"] = min(now["stdout"] + unheard, len(command.output["stdout"]))
        return None, self._frames(command, now, cut)

    def _frames(
        self, command: _Command, starts: Mapping[str, int], cut: int | None
    ) -> Iterator[bytes]:
        yield event_frame("start", StartEvent(PID))
        budget = cut
        for stream in OUTPUT_STREAMS:
            data = command.output[stream][starts[stream] :]
            if budget is not None and len(data) >= budget:
                yield from _data(stream, data[:budget])
                self._sent(command, stream, starts[stream] + budget)
                raise DropConnection
            yield from _data(stream, data)
            self._sent(command, stream, starts[stream] + len(data))
            if budget is not None:
                budget -= len(data)
        yield event_frame("end", answer_end(command.answer))
        yield end_stream_frame()

    def _sent(self, command: _Command, stream: str, offset: int) -> None:
        with self._lock:
            command.sent[stream] = max(command.sent[stream], offset)


def _data(stream: str, data: bytes) -> Iterator[bytes]:
    """``data`` in data events of at most envd's 32 KiB each."""
    for at in range(0, len(data), _CHUNK_BYTES):
        encoded = base64.b64encode(data[at : at + _CHUNK_BYTES]).decode()
        event = DataEvent(stdout=encoded) if stream == "stdout" else DataEvent(stderr=encoded)
        yield event_frame("data", event)

