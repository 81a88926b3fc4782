"""File operations in a sandbox, done by its agent, as the requesting user (default: the
sandbox's).

A hostile sandbox can plant symlinks to host files, so no sandbox path is ever
resolved on the host: each operation is a request to the sandbox's agent, whose helper
does it inside, in Python, as the user (see
:mod:`piship_remote.local.isolation.agent_files`), needing nothing from the image. Bytes
are streamed through pipes; nothing holds a whole file::

    [entry] = entries_of(call(sandbox, "stat", {"path": "/home/user/a"}))
    call(sandbox, "remove", {"path": "/home/user/x"}, user=root)    # as root (an Identity)
    size, chunks = read(sandbox, "/home/user/big.bin")              # FilesFailed if not
    write(sandbox, "/home/user/new.txt", source, metadata=None)     # source(n) -> bytes
    events = watch(sandbox, "/home/user/src", recursive=True)      # a socket of JSON lines

A refusal is :class:`FilesFailed`, its ``code`` the errno's name (``ENOENT``, ``EACCES``,
``EROFS``, ``ENOSPC``, …). Paths come from :func:`resolve`: relative to the home, ``~``
expanded, cleaned.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import socket
import stat
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone

import attrs

from piship_remote.local.isolation.agent_link import FilesFailed, files_answer
from piship_remote.local.isolation.user_map import Identity
from piship_remote.local.sandbox.metadata import parse_found
from piship_remote.local.sandbox.registry import Sandbox
from piship_remote.wire.envd import EntryInfo
from piship_remote.wire.envd_paths import resolve

__all__ = [
    "ENTRY_FORMAT",
    "FEED_PIECE",
    "FilesFailed",
    "StreamBroken",
    "call",
    "entries_of",
    "entry_from_fields",
    "parse_entries",
    "read",
    "resolve",
    "watch",
    "write",
]

ENTRY_FORMAT = r"%y\0%Y\0%s\0%m\0%u\0%g\0%T@\0%l\0%p\0"
"""The fields of an entry in a listing, as ``find -printf`` would print them."""
FIELDS = 9
FEED_PIECE = 256 * 1024
READ_PIECE = 256 * 1024
_GO_TYPE = {"d": "d", "l": "L", "p": "p", "s": "S", "b": "D", "c": "Dc", "f": ""}
_TYPES = {"f": "FILE_TYPE_FILE", "d": "FILE_TYPE_DIRECTORY"}


class StreamBroken(Exception):
    """A read failed after its bytes had started (the answer is already on its way)."""


def call(
    sandbox: Sandbox, name: str, args: Mapping[str, object], *, user: Identity | None = None
) -> object:
    """The agent's answer to request ``name`` with ``args``, done as ``user``."""
    return files_answer(sandbox.files(name, args, user=user))


def read(
    sandbox: Sandbox, path: str, *, user: Identity | None = None
) -> tuple[int, Iterator[bytes]]:
    """``path``'s size and its bytes as they are read (at most that many)."""
    data_read, data_write = os.pipe()
    try:
        reply = sandbox.files("read", {"path": path}, user=user, data=data_write)
    except BaseException:
        os.close(data_read)
        raise
    try:
        answer = files_answer(reply, close=False)
    except BaseException:
        os.close(data_read)
        raise
    finally:
        os.close(reply)
    size = answer.get("size") if isinstance(answer, dict) else None
    if not isinstance(size, int):
        os.close(data_read)
        raise FilesFailed({"errno": "EIO", "message": "the sandbox agent sent no size"})
    return size, _chunks(data_read)


def _chunks(fd: int) -> Iterator[bytes]:
    try:
        while piece := os.read(fd, READ_PIECE):
            yield piece
    except OSError as e:
        raise StreamBroken(f"the read failed: {e.strerror}") from None
    finally:
        os.close(fd)


def write(
    sandbox: Sandbox,
    path: str,
    source: Callable[[int], bytes],
    *,
    metadata: Mapping[str, str] | None,
    user: Identity | None = None,
) -> None:
    """Write ``path`` (its parents made) with what ``source`` gives until it gives ``b""``,
    then replace its metadata where there is some to set or to clear (a new file has none)."""
    data_read, data_write = os.pipe()
    args = {"path": path, "metadata": dict(metadata) if metadata else None}
    try:
        reply = sandbox.files("write", args, user=user, data=data_read)
    except BaseException:
        os.close(data_write)
        raise
    try:
        with open(data_write, "wb", buffering=0) as pipe:
            data_write = -1
            with contextlib.suppress(BrokenPipeError):  # it ended early; its answer says why
                while piece := source(FEED_PIECE):
                    pipe.write(piece)
    except BaseException:
        os.close(reply)
        raise
    finally:
        if data_write >= 0:
            os.close(data_write)
    files_answer(reply)


def watch(sandbox: Sandbox, path: str, *, recursive: bool, user: Identity | None = None) -> int:
    """Have the agent watch directory ``path``; the socket its events come on (one JSON line
    each, see :mod:`piship_remote.local.envd.watcher`), once the watch is set. Closing it
    ends the watch."""
    kept, sent = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        args = {"path": path, "recursive": recursive}
        files_answer(sandbox.files("watch", args, user=user, data=sent.detach()))
    except BaseException:
        kept.close()
        raise
    return kept.detach()


def entries_of(value: object) -> list[EntryInfo]:
    """The entries of a listing the agent sent (see :func:`parse_entries`)."""
    if not isinstance(value, str):
        raise FilesFailed({"errno": "EIO", "message": "the sandbox agent sent no listing"})
    return parse_entries(value.encode(errors="surrogateescape"))


def parse_entries(output: bytes) -> list[EntryInfo]:
    """The entries of a listing: each one's :data:`ENTRY_FORMAT` fields (NUL-ended), then
    the JSON object of their metadata by path."""
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
