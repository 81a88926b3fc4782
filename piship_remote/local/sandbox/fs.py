"""File operations run inside a sandbox, as the requesting user (default: the sandbox's), through
the same entry point as commands.

A hostile sandbox can plant symlinks to host files, so no sandbox path is ever
resolved on the host: each operation is a small ``/bin/sh`` script (``cat``,
``find -printf``, ``mkdir``, ``mv``, ``rm``) started with :meth:`Sandbox.start`, so it
sees exactly the sandbox's own view. Output and input are streamed through pipes;
nothing holds a whole file::

    ran = run(sandbox, 'rm -rf -- "$1"', "/home/user/x")      # Ran(exit_code, stdout, stderr)
    ran = run(sandbox, 'cat -- "$1"', "/root/x", user=root)   # as root (an Identity)
    opened = open_stream(sandbox, CAT_SCRIPT, "/home/user/big.bin")
    entries = parse_entries(ran.stdout)                        # from find -printf ENTRY_FORMAT

Paths come from :func:`resolve`: relative to the home, ``~`` expanded, cleaned.
"""

from __future__ import annotations

import contextlib
import posixpath
import stat
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import IO

import attrs

from piship_remote.local.isolation.process import Exited, LocalProcess, Output
from piship_remote.local.isolation.user_map import Identity
from piship_remote.local.sandbox.metadata import parse_found
from piship_remote.local.sandbox.registry import Sandbox
from piship_remote.wire.envd import EntryInfo, ProcessConfig
from piship_remote.wire.envd_paths import resolve

__all__ = [
    "ENTRY_FORMAT",
    "TAG_PREFIX",
    "Ran",
    "Streamed",
    "entry_from_fields",
    "open_stream",
    "parse_entries",
    "resolve",
    "run",
]

TAG_PREFIX = "piship-files-"
"""The tag of every helper process (left out of the Process ``List``)."""
ENTRY_FORMAT = r"%y\0%Y\0%s\0%m\0%u\0%g\0%T@\0%l\0%p\0"
FIELDS = 9
CAPTURE_LIMIT = 64 * 1024 * 1024
STDERR_LIMIT = 64 * 1024
FEED_PIECE = 256 * 1024
_QUIET = 3600.0
_GO_TYPE = {"d": "d", "l": "L", "p": "p", "s": "S", "b": "D", "c": "Dc", "f": ""}
_TYPES = {"f": "FILE_TYPE_FILE", "d": "FILE_TYPE_DIRECTORY"}

Feed = Callable[[IO[bytes]], None]


@attrs.frozen
class Ran:
    """How a helper script ended: its exit code and what it wrote (bounded)."""

    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def error_text(self) -> str:
        return self.stderr.decode(errors="replace").strip()


@attrs.frozen
class Streamed:
    """A started streaming script: its output ``chunks``, or how it ended before any."""

    chunks: Iterator[bytes] | None
    ended: Ran | None


def _config(script: str, args: tuple[str, ...]) -> ProcessConfig:
    return ProcessConfig(cmd="/bin/sh", args=["-c", script, "sh", *args])


def _start(
    sandbox: Sandbox, script: str, args: tuple[str, ...], stdin: bool, user: Identity | None
) -> LocalProcess:
    config = _config(script, args)
    # Outside the memory limit: files filling the sandbox's memory can still be removed.
    tag = TAG_PREFIX + script[:24]
    return sandbox.start(config, tag=tag, stdin=stdin, user=user, limited=False)


def run(
    sandbox: Sandbox,
    script: str,
    *args: str,
    feed: Feed | None = None,
    user: Identity | None = None,
) -> Ran:
    """Run ``script`` with ``args`` in the sandbox as ``user``; ``feed`` writes its stdin
    (then closed)."""
    process = _start(sandbox, script, args, feed is not None, user)
    try:
        if feed is not None:
            _feed(process, feed)
        out, err = bytearray(), bytearray()
        code = -1
        for event in process.events(deadline=None, keepalive=_QUIET):
            if isinstance(event, Output):
                stdout = event.stream == "stdout"
                target, limit = (out, CAPTURE_LIMIT) if stdout else (err, STDERR_LIMIT)
                if len(target) < limit:
                    target += event.data
            elif isinstance(event, Exited):
                code = event.exit_code if event.killed is None else -1
        return Ran(code, bytes(out), bytes(err))
    finally:
        sandbox.forget(process)


