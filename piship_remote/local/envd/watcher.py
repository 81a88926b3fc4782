"""Watching a directory of a local sandbox with Linux inotify: envd's filesystem events.

A :class:`DirWatch` watches one directory (and, ``recursive``, every directory
below it) of a sandbox's writable places (its home, ``/tmp``, ``/dev/shm``) on
the host side. A sandbox can plant symlinks to host files, so the host side
never follows one: the directory is opened component by component with
``O_NOFOLLOW`` from the sandbox's own host directory, and the watch is added on
the opened descriptor (``/proc/self/fd/<n>``). Each inotify event becomes envd's
event type, named relative to the watched directory::

    pump = WatchPump()
    watch = DirWatch.open(host_root="/srv/sb/home", relative="src", recursive=True)
    pump.add(watch)                   # its events are read as they happen
    watch.wait(50.0)                  # True when events wait (or it was closed)
    watch.take()                      # [WatchEvent("a.txt", "EVENT_TYPE_CREATE"), ...]
    pump.remove(watch)                # and closes it

A ``piship-local-watch`` thread reads every watch's events as they happen, so
that a directory appearing below a recursive watch is watched at once; what it
already holds by then is reported as created. It runs while any watch exists.
A watch keeps at most :data:`MAX_EVENTS` untaken events (the oldest are dropped).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import posixpath
import queue
import selectors
import struct
import threading
from collections import deque

import attrs

__all__ = ["MAX_DIRS", "MAX_EVENTS", "DirWatch", "WatchEvent", "WatchPump"]

MAX_EVENTS = 10_000
MAX_DIRS = 4096
READ_BYTES = 64 * 1024
JOIN_TIMEOUT = 5.0
_HEADER = struct.Struct("iIII")
IN_MODIFY = 0x2
IN_ATTRIB = 0x4
IN_MOVED_FROM = 0x40
IN_MOVED_TO = 0x80
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_EXCL_UNLINK = 0x4000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC
_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_EXCL_UNLINK
)
# inotify bit → envd's event type, in the order envd reports several at once.
_TYPES = (
    (IN_CREATE | IN_MOVED_TO, "EVENT_TYPE_CREATE"),
    (IN_MODIFY, "EVENT_TYPE_WRITE"),
    (IN_DELETE | IN_DELETE_SELF, "EVENT_TYPE_REMOVE"),
    (IN_MOVED_FROM | IN_MOVE_SELF, "EVENT_TYPE_RENAME"),
    (IN_ATTRIB, "EVENT_TYPE_CHMOD"),
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@attrs.frozen
class WatchEvent:
    """One filesystem event: the entry's path relative to the watched directory, its type."""

    name: str
    type: str


class DirWatch:
    """One inotify instance watching a sandbox directory (recursively or not)."""

    def __init__(self, fd: int, root_fd: int, recursive: bool) -> None:
        self._fd = fd
        self._root_fd = root_fd
        self._recursive = recursive
        self._dirs: dict[int, str] = {}
        self._moving: dict[int, str] = {}
        self._lock = threading.Condition()
        self._pending: deque[WatchEvent] = deque(maxlen=MAX_EVENTS)
        self._closed = False

    @classmethod
    def open(cls, *, host_root: str, relative: str, recursive: bool) -> DirWatch:
        """Watch ``relative`` below the trusted ``host_root``; ``OSError`` when it cannot be.

        A symlink on the way is refused (``ELOOP``/``ENOTDIR``), never followed.
        """
        root_fd = os.open(host_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            dir_fd = _open_below(root_fd, relative)
        except OSError:
            os.close(root_fd)
            raise
        os.close(root_fd)
        libc = _libc()
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            os.close(dir_fd)
            raise _errno("inotify_init1")
        watch = cls(fd, dir_fd, recursive)
        try:
            watch._add("", dir_fd, report=False)
        except OSError:
            watch.close()
            raise
        return watch

    @property
    def closed(self) -> bool:
        """Whether the watch has ended."""
        return self._closed

    def fileno(self) -> int:
        """The inotify descriptor (readable when events wait)."""
        return self._fd

    def pump(self) -> None:
        """Read what the kernel holds into the untaken events (the pump thread's work)."""
        with self._lock:
            while not self._closed:
                try:
                    data = os.read(self._fd, READ_BYTES)
                except (BlockingIOError, InterruptedError):
                    break
                if not data:
                    break
                self._consume(data)
            self._lock.notify_all()

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for events (or the end); whether any came."""
        with self._lock:
            return self._lock.wait_for(lambda: bool(self._pending) or self._closed, timeout)

    def take(self) -> list[WatchEvent]:
        """The events since the last call."""
        with self._lock:
            taken = list(self._pending)
            self._pending.clear()
            return taken

    def close(self) -> None:
        """Stop watching; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._fd)
            os.close(self._root_fd)
            self._lock.notify_all()

    def _consume(self, data: bytes) -> None:
        offset = 0
        while offset + _HEADER.size <= len(data):
            wd, mask, cookie, length = _HEADER.unpack_from(data, offset)
            offset += _HEADER.size
            raw = data[offset : offset + length].rstrip(b"\0")
            offset += length
            self._event(wd, mask, cookie, os.fsdecode(raw))
        for path in self._moving.values():
            self._forget_below(path)  # moved out of the watched tree
        self._moving.clear()

    def _event(self, wd: int, mask: int, cookie: int, name: str) -> None:
        if mask & IN_Q_OVERFLOW:
            return
        base = self._dirs.get(wd)
        if base is None:
            return
        if mask & IN_IGNORED:
            del self._dirs[wd]
            return
        is_self = not name
        if is_self and base:
            return  # a subdirectory's own removal or move is reported by its parent
        path = posixpath.join(base, name) if name else "."
        for bits, kind in _TYPES:
            if mask & bits:
                self._pending.append(WatchEvent(path, kind))
        if not (self._recursive and mask & IN_ISDIR):
            return
        if mask & IN_MOVED_FROM:
            self._moving[cookie] = path
        elif mask & IN_MOVED_TO and cookie in self._moving:
            self._rename_below(self._moving.pop(cookie), path)
        elif mask & (IN_CREATE | IN_MOVED_TO):
            # A new directory's early entries are reported; a moved-in one's were not new.
            with contextlib.suppress(OSError):
                dir_fd = _open_below(self._root_fd, path)
                self._add(path, dir_fd, report=bool(mask & IN_CREATE))

    def _rename_below(self, old: str, new: str) -> None:
        """A directory moved within the tree: its watches (and those below) keep their wd."""
        for wd, relative in list(self._dirs.items()):
            if relative == old or relative.startswith(old + "/"):
                self._dirs[wd] = new + relative[len(old) :]

    def _forget_below(self, path: str) -> None:
        """Stop watching ``path`` and what is below it (moved away: its names are stale)."""
        for wd, relative in list(self._dirs.items()):
            if relative == path or relative.startswith(path + "/"):
                _libc().inotify_rm_watch(self._fd, wd)
                del self._dirs[wd]

    def _add(self, relative: str, dir_fd: int, *, report: bool) -> None:
        """Watch the open directory ``dir_fd`` (and, recursively, those below); closes it."""
        try:
            if len(self._dirs) >= MAX_DIRS:
                return
            path = f"/proc/self/fd/{dir_fd}".encode()
            wd = _libc().inotify_add_watch(self._fd, path, _MASK)
            if wd < 0:
                raise _errno(f"watching {relative or '.'}")
            self._dirs[wd] = relative
            if not self._recursive and not report:
                return
            with os.scandir(dir_fd) as entries:
                children = list(entries)
        finally:
            if dir_fd != self._root_fd:
                os.close(dir_fd)
        for entry in children:
            child = posixpath.join(relative, entry.name) if relative else entry.name
            if report:
                self._pending.append(WatchEvent(child, "EVENT_TYPE_CREATE"))
            if self._recursive and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    self._add(child, _open_below(self._root_fd, child), report=report)


