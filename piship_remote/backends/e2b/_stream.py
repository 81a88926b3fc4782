"""Decoding one envd Start stream: output frames, the end event's exit code, the terminator.

A Start response is a Connect server stream of JSON envelopes: data events
(``{"event":{"data":{"stdout":"<base64>"}}}``), keepalives, one end event
(``{"event":{"end":{"exitCode":3,"status":"exit status 3"}}}``) and the
end-of-stream frame, which carries an error when the stream failed::

    result = read_stream(response, on_stdout, on_stderr, errors)   # BackendResult

Plain data events skip the JSON parser (the base64 is sliced out and strictly
decoded); anything unusual goes through the parser, which accepts every form.
"""

from __future__ import annotations

import base64
import binascii
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any

from piship_remote.backends._common import SandboxErrors, exit_code_of
from piship_remote.backends.base import BackendResult, OutputCallback
from piship_remote.model.errors import CommandCancelled, PiShipError
from piship_remote.transport import HttpReply, TransportError
from piship_remote.wire.connect import END_STREAM, EnvelopeReader, Frame

_FAST_B64: Callable[..., bytes] | None
_FAST_B64_VERSION: Callable[[], str] | None
try:  # a core dependency; an install without it (--no-deps) decodes ~7x slower
    from pybase64 import b64decode as _FAST_B64
    from pybase64 import get_version as _FAST_B64_VERSION
except ImportError:
    _FAST_B64 = _FAST_B64_VERSION = None

__all__ = [
    "UNKNOWN_OUTCOME",
    "StreamDropped",
    "StreamOutcome",
    "base64_decoder",
    "end_exit_code",
    "read_stream",
]

# What every error after which a command may have run tells the user to do.
UNKNOWN_OUTCOME = "check its effects before running it again"

_SIGNALLED = re.compile(r"signal|killed", re.IGNORECASE)
# A data event as envd writes it (protojson may add spaces): the base64 lies between.
_DATA_HEAD = re.compile(rb'\{\s*"event"\s*:\s*\{\s*"data"\s*:\s*\{\s*"(stdout|stderr)"\s*:\s*"')
_DATA_TAIL = re.compile(rb"\s*\}\s*\}\s*\}\s*")
_TAIL_WINDOW = 32
# binascii's strict_mode (Python 3.11+); before it, a pattern check does the same job.
_STRICT_MODE = sys.version_info >= (3, 11)
_CANONICAL_B64 = re.compile(rb"[A-Za-z0-9+/]*={0,2}")
_EXIT_STATUS = re.compile(r"\s*exit status (-?[0-9]{1,10})\s*\Z")
_STREAMS = ("stdout", "stderr")  # the order of _data_output's index
# envd's start and keepalive events, and its end event, exactly as protojson writes them.
_NO_OP_EVENT = re.compile(rb'\{"event":\{(?:"start":\{"pid":([0-9]{1,10})\}|"keepalive":\{\})\}\}')
_END_EVENT = re.compile(
    rb'\{"event":\{"end":\{(?:"exitCode":(-?(?:0|[1-9][0-9]{0,9})),)?'
    rb'"exited":(true|false),"status":"([\x20\x21\x23-\x5b\x5d-\x7e]*)"\}\}\}'
)


class StreamDropped(Exception):
    """The stream broke before its end-of-stream frame (a reset, an idle cut, a body that
    just ended): the command may still run. ``error`` is what the caller raises when it
    cannot follow the command again."""

    def __init__(self, error: PiShipError) -> None:
        super().__init__(str(error))
        self.error = error