def _feed(process: LocalProcess, feed: Feed) -> None:
    pipe = process.stdin
    assert pipe is not None
    try:
        feed(pipe)
    except BrokenPipeError:
        pass  # the script ended early; its exit code says why
    finally:
        with contextlib.suppress(OSError):
            pipe.close()


def open_stream(
    sandbox: Sandbox, script: str, *args: str, user: Identity | None = None
) -> Streamed:
    """Start ``script`` as ``user``; wait for its first stdout bytes (streamed on) or its end."""
    process = _start(sandbox, script, args, False, user)
    events = process.events(deadline=None, keepalive=_QUIET)
    err = bytearray()
    try:
        for event in events:
            if isinstance(event, Output) and event.stream == "stdout":
                return Streamed(_rest(sandbox, process, events, event.data), None)
            if isinstance(event, Output):
                err += event.data[:STDERR_LIMIT]
            elif isinstance(event, Exited):
                code = event.exit_code if event.killed is None else -1
                sandbox.forget(process)
                return Streamed(None, Ran(code, b"", bytes(err)))
    except BaseException:
        _close(events)
        sandbox.forget(process)
        raise
    sandbox.forget(process)
    return Streamed(None, Ran(-1, b"", bytes(err)))


class StreamBroken(Exception):
    """The script failed after its output had started (the answer is already on its way)."""


def _rest(
    sandbox: Sandbox, process: LocalProcess, events: Iterator[object], first: bytes
) -> Iterator[bytes]:
    try:
        yield first
        for event in events:
            if isinstance(event, Output) and event.stream == "stdout":
                yield event.data
            elif isinstance(event, Exited) and (event.exit_code != 0 or event.killed):
                raise StreamBroken(f"the read ended with exit status {event.exit_code}")
    finally:
        _close(events)
        sandbox.forget(process)


def _close(events: Iterator[object]) -> None:
    """End the process's event generator (which kills the process if it still runs)."""
    close = getattr(events, "close", None)
    if close is not None:
        close()


def parse_entries(output: bytes) -> list[EntryInfo]:
    """The entries ``find -printf ENTRY_FORMAT`` printed (NUL-separated fields), each with
    its metadata where :func:`~piship_remote.local.sandbox.metadata.reader` printed it after."""
    fields = output.split(b"\0")
    count = (len(fields) - 1) // FIELDS
    found = parse_found(b"\0".join(fields[count * FIELDS :]))
    entries = []
    for start in range(0, count * FIELDS, FIELDS):
        record = [f.decode(errors="surrogateescape") for f in fields[start : start + FIELDS]]
        entry = entry_from_fields(record)
        metadata = found.get(entry.path)
        entries.append(entry if metadata is None else attrs.evolve(entry, metadata=metadata))
    return entries


def entry_from_fields(record: list[str]) -> EntryInfo:
    """One entry from its ``find`` fields: type, target type, size, mode, owner, group, …

    A symlink is described as envd 0.6 does: its target's type, and the target as an
    absolute path (``isSymlink``, which later envd versions add, is not sent)."""
    kind, target_kind, size, mode, owner, group, mtime, link, path = record
    bits = int(mode, 8) if mode else 0
    return EntryInfo(
        name=posixpath.basename(path) or path,
        type=_TYPES.get(target_kind, "FILE_TYPE_UNSPECIFIED"),
        path=path,
        size=size if size.isdigit() else "0",
        mode=bits & 0o777,
        permissions=_go_mode(kind, bits),
        owner=owner,
        group=group,
        modified_time=_timestamp(mtime),
        symlink_target=_absolute(path, link) if kind == "l" else None,
    )


def _absolute(path: str, link: str) -> str:
    return posixpath.normpath(posixpath.join(posixpath.dirname(path), link))


def _go_mode(kind: str, bits: int) -> str:
    """Go's ``FileMode.String()``: type letters, then ``rwxrwxrwx`` with ``-`` for unset."""
    prefix = _GO_TYPE.get(kind, "?")
    if bits & stat.S_ISUID:
        prefix += "u"
    if bits & stat.S_ISGID:
        prefix += "g"
    if bits & stat.S_ISVTX:
        prefix += "t"
    rwx = "".join(c if bits & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return (prefix or "-") + rwx


def _timestamp(value: str) -> str | None:
    seconds, _, fraction = value.partition(".")
    if not seconds.lstrip("-").isdigit():
        return None
    moment = datetime.fromtimestamp(int(seconds), timezone.utc)
    nanos = (fraction + "000000000")[:9] if fraction.isdigit() else "000000000"
    return moment.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos}Z"