class WatchPump:
    """The ``piship-local-watch`` thread: reads the events of every open watch."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._changes: queue.SimpleQueue[tuple[DirWatch, bool, threading.Event]]
        self._changes = queue.SimpleQueue()
        self._count = 0
        self._thread: threading.Thread | None = None
        self._wake: tuple[int, int] = (-1, -1)

    def add(self, watch: DirWatch) -> None:
        """Start reading ``watch``'s events."""
        with self._lock:
            self._count += 1
            if self._thread is None:
                self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
                self._thread = threading.Thread(
                    target=self._run, name="piship-local-watch", daemon=True
                )
                self._thread.start()
            self._change(watch, True)

    def remove(self, watch: DirWatch) -> None:
        """Stop reading ``watch`` and close it; the thread ends with the last watch."""
        with self._lock:
            self._count -= 1
            done = self._change(watch, False)
            thread = self._thread if self._count == 0 else None
        done.wait(JOIN_TIMEOUT)
        watch.close()
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_TIMEOUT)

    def _change(self, watch: DirWatch, adding: bool) -> threading.Event:
        done = threading.Event()
        self._changes.put((watch, adding, done))
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake[1], b"x")
        return done

    def _run(self) -> None:
        wake = self._wake[0]
        with selectors.DefaultSelector() as selector:
            selector.register(wake, selectors.EVENT_READ)
            watching = 0
            while True:
                while not self._changes.empty():
                    watch, adding, done = self._changes.get()
                    if adding:
                        selector.register(watch.fileno(), selectors.EVENT_READ, watch)
                        watching += 1
                    else:
                        with contextlib.suppress(KeyError, ValueError):
                            selector.unregister(watch.fileno())
                        watching -= 1
                    done.set()
                with self._lock:
                    if watching <= 0 and self._changes.empty():
                        os.close(self._wake[0])
                        os.close(self._wake[1])
                        self._thread = None
                        return
                for key, _ in selector.select():
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake, 4096)
                    else:
                        key.data.pump()


def _open_below(root_fd: int, relative: str) -> int:
    """Open the directory ``relative`` below ``root_fd`` without following any symlink."""
    fd = os.dup(root_fd)
    for part in [p for p in relative.split("/") if p and p != "."]:
        if part == "..":
            os.close(fd)
            raise OSError(errno.EINVAL, "a watched path may not climb out with '..'")
        try:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    if not _LIBC:
        name = ctypes.util.find_library("c")
        if name is None:
            raise OSError(errno.ENOSYS, "the C library cannot be loaded for inotify")
        libc = ctypes.CDLL(name, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
        _LIBC.append(libc)
    return _LIBC[0]


def _errno(doing: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{doing}: {os.strerror(err)}")