class StreamOutcome:
    """What the frames of one Start stream said so far."""

    def __init__(
        self,
        on_stdout: OutputCallback | None,
        on_stderr: OutputCallback | None,
        errors: SandboxErrors,
        on_pid: Callable[[int], None] | None = None,
    ) -> None:
        self.result: BackendResult | None = None
        # A terminal's output (``pty``) is the command's stdout.
        self._outputs = {"stdout": on_stdout, "stderr": on_stderr, "pty": on_stdout}
        self._errors = errors
        self._on_pid = on_pid

    def handle_payload(self, flags: int, payload: bytes | memoryview) -> bool:
        """Act on one envelope; a plain data event skips the JSON parser (``True``: complete).

        envd's data events are ``{"event":{"data":{"stdout":"<base64>"}}}``: the
        base64 is sliced out and strictly decoded. Anything unusual (escapes,
        other fields, lenient base64) goes through :meth:`handle` instead.
        """
        if not flags:
            output = _data_output(payload)
            if output is not None:
                index, chunk = output
                self._emit(_STREAMS[index], chunk)
                return False
        complete = self._fixed_event(flags, payload)
        if complete is not None:
            return complete
        try:
            frame = Frame.parse(flags, payload)
        except ValueError as e:
            raise self._errors(str(e)) from None
        return self.handle(frame)

    def _fixed_event(self, flags: int, payload: bytes | memoryview) -> bool | None:
        """Act on a start, keepalive, end or end-of-stream frame in envd's exact compact
        form, as :meth:`handle` would (``None``: not one of those, parse it)."""
        if flags == END_STREAM:
            if payload != b"{}":
                return None
            self._finish({})
            return True
        if flags:
            return None
        no_op = _NO_OP_EVENT.fullmatch(payload)
        if no_op is not None:
            pid = no_op.group(1)
            if pid is not None and self._on_pid is not None:
                self._on_pid(int(pid))
            return False  # start and keepalive events carry nothing a result needs
        end = _END_EVENT.fullmatch(payload)
        if end is None:
            return None
        code, exited, status = end.groups()
        event: dict[str, Any] = {"exited": exited == b"true", "status": status.decode("ascii")}
        if code is not None:
            event = {"exitCode": int(code), **event}
        self.result = BackendResult(exit_code=self._exit_code(event))
        return False

    def handle(self, frame: Frame) -> bool:
        """Act on one frame; ``True`` once the stream is complete."""
        if frame.end_stream:
            self._finish(frame.message)
            return True
        event = _object(frame.message.get("event"))
        pid = _object(event.get("start")).get("pid")
        if type(pid) is int and self._on_pid is not None:
            self._on_pid(pid)
        data = _object(event.get("data"))
        for stream in self._outputs:
            value = data.get(stream)
            if isinstance(value, str):
                self._emit(stream, self._decode(value))
        if "end" in event:
            self.result = BackendResult(exit_code=self._exit_code(event["end"]))
        return False

    def cut_off(self) -> PiShipError:
        """The error for a body that ended before its end-of-stream frame."""
        if self.result is None:
            return self._errors("the command stream ended without an exit status")
        return self._errors(
            "the command stream ended without its end-of-stream frame, so the outcome "
            "the sandbox reported cannot be trusted"
        )

    def _emit(self, stream: str, chunk: bytes) -> None:
        callback = self._outputs[stream]
        if callback is not None and chunk:
            callback(chunk)

    def _finish(self, message: Mapping[str, Any]) -> None:
        error = _object(message.get("error"))
        if error:
            code = error.get("code")
            text = error.get("message")
            code_text = "unknown" if code is None else _one_line(str(code))
            detail = "" if text is None else _one_line(str(text))
            raise self._errors(
                f"the command stream failed: {code_text or 'unknown'} {detail}".strip()
            )
        if self.result is None:
            raise self._errors("the command stream ended without an exit status")

    def _exit_code(self, end: object) -> int | None:
        if not isinstance(end, dict):
            raise self._errors(
                "the command stream failed: the sandbox sent an end event that is not an object"
            )
        try:
            return end_exit_code(end)
        except ValueError as e:
            raise self._errors(f"the command stream failed: {e}") from None

    def _decode(self, value: str) -> bytes:
        try:
            return _lenient_b64(value)
        except (binascii.Error, ValueError):
            raise self._errors(
                "the command stream failed: the sandbox sent output that is not base64"
            ) from None


def read_stream(
    response: HttpReply,
    on_stdout: OutputCallback | None,
    on_stderr: OutputCallback | None,
    errors: SandboxErrors,
    on_pid: Callable[[int], None] | None = None,
    *,
    reattachable: bool = False,
) -> BackendResult:
    """Decode frames as they arrive, until the end-of-stream frame; ``on_pid`` hears the
    start event's pid. ``reattachable``: a stream that broke raises :class:`StreamDropped`
    (the caller may follow the command again) rather than its error.

    A failure is raised from this frame alone, without the frames below it or a
    chained context: those hold the body's bytes, into which a hostile server can
    echo a credential, and a traceback printed with its locals would show them.
    """
    failure: BaseException
    try:
        outcome = StreamOutcome(on_stdout, on_stderr, errors, on_pid)
        return _decode_frames(response, outcome, errors)
    except StreamDropped as dropped:
        failure = dropped if reattachable else dropped.error
    except (PiShipError, CommandCancelled) as error:
        failure = error
    failure.__context__ = None
    raise failure.with_traceback(None)


