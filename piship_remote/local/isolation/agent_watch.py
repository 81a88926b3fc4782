"""A sandbox agent's watch of a directory: inotify, inside the sandbox, as the requesting user.

Run by the helper the agent forks for a ``watch`` request (see ``agent_files.py``; standard
library only, ``ctypes`` for inotify): it watches the directory (and, ``recursive``, every
directory below it: a new one is watched at once and what it already holds is reported as
created) and writes each event as a JSON line ``{"name": "src/a.txt", "type":
"EVENT_TYPE_CREATE"}`` on ``data`` (a socket), named relative to the watched directory,
until the host closes the other end; a byte from the host asks for every event so far,
then a ``{"sync": true}`` line::

    watch("/home/user/src", True, ready, data)   # ready() once the watch is set
"""

from __future__ import annotations

import json
import os
import select
import struct
from collections.abc import Callable

PIECE = 64 * 1024

IN_MODIFY, IN_ATTRIB, IN_MOVED_FROM, IN_MOVED_TO = 0x2, 0x4, 0x40, 0x80
IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x100, 0x200, 0x400, 0x800
IN_Q_OVERFLOW, IN_IGNORED, IN_ONLYDIR, IN_DONT_FOLLOW = 0x4000, 0x8000, 0x1000000, 0x2000000
IN_EXCL_UNLINK, IN_ISDIR = 0x4000000, 0x40000000
WATCH_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)
MAX_WATCHED_DIRS = 4096
# inotify bit -> envd's event type, in the order envd reports several at once.
_EVENT_TYPES = (
    (IN_CREATE | IN_MOVED_TO, "EVENT_TYPE_CREATE"),
    (IN_MODIFY, "EVENT_TYPE_WRITE"),
    (IN_DELETE | IN_DELETE_SELF, "EVENT_TYPE_REMOVE"),
    (IN_MOVED_FROM | IN_MOVE_SELF, "EVENT_TYPE_RENAME"),
    (IN_ATTRIB, "EVENT_TYPE_CHMOD"),
)
_EVENT_HEADER = struct.Struct("iIII")


class _Watch:
    """An inotify watch of the working directory (and, ``recursive``, every directory below
    it; a new one is watched at once and what it already holds is reported as created).
    Events are named relative to the watched directory."""

    def __init__(self, recursive: bool) -> None:
        import ctypes  # only a watch needs it

        self._libc = ctypes.CDLL(None, use_errno=True)
        self._errno = ctypes.get_errno
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(self._errno(), "inotify_init1")
        self._recursive = recursive
        self._dirs: dict[int, str] = {}
        self._moving: dict[int, str] = {}

    def start(self) -> list[tuple[str, str]]:
        return self._add("", report=False)

    def read(self) -> list[tuple[str, str]]:
        """The events the kernel holds now, as ``(name, envd type)``."""
        events: list[tuple[str, str]] = []
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not data:
                break
            offset = 0
            while offset + _EVENT_HEADER.size <= len(data):
                wd, mask, cookie, length = _EVENT_HEADER.unpack_from(data, offset)
                offset += _EVENT_HEADER.size
                raw = data[offset : offset + length].rstrip(b"\0")
                offset += length
                events += self._event(wd, mask, cookie, os.fsdecode(raw))
            for path in self._moving.values():
                self._forget_below(path)  # moved out of the watched tree
            self._moving.clear()
        return events

    def _event(self, wd: int, mask: int, cookie: int, name: str) -> list[tuple[str, str]]:
        base = self._dirs.get(wd)
        if mask & IN_Q_OVERFLOW or base is None:
            return []
        if mask & IN_IGNORED:
            del self._dirs[wd]
            return []
        if not name and base:
            return []  # a subdirectory's own removal or move is reported by its parent
        path = os.path.join(base, name) if name else "."
        events = [(path, kind) for bits, kind in _EVENT_TYPES if mask & bits]
        if not (self._recursive and mask & IN_ISDIR):
            return events
        if mask & IN_MOVED_FROM:
            self._moving[cookie] = path
        elif mask & IN_MOVED_TO and cookie in self._moving:
            old = self._moving.pop(cookie)
            for each, relative in list(self._dirs.items()):
                if relative == old or relative.startswith(old + "/"):
                    self._dirs[each] = path + relative[len(old) :]
        elif mask & (IN_CREATE | IN_MOVED_TO):
            # A new directory's early entries are reported; a moved-in one's were not new.
            events += self._add(path, report=bool(mask & IN_CREATE))
        return events

    def _forget_below(self, path: str) -> None:
        for wd, relative in list(self._dirs.items()):
            if relative == path or relative.startswith(path + "/"):
                self._libc.inotify_rm_watch(self.fd, wd)
                del self._dirs[wd]

    def _add(self, top: str, *, report: bool) -> list[tuple[str, str]]:
        """Watch directory ``top`` (and, recursively, those below); what is in them, as
        created events where ``report``."""
        events: list[tuple[str, str]] = []
        pending = [top]
        while pending and len(self._dirs) < MAX_WATCHED_DIRS:
            relative = pending.pop()
            wd = self._libc.inotify_add_watch(self.fd, os.fsencode(relative or "."), WATCH_MASK)
            if wd < 0:
                if relative == top:
                    raise OSError(self._errno(), "watching the directory")
                continue
            self._dirs[wd] = relative
            if not self._recursive and not report:
                continue
            try:
                with os.scandir(relative or ".") as entries:
                    children = list(entries)
            except OSError:
                continue
            for entry in children:
                child = os.path.join(relative, entry.name) if relative else entry.name
                if report:
                    events.append((child, "EVENT_TYPE_CREATE"))
                if self._recursive and entry.is_dir(follow_symlinks=False):
                    pending.append(child)
        return events


def watch(path: str, recursive: bool, ready: Callable[[], None], data: int) -> None:
    """Watch ``path``; call ``ready`` once the watch is set; write its events on ``data`` (a
    socket) until the host closes it. A byte from the host asks for a sync: every event the
    kernel holds is written, then ``{"sync": true}``."""
    os.chdir(path)
    watched = _Watch(recursive)
    events = watched.start()
    ready()
    poller = select.poll()
    poller.register(watched.fd, select.POLLIN)
    poller.register(data, select.POLLIN)
    with open(data, "wb", buffering=PIECE, closefd=False) as out:
        synced = False
        while True:
            for name, kind in events:
                out.write(json.dumps({"name": name, "type": kind}).encode() + b"\n")
            if synced:
                out.write(b'{"sync": true}\n')
            out.flush()
            ready_fds = dict(poller.poll())
            synced = False
            if data in ready_fds:
                if not os.read(data, 64):
                    return  # the host closed the watch
                synced = True
            events = watched.read()
