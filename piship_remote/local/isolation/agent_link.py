"""The service's end of a sandbox agent's control socket, and the start handshake on it.

An :class:`AgentLink` sends the agent its JSON packets (with file descriptors
alongside; see :mod:`piship_remote.local.isolation.agent` for the protocol). Starting a
command is a packet plus a status pipe: :func:`send_start` sends the one and
returns the read end of the other, :func:`started_pid` reads the agent's first
status line from it (the pid, or :class:`StartFailed` with envd's wording)::

    link = AgentLink(service_end)           # the socketpair end the agent did not get
    ident, status_read = send_start(link, spec, {}, [out_write, err_write], [], [out_read])
    pid = started_pid(status_read)          # then {"exit": n} or {"signal": n} follows
    link.send({"op": "kill", "id": ident, "signal": 9})
    upstream = dial(link, 8000)             # a socket connected to the sandbox's port 8000
    reply = send_files(link, "stat", {"path": "/home/user/a"}, uid=1000)
    entry = files_answer(reply)             # the value, or FilesFailed (what the agent refused)

:class:`~piship_remote.local.isolation.process.LocalProcess` is the command started this way.
"""

from __future__ import annotations

import errno
import itertools
import json
import os
import select
import socket
import threading
from collections.abc import Mapping, Sequence

from piship_remote.local.isolation.bubblewrap import options_fd

__all__ = [
    "START_TIMEOUT",
    "AgentGone",
    "AgentLink",
    "DialFailed",
    "FilesFailed",
    "StartFailed",
    "dial",
    "files_answer",
    "first_status",
    "parse_status",
    "received_fd",
    "send_files",
    "send_start",
    "started_pid",
]

START_TIMEOUT = 10.0
ANSWER_LIMIT = 64 * 1024 * 1024


class StartFailed(Exception):
    """The agent could not start the program (its message is envd's wording)."""


class AgentGone(ConnectionResetError):
    """The agent ended before it answered: a packet sent just before it died is dropped
    with the socket, and the status pipe inside it closes unwritten."""

    def __init__(self) -> None:
        super().__init__(errno.ECONNRESET, "the sandbox agent is gone")


class FilesFailed(Exception):
    """The agent's helper refused a files request: ``code`` is the errno's name (``ENOENT``,
    ``EACCES``, ``EROFS``, ``ENOSPC``, …) and ``details`` what else it said (sandbox paths)."""

    def __init__(self, details: Mapping[str, object]) -> None:
        self.code = str(details.get("errno", "EIO"))
        self.details = dict(details)
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        """The errno's text as Go prints it (``no such file or directory``)."""
        number = getattr(errno, self.code, None)
        message = self.details.get("message")
        if isinstance(message, str) and message:
            return message
        return os.strerror(number).lower() if isinstance(number, int) else self.code


class DialFailed(OSError):
    """Nothing in the sandbox listens on the port (the message says why)."""


class AgentLink:
    """The service's end of a sandbox agent's control socket; safe to share between threads."""

    def __init__(self, control: socket.socket) -> None:
        self._control = control
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    @property
    def socket(self) -> socket.socket:
        """The socket itself (for the agent's ready message)."""
        return self._control

    def next_id(self) -> int:
        """A fresh command id."""
        return next(self._ids)

    def send(self, message: Mapping[str, object], fds: Sequence[int] = ()) -> None:
        """One packet to the agent; ``OSError`` when the agent is gone."""
        data = json.dumps(message).encode()
        with self._lock:
            socket.send_fds(self._control, [data], list(fds))

    def close(self) -> None:
        """Close the socket: the agent exits, and the sandbox with it."""
        with self._lock:
            self._control.close()


def send_start(
    link: AgentLink,
    spec: Mapping[str, object],
    flags: Mapping[str, object],
    sent: list[int],
    trailing: list[int],
    kept: list[int],
) -> tuple[int, int]:
    """Send a start packet (``sent`` + status + spec + ``trailing`` fds, all closed here).

    Returns the command's id and the read end of its status pipe; on failure the
    ``kept`` descriptors are closed too.
    """
    status_read, status_write = os.pipe()
    spec_fd = options_fd([])
    ident = link.next_id()
    fds = [*sent, status_write, spec_fd, *trailing]
    try:
        os.write(spec_fd, json.dumps(dict(spec)).encode())
        os.lseek(spec_fd, 0, os.SEEK_SET)
        link.send({"op": "start", "id": ident, **flags}, fds)
    except BaseException:
        for fd in (*kept, status_read):
            os.close(fd)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return ident, status_read


