"""envd's ``process.Process`` service for the local sandboxes.

``Start`` runs a command (stdin a pipe unless ``stdin`` is false, or a pty with
``pty``) and streams its events; ``Connect`` follows a running command from
that moment, a start event first; ``SendInput``/``StreamInput`` write to its
stdin or terminal, ``CloseStdin`` closes its stdin, ``Update`` resizes its
terminal, ``SendSignal`` signals its whole process tree, ``List`` shows the
running commands. A command is chosen by ``pid`` or ``tag``; an unknown one is
``not_found``, as a unary 404 or, for ``Connect``, an end-of-stream error.

``Connect`` also takes the ``Piship-Output-Offset`` extension header (what the
client already has of each stream): the stream then replays what each stream's
ring (``output_ring.RING_BYTES``) still holds from there, and the answer's header
says where each replay begins. A command that ended stays reachable by ``Connect``
(its end and ring) for :data:`ENDED_GRACE` seconds, the last :data:`ENDED_KEPT` of
them, so a client whose stream dropped just before the end still learns it::

    rpc = ProcessRpc()
    reply = rpc.handle(sandbox, "Start", request)
"""

from __future__ import annotations

import base64
import collections
import functools
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from piship_remote._http_server.messages import Reply, Request, ResetConnection
from piship_remote.local.envd.process_feed import Follower, ProcessFeed
from piship_remote.local.isolation.process import (
    Exited,
    InputFailed,
    LocalProcess,
    Output,
    WindowSize,
)
from piship_remote.local.isolation.user_map import Identity
from piship_remote.local.sandbox.registry import Sandbox, SandboxGone, StartRefused
from piship_remote.wire.connect import EnvelopeReader, connect_envelope
from piship_remote.wire.e2b_json import (
    WireError,
    end_stream_frame,
    event_frame,
    parse,
    start_message,
    structure,
    to_json,
)
from piship_remote.wire.envd import (
    ConnectError,
    DataEvent,
    EndEvent,
    ProcessInfo,
    ProcessList,
    ProcessSelector,
    SignalRequest,
    StartEvent,
    StartRequest,
)
from piship_remote.wire.envd_process import (
    CloseStdinRequest,
    ConnectProcessRequest,
    ProcessInput,
    SendInputRequest,
    StreamInputMessage,
    UpdateRequest,
    decoded,
)
from piship_remote.wire.output_offsets import OFFSET_HEADER, format_offsets, parse_offsets

__all__ = ["CONNECT_JSON", "DEFAULT_KEEPALIVE", "STREAMING", "ProcessRpc", "stream_error"]

CONNECT_JSON = "application/connect+json"
DEFAULT_KEEPALIVE = 90.0
MAX_TIMEOUT_DIGITS = 10
KILL_SETTLE = 5.0  # seconds a SIGKILL waits for the command to be reaped
STREAMING = frozenset({"Start", "Connect", "StreamInput"})
STREAM_SEND_BUFFER = 1024 * 1024
"""A command stream's socket send buffer: what a cut loses in this host's kernel stays
well within the sent bytes each output ring keeps."""
ENDED_GRACE = 60.0
"""Seconds an ended command stays reachable by ``Connect`` (its end and output ring)."""
ENDED_KEPT = 8
"""Ended commands kept for ``Connect`` at most (each holds up to two rings)."""
_SIGNALS: dict[object, int] = {
    "SIGNAL_SIGKILL": signal.SIGKILL,
    "SIGNAL_SIGTERM": signal.SIGTERM,
    9: signal.SIGKILL,
    15: signal.SIGTERM,
}
_SIGNAL_STATUS: dict[int, str] = {
    signal.SIGKILL: "signal: killed",
    signal.SIGTERM: "signal: terminated",
}
_GONE = {
    "stopped": "the local sandbox service stopped",
    "lost": "the sandbox failed: its environment ended (the local service is still running)",
}
_KILLED_WITH_SANDBOX = ("deleted", "expired")
_STREAM_HEADERS = (("Connect-Content-Encoding", "identity"),)
_DEADLINE_FRAME = end_stream_frame(ConnectError("deadline_exceeded", "context deadline exceeded"))


class NotFound(Exception):
    """No running command matches the selector (the message is envd's)."""


