"""The E2B double's commands: a test's answer to a Start request, and the envd frames it becomes.

:class:`~piship_remote.testing.e2b_server.E2bServer` hands each StartRequest to
its ``command(start)`` (see :func:`command_answer`) and streams what
:func:`answer_frames` makes of the answer::

    answer = command_answer(start, lambda start: {"stdout": "hi\\n", "exit_code": 3})
    frames = list(answer_frames(answer, wait=server.wait, hang=None))
    # start {"pid": 42}, data {"stdout": "aGkK"}, end {"exitCode": 3, ...}, end-of-stream {}

A script containing ``piship-sandbox-ready`` (the backend's readiness probe) is
answered ``piship-sandbox-ready <envs.PISHIP_PROBE_UNLISTED or unset>\\n`` without
asking ``command``. The answer is a mapping with any of:

=================  ==================================================================
``stdout``         text or bytes, one data frame (standard base64)
``stderr``         text or bytes, one data frame after stdout
``chunks``         a list of text/bytes pieces, each its own stdout frame (after stdout)
``exit_code``      int, default 0; sent as ``exitCode`` only when non-zero, like envd
``omit_zero_exit`` default True; False sends ``"exitCode": 0`` explicitly
``keepalive``      True: a keepalive event after start and after every data frame
``after``          a ``threading.Event``: the stream waits for it before ending
``cat``            True: after the start event the stream waits for CloseStdin of its
                   tag, then sends the input SendInput gave it as stdout (``cat``)
``hang``           True: no end; the stream stays open until SendSignal (then ``{}``
                   end-of-stream) or until the server closes (then a drop)
``killed_end``     with ``hang``: after SendSignal, first send envd's end event for a
                   SIGKILLed process (``exitCode: -1``, ``status: "signal: killed"``,
                   ``error``), as real envd does and the official SDK expects
``stream_error``   message: end-of-stream ``{"error":{"code":"internal","message":…}}``
                   and no end event
``no_end_stream``  True: the end event, then the body ends without end-of-stream
``drop``           True: cut the connection after the output (a mid-stream reset)
``status``         answer Start with this HTTP status and ``body`` instead of a stream
``body``           the body for ``status`` (text, bytes or JSON value)
``content_type``   the Start response's content type (default ``application/connect+json``)
=================  ==================================================================
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from piship_remote.testing.recorder import DropConnection
from piship_remote.wire.e2b_json import end_stream_frame, event_frame, unstructure
from piship_remote.wire.envd import ConnectError, DataEvent, EndEvent, StartEvent

__all__ = [
    "CHECK_MARKER",
    "KILLED_END",
    "PID",
    "Command",
    "CommandAnswer",
    "answer_end",
    "answer_frames",
    "answer_output",
    "command_answer",
]

PID = 42
CHECK_MARKER = "piship-sandbox-ready"
# envd's end event after SIGKILL: ExitCode() -1, Exited() false (omitted), Go's status text.
KILLED_END = EndEvent(exit_code=-1, exited=False, status="signal: killed", error="signal: killed")

CommandAnswer = Mapping[str, Any]
Command = Callable[[dict[str, Any]], CommandAnswer]

_ANSWER_KEYS = frozenset(
    {
        "stdout",
        "stderr",
        "chunks",
        "exit_code",
        "omit_zero_exit",
        "keepalive",
        "after",
        "cat",
        "hang",
        "killed_end",
        "stream_error",
        "no_end_stream",
        "drop",
        "status",
        "body",
        "content_type",
    }
)


def command_answer(start: dict[str, Any], command: Command | None) -> CommandAnswer:
    """The answer to the StartRequest ``start``: the probe's, else ``command``'s (checked)."""
    process = _object(start.get("process"))
    args = process.get("args")
    script = args[2] if isinstance(args, list) and len(args) > 2 else ""
    if isinstance(script, str) and CHECK_MARKER in script:
        unlisted = _object(process.get("envs")).get("PISHIP_PROBE_UNLISTED") or "unset"
        return {"stdout": f"{CHECK_MARKER} {unlisted}\n"}
    answer = dict(command(start)) if command else {}
    unknown = set(answer) - _ANSWER_KEYS
    if unknown:
        raise ValueError(f"E2bServer: unknown command answer keys {sorted(unknown)}")
    return answer


def answer_frames(
    answer: CommandAnswer,
    *,
    wait: Callable[[Any], bool],
    hang: Callable[[], bool] | None,
    stdin: Callable[[], bytes | None] | None = None,
) -> Iterator[bytes]:
    """The Start stream's envelopes for ``answer``; :class:`DropConnection` to cut it.

    ``wait(event)`` holds the stream until ``event`` is set (False: the server
    closed); ``hang()``, given for a ``hang`` answer, waits for a SendSignal
    (False: the server closed); ``stdin()``, given for a ``cat`` answer, waits for
    CloseStdin and returns the input (``None``: the server closed).
    """
    keepalive = bool(answer.get("keepalive"))
    yield event_frame("start", StartEvent(PID))
    if keepalive:
        yield event_frame("keepalive", {})
    if stdin is not None and answer.get("cat"):
        received = stdin()
        if received is None:
            raise DropConnection
        answer = {**answer, "stdout": received}
    for stream, piece in answer_output(answer):
        data = base64.b64encode(piece).decode()
        event = DataEvent(stdout=data) if stream == "stdout" else DataEvent(stderr=data)
        yield event_frame("data", event)
        if keepalive:
            yield event_frame("keepalive", {})
    after = answer.get("after")
    if after is not None and not wait(after):
        raise DropConnection
    if answer.get("drop"):
        raise DropConnection
    if hang is not None:
        if not hang():
            raise DropConnection
        if answer.get("killed_end"):
            yield event_frame("end", KILLED_END)
        yield end_stream_frame()
        return
    if (error := answer.get("stream_error")) is not None:
        yield end_stream_frame(ConnectError("internal", str(error)))
        return
    yield event_frame("end", answer_end(answer))
    if not answer.get("no_end_stream"):
        yield end_stream_frame()


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _bytes(piece: str | bytes) -> bytes:
    return piece.encode() if isinstance(piece, str) else piece


def answer_output(answer: CommandAnswer) -> Iterator[tuple[str, bytes]]:
    if answer.get("stdout"):
        yield "stdout", _bytes(answer["stdout"])
    for piece in answer.get("chunks", ()):
        yield "stdout", _bytes(piece)
    if answer.get("stderr"):
        yield "stderr", _bytes(answer["stderr"])


def answer_end(answer: CommandAnswer) -> EndEvent | dict[str, Any]:
    """envd's end event; ``omit_zero_exit`` False sends the ``exitCode`` 0 protojson omits."""
    code = int(answer.get("exit_code", 0))
    end = EndEvent(exit_code=code, exited=True, status=f"exit status {code}")
    if code == 0 and not answer.get("omit_zero_exit", True):
        return {"exitCode": 0, **unstructure(end)}
    return end