def started_pid(status_read: int) -> int:
    """The pid the agent reports on the status pipe; :class:`StartFailed` when it did not start,
    :class:`AgentGone` when the agent ended first.

    The status pipe is closed on failure.
    """
    try:
        first = first_status(status_read)
    except BaseException:
        os.close(status_read)
        raise
    pid = first.get("pid")
    if not isinstance(pid, int):
        os.close(status_read)
        raise StartFailed(str(first.get("error", "the sandbox agent did not start it")))
    return pid


def dial(link: AgentLink, port: int) -> socket.socket:
    """A socket connected to ``port`` on the sandbox's loopback, made by its agent.

    :class:`DialFailed` when nothing listens there; ``OSError`` when the agent is gone.
    """
    receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with receiver:
        try:
            link.send({"op": "dial", "port": port}, [sender.fileno()])
        finally:
            sender.close()
        ready, _, _ = select.select([receiver], [], [], START_TIMEOUT)
        if not ready:
            raise OSError("the sandbox agent did not answer in time")
        message, fds, _, _ = socket.recv_fds(receiver, 256, 1)
    if not fds:
        reason = message.decode(errors="replace").removeprefix("error: ")
        raise DialFailed(reason or "the sandbox agent is gone")
    return socket.socket(fileno=fds[0])


def received_fd(receiver: socket.socket) -> int:
    """The one descriptor (a pty master) the agent sends over ``receiver``."""
    ready, _, _ = select.select([receiver], [], [], START_TIMEOUT)
    if not ready:
        raise OSError("the sandbox agent did not hand over the terminal")
    _, fds, _, _ = socket.recv_fds(receiver, 16, 1)
    if not fds:
        raise OSError("the sandbox agent did not hand over the terminal")
    return fds[0]


def parse_status(chunk: bytes) -> dict[str, object]:
    """The JSON objects among the status lines in ``chunk``, merged (other lines skipped)."""
    found: dict[str, object] = {}
    for line in chunk.splitlines():
        try:
            value = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(value, dict):
            found.update(value)
    return found


def first_status(fd: int) -> dict[str, object]:
    """The agent's first status line (the pid, or why the program did not start)."""
    ready, _, _ = select.select([fd], [], [], START_TIMEOUT)
    if not ready:
        raise OSError("the sandbox agent did not answer in time")
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)  # one line only: the exit report may follow at once
        if not chunk:
            break
        data += chunk
    if not data:
        raise AgentGone()
    return parse_status(data)


def send_files(
    link: AgentLink,
    call: str,
    args: Mapping[str, object],
    *,
    uid: int | None,
    data: int | None = None,
) -> int:
    """Ask the agent for one files request (``data``, a pipe end, is closed here).

    Returns the read end of its reply pipe, for :func:`files_answer`.
    """
    reply_read, reply_write = os.pipe()
    fds = [reply_write] if data is None else [reply_write, data]
    message: dict[str, object] = {"op": "files", "call": call, "args": dict(args)}
    if uid is not None:
        message["uid"] = uid
    try:
        link.send(message, fds)
    except BaseException:
        os.close(reply_read)
        raise
    finally:
        for fd in fds:
            os.close(fd)
    return reply_read


def files_answer(reply: int, *, close: bool = True) -> object:
    """The value of the helper's answer line on ``reply``; :class:`FilesFailed` for its
    refusal, :class:`AgentGone` when it ended without one. ``reply`` is closed (``close``)."""
    try:
        buffer = bytearray()
        while not buffer.endswith(b"\n"):
            chunk = os.read(reply, 65536 if close else 1)
            if not chunk:
                break
            buffer += chunk
            if len(buffer) > ANSWER_LIMIT:
                raise OSError("the sandbox agent's answer is too large")
    finally:
        if close:
            os.close(reply)
    line = bytes(buffer).partition(b"\n")[0]
    if not line:
        raise AgentGone()
    answer = json.loads(line)
    if not isinstance(answer, dict):
        raise AgentGone()
    if "error" in answer:
        details = answer["error"]
        raise FilesFailed(details if isinstance(details, dict) else {})
    return answer.get("ok")