class ProcessRpc:
    """The Process RPCs; keeps one :class:`ProcessFeed` per command started through it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._feeds: dict[tuple[str, int], ProcessFeed] = {}
        # (sandbox id, the ended command's feed, when it ended), oldest first
        self._ended_feeds: collections.deque[tuple[str, ProcessFeed, float]] = (
            collections.deque(maxlen=ENDED_KEPT)
        )

    def handle(
        self, sandbox: Sandbox, method: str, request: Request, user: Identity | None = None
    ) -> Reply:
        """Answer ``/process.Process/<method>`` (the caller checked token and ``user``, whom
        ``Start`` runs its command as; default: the sandbox's user)."""
        if method in STREAMING:
            refusal = _stream_refusal(request)
            if refusal is not None:
                return refusal
            if method == "Start":
                return self._start(sandbox, request, user)
            if method == "Connect":
                return self._connect(sandbox, request)
            return self._stream_input(sandbox, request)
        unary: dict[str, Callable[[bytes], Reply]] = {
            "SendSignal": lambda body: self._signal(sandbox, body),
            "List": lambda _: self._list(sandbox),
            "SendInput": lambda body: self._send_input(sandbox, body),
            "CloseStdin": lambda body: self._close_stdin(sandbox, body),
            "Update": lambda body: self._update(sandbox, body),
        }
        answer = unary.get(method)
        if answer is None:
            return connect_error(
                501, "unimplemented", f"process.Process/{method[:60]} is not supported"
            )
        return _unary(request, answer)

    # -- streams ---------------------------------------------------------------------

    def _start(self, sandbox: Sandbox, request: Request, user: Identity | None) -> Reply:
        try:
            start = structure(start_message(request.body), StartRequest)
        except WireError as e:
            return stream_error("invalid_argument", str(e))
        size = None
        if start.pty is not None:
            size = WindowSize(start.pty.size.cols, start.pty.size.rows)
        try:
            stdin = start.stdin is not False
            process = sandbox.start(start.process, tag=start.tag, stdin=stdin, size=size, user=user)
        except StartRefused as e:
            return stream_error("invalid_argument", str(e))
        except SandboxGone:
            return stream_error("unavailable", "the sandbox was deleted")
        except (BrokenPipeError, ConnectionResetError):  # its agent is gone
            return stream_error("unavailable", _GONE["lost"])
        except OSError as e:
            return stream_error("internal", f"starting the process failed: {e.strerror or e}")
        key = (sandbox.id, process.pid)
        on_end = functools.partial(self._ended, sandbox, process, key)
        feed = ProcessFeed(process, on_end=on_end, deadline=_deadline(request.headers))
        with self._lock:
            self._feeds[key] = feed
        follower = feed.subscribe()
        feed.start()
        frames = _frames(follower, None, _keepalive(request.headers), own_deadline=True)
        return _stream(_Followed(frames, follower))

    def _connect(self, sandbox: Sandbox, request: Request) -> Reply:
        try:
            selector = structure(start_message(request.body), ConnectProcessRequest).process
            feed = self._feed(sandbox, selector)
        except WireError as e:
            return stream_error("invalid_argument", str(e))
        except NotFound as e:
            return stream_error("not_found", str(e))
        headers = request.headers
        offsets = parse_offsets(headers.get(OFFSET_HEADER.lower()))
        answer: tuple[tuple[str, str], ...] = ()
        if offsets is None:
            follower, replay = feed.subscribe(), []
        else:
            resumed = feed.resume(offsets)
            follower, replay = resumed.follower, resumed.replay
            answer = ((OFFSET_HEADER, format_offsets(resumed.starts)),)
        frames = _frames(follower, _deadline(headers), _keepalive(headers), replay)
        return _stream(_Followed(frames, follower), answer)

    def _stream_input(self, sandbox: Sandbox, request: Request) -> Reply:
        """The client stream, read whole: its start names the command, then input in order."""
        try:
            frames = EnvelopeReader().push(request.body)
            messages = [
                structure(f.message, StreamInputMessage) for f in frames if not f.end_stream
            ]
            if not messages or messages[0].start is None:
                raise WireError("the stream does not begin with a start message")
            process = _select(sandbox, messages[0].start.process)
            for message in messages[1:]:
                if message.data is not None:
                    _write_input(process, message.data.input)
        except (WireError, ValueError) as e:
            return stream_error("invalid_argument", str(e))
        except NotFound as e:
            return stream_error("not_found", str(e))
        except InputFailed as e:
            return stream_error("internal", str(e))
        body = connect_envelope({}) + end_stream_frame()
        return Reply(200, body, CONNECT_JSON, _STREAM_HEADERS)

    def _feed(self, sandbox: Sandbox, selector: ProcessSelector) -> ProcessFeed:
        try:
            process = _select(sandbox, selector)
        except NotFound:
            feed = self._ended_feed(sandbox, selector)
            if feed is None:
                raise
            return feed
        with self._lock:
            feed = self._feeds.get((sandbox.id, process.pid))
        if feed is None:
            raise NotFound(_not_found(selector))
        return feed

    def _ended_feed(self, sandbox: Sandbox, selector: ProcessSelector) -> ProcessFeed | None:
        """The feed of a command of ``sandbox`` that ended within the grace, if any."""
        now = time.monotonic()
        with self._lock:
            while self._ended_feeds and now - self._ended_feeds[0][2] > ENDED_GRACE:
                self._ended_feeds.popleft()
            for owner, feed, _ in self._ended_feeds:
                process = feed.process
                chosen = (selector.tag and process.tag == selector.tag) or (
                    not selector.tag and process.pid == selector.pid
                )
                if owner == sandbox.id and chosen:
                    return feed
        return None

    def _ended(self, sandbox: Sandbox, process: LocalProcess, key: tuple[str, int]) -> None:
        sandbox.forget(process)
        with self._lock:
            feed = self._feeds.pop(key, None)
            if feed is not None:
                self._ended_feeds.append((sandbox.id, feed, time.monotonic()))

    # -- unary -----------------------------------------------------------------------

    def _signal(self, sandbox: Sandbox, body: bytes) -> Reply:
        request = parse(body, SignalRequest)
        sig = _SIGNALS.get(request.signal) if isinstance(request.signal, (str, int)) else None
        if sig is None:
            return connect_error(400, "invalid_argument", f"unsupported signal {request.signal!r}")
        return _on_process(sandbox, request.process, lambda p: _send_signal(p, sig))

    def _list(self, sandbox: Sandbox) -> Reply:
        infos = [
            ProcessInfo(config, process.pid, process.tag)
            for process, config in sandbox.listing()
        ]
        return Reply(200, to_json(ProcessList(infos)), "application/json")

    def _send_input(self, sandbox: Sandbox, body: bytes) -> Reply:
        request = parse(body, SendInputRequest)
        return _on_process(sandbox, request.process, lambda p: _write_input(p, request.input))

    def _close_stdin(self, sandbox: Sandbox, body: bytes) -> Reply:
        request = parse(body, CloseStdinRequest)
        return _on_process(sandbox, request.process, lambda p: p.close_stdin())

    def _update(self, sandbox: Sandbox, body: bytes) -> Reply:
        request = parse(body, UpdateRequest)
        if request.pty is None:
            return Reply(200, b"{}", "application/json")
        size = WindowSize(request.pty.size.cols, request.pty.size.rows)
        return _on_process(sandbox, request.process, lambda p: p.resize(size))


def _select(sandbox: Sandbox, selector: ProcessSelector) -> LocalProcess:
    if selector.pid is None and not selector.tag:
        raise WireError("a process pid or tag is required")
    process = sandbox.find(pid=selector.pid, tag=selector.tag)
    if process is None:
        raise NotFound(_not_found(selector))
    return process


def _not_found(selector: ProcessSelector) -> str:
    which = f"tag '{selector.tag}'" if selector.tag else f"pid {selector.pid}"
    return f"process with {which} not found"


def _send_signal(process: LocalProcess, sig: int) -> None:
    """Signal the command; a SIGKILL is answered once it has ended (bounded), so that the
    next command sees it gone, as on envd, whose kill is reaped at once."""
    process.kill("signal", sig)
    if sig == signal.SIGKILL:
        process.wait(KILL_SETTLE)


def _on_process(
    sandbox: Sandbox, selector: ProcessSelector, action: Callable[[LocalProcess], None]
) -> Reply:
    """Do ``action`` to the selected command; ``{}``, or envd's error."""
    try:
        action(_select(sandbox, selector))
    except NotFound as e:
        return connect_error(404, "not_found", str(e))
    except InputFailed as e:
        return connect_error(500, "internal", str(e))
    return Reply(200, b"{}", "application/json")


def _write_input(process: LocalProcess, given: ProcessInput) -> None:
    if given.pty is not None:
        if not process.terminal:
            raise InputFailed("error writing to tty: tty not assigned to process")
        data = decoded(given.pty)
    elif given.stdin is not None:
        if process.terminal:
            raise InputFailed("error writing to stdin: stdin not enabled or closed")
        data = decoded(given.stdin)
    else:
        return
    which = "tty" if process.terminal else "stdin"
    try:
        process.send_input(data)
    except InputFailed as e:
        raise InputFailed(f"error writing to {which}: {e}") from None


class _Followed:
    """A stream's frames; closing it (the server does once the client is gone, perhaps
    before the first frame) stops following."""

    def __init__(self, frames: Iterator[bytes], follower: Follower) -> None:
        self._frames = frames
        self._follower = follower

    def __iter__(self) -> _Followed:
        return self

    def __next__(self) -> bytes:
        return next(self._frames)

    def close(self) -> None:
        close = getattr(self._frames, "close", None)
        if close is not None:
            close()
        self._follower.close()


def _frames(
    follower: Follower,
    deadline: float | None,
    keepalive: float,
    replay: Sequence[Output] = (),
    *,
    own_deadline: bool = False,
) -> Iterator[bytes]:
    """A Start or Connect stream: start, the ``replay`` (a resumed Connect's), events,
    end, end-of-stream. Each data event counts as taken once the server asks for the
    next frame (it has written that one).

    At ``deadline`` a Connect stream ends (a Start's command is killed by its feed:
    ``own_deadline`` tells its end as the deadline's).
    """
    try:
        yield event_frame("start", StartEvent(follower.pid))
        for output in replay:
            yield _data_frame(output)
            follower.delivered(output)
        quiet_since = time.monotonic()
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                yield _DEADLINE_FRAME
                return
            wait = quiet_since + keepalive - now
            if deadline is not None:
                wait = min(wait, deadline - now)
            event = follower.next(wait)
            if event is None:
                if time.monotonic() - quiet_since >= keepalive:
                    quiet_since = time.monotonic()
                    yield event_frame("keepalive", {})
                continue
            if isinstance(event, Exited):
                yield from _ending(event, own_deadline=own_deadline)
                return
            quiet_since = time.monotonic()
            yield _data_frame(event)
            follower.delivered(event)
    finally:
        follower.close()


def _data_frame(output: Output) -> bytes:
    data = base64.b64encode(output.data).decode()
    return event_frame("data", DataEvent(**{output.stream: data}))


def _ending(exited: Exited, *, own_deadline: bool) -> Iterator[bytes]:
    if exited.killed == "deadline" and own_deadline:
        yield _DEADLINE_FRAME
        return
    if exited.killed in _KILLED_WITH_SANDBOX:
        # E2B's sandbox vanishes with its VM and its edge resets the stream; the SDKs tell a
        # killed sandbox from any other failure by that reset (and a health probe): an
        # orderly close without the last chunk reads as a protocol error instead.
        raise ResetConnection
    if exited.killed in _GONE:
        yield end_stream_frame(ConnectError("unavailable", _GONE[exited.killed]))
        return
    if exited.killed is not None:
        status = _SIGNAL_STATUS.get(exited.signal or signal.SIGKILL, "signal: killed")
        yield event_frame("end", EndEvent(exit_code=-1, exited=False, status=status, error=status))
    else:
        code = exited.exit_code
        status = f"exit status {code}"
        yield event_frame("end", EndEvent(code, True, status, status if code else ""))
    yield end_stream_frame()


def _stream(frames: _Followed, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(
        200,
        content_type=CONNECT_JSON,
        headers=_STREAM_HEADERS + headers,
        stream=frames,
        send_buffer=STREAM_SEND_BUFFER,
    )


def _stream_refusal(request: Request) -> Reply | None:
    if _media_type(request) != CONNECT_JSON:
        return Reply(415, headers=(("Accept-Post", CONNECT_JSON),))
    encoding = request.headers.get("connect-content-encoding", "identity")
    if encoding.lower() != "identity":
        return stream_error("unimplemented", f"unsupported compression {encoding[:40]!r}")
    return None


def stream_error(code: str, message: str) -> Reply:
    """A Connect stream that fails before it starts: HTTP 200 and one error frame."""
    body = end_stream_frame(ConnectError(code, message))
    return Reply(200, body, CONNECT_JSON, _STREAM_HEADERS)


def connect_error(status: int, code: str, message: str) -> Reply:
    """A unary Connect error: ``status`` and ``{"code", "message"}``."""
    return Reply(status, to_json(ConnectError(code, message)), "application/json")


def _deadline(headers: Mapping[str, str]) -> float | None:
    value = headers.get("connect-timeout-ms", "").strip()
    if not value.isdigit() or len(value) > MAX_TIMEOUT_DIGITS or int(value) <= 0:
        return None
    return time.monotonic() + int(value) / 1000


def _keepalive(headers: Mapping[str, str]) -> float:
    for name in ("keepalive-ping-interval", "x-keepalive-interval"):
        value = headers.get(name, "").strip()
        if value.isdigit() and 0 < int(value) <= 3600:
            return float(value)
    return DEFAULT_KEEPALIVE


def _unary(request: Request, answer: Callable[[bytes], Reply]) -> Reply:
    if _media_type(request) != "application/json":
        return Reply(415, headers=(("Accept-Post", "application/json"),))
    try:
        return answer(request.body)
    except WireError as e:
        return connect_error(400, "invalid_argument", str(e))


def _media_type(request: Request) -> str:
    return request.headers.get("content-type", "").partition(";")[0].strip().lower()