def _decode_frames(
    response: HttpReply, outcome: StreamOutcome, errors: SandboxErrors
) -> BackendResult:
    reader = EnvelopeReader()
    try:
        for chunk in response.iter_raw():
            try:
                payloads = reader.payloads(chunk)
            except ValueError as e:
                raise errors(str(e)) from None
            for flags, payload in payloads:
                if outcome.handle_payload(flags, payload):
                    assert outcome.result is not None
                    response.finish()  # the terminator: the connection can be reused
                    return outcome.result
    except TransportError as e:
        raise StreamDropped(
            errors(
                f"the command stream was interrupted: {e}; the command's outcome is unknown, "
                f"so {UNKNOWN_OUTCOME}"
            )
        ) from None
    raise StreamDropped(outcome.cut_off())


def end_exit_code(end: Mapping[str, Any]) -> int | None:
    """envd's end event → the exit code; ``None`` for a signal exit.

    ``exitCode`` (or ``exit_code``) is used when it is an int (a bool is not): -1,
    envd's answer for a signalled process, is ``None``. protojson omits a zero
    code, so without one the code comes from ``status`` (``"exit status N"`` → N,
    ``"signal: killed"`` → ``None``), and is 0 only when nothing in the event
    says the command failed. Raises ``ValueError`` when the event reports a
    failure (an ``error``, an unreadable code or status, ``exited: false``)
    without a usable exit code: failing open to 0 would report a failure as success.

    >>> end_exit_code({"exited": True, "status": "exit status 0"})
    0
    >>> end_exit_code({"exitCode": 3, "exited": True, "status": "exit status 3"})
    3
    >>> end_exit_code({"exitCode": -1, "exited": False, "status": "signal: killed"}) is None
    True
    """
    raw = end.get("exitCode", end.get("exit_code"))
    code = exit_code_of(raw)
    if code is not None:
        return code if code >= 0 else None
    status = end.get("status")
    if isinstance(status, str):
        if match := _EXIT_STATUS.match(status):
            number = int(match.group(1))
            return number if number >= 0 else None
        if _SIGNALLED.search(status):
            return None
    failure = _failure_sign(raw, status, end)
    if failure is not None:
        raise ValueError(f"the sandbox reported {failure} without a usable exit code")
    return 0


def _failure_sign(code: object, status: object, end: Mapping[str, Any]) -> str | None:
    """What in an end event without a usable exit code says the command did not succeed."""
    if code is not None:
        return "an exit code that is not an integer"
    if status is not None and status != "":
        return "an unrecognised status"
    error = end.get("error")
    if error is not None and error != "":
        return "an error"
    if end.get("exited") is False:
        return "a process that did not exit"
    return None


def _data_output(payload: bytes | memoryview) -> tuple[int, bytes] | None:
    """``(0 for stdout / 1 for stderr, bytes)`` of a plain data event, else ``None``.

    ``None`` also for anything the strict decoder refuses; the caller then parses
    the JSON, which handles every form (whitespace, escapes, lenient base64).
    """
    head = _DATA_HEAD.match(payload)
    if head is None:
        return None
    tail = bytes(payload[-_TAIL_WINDOW:])
    quote = tail.rfind(b'"')
    if quote < 0 or not _DATA_TAIL.fullmatch(tail, quote + 1):
        return None
    end = len(payload) - len(tail) + quote
    if end < head.end():
        return None
    try:
        data = _strict_b64(payload[head.end() : end])
    except (binascii.Error, ValueError):
        return None
    return (0 if head.group(1) == b"stdout" else 1), data


def _one_line(text: str) -> str:
    """Server-sent text with every run of whitespace (newlines included) as one space."""
    return " ".join(text.split())


def _object(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _lenient_b64(value: str) -> bytes:
    """Standard or URL-safe base64, padding optional (as envd and Node accept)."""
    text = value.strip().replace("-", "+").replace("_", "/").rstrip("=")
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)


def base64_decoder() -> str:
    """What decodes command output: ``pybase64 <version and build>``, or the standard
    library's ``binascii`` when pybase64 is not installed."""
    if _FAST_B64 is not None and _FAST_B64_VERSION is not None:
        return f"pybase64 {_FAST_B64_VERSION()}"
    return "binascii (standard library)"


def _strict_b64(data: bytes | memoryview) -> bytes:
    """Canonical base64 (padded, standard alphabet, nothing else); ``binascii.Error`` if not.

    Uses ``pybase64`` (SIMD, ~30x faster on large output) unless it is missing.
    """
    return _FAST_B64(data, validate=True) if _FAST_B64 is not None else _stdlib_strict_b64(data)


def _stdlib_strict_b64(data: bytes | memoryview) -> bytes:
    if _STRICT_MODE:
        return binascii.a2b_base64(data, strict_mode=True)  # type: ignore[call-arg,unused-ignore]
    if _CANONICAL_B64.fullmatch(data) is None:  # Python 3.10: no strict_mode
        raise binascii.Error("not canonical base64")
    return binascii.a2b_base64(data)
