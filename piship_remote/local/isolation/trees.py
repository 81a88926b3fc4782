"""Host directory trees walked and removed without recursion, at any depth.

A sandbox can make a tree 10,000 directories deep; a recursive walk (``shutil.rmtree``
and ``os.walk`` recurse on Python 3.11) dies with ``RecursionError`` there, and a path
joined from the top passes ``PATH_MAX`` long before. :func:`remove_tree` works from one
open directory at a time, by names relative to it; :func:`walk` keeps its own stack::

    remove_tree("/tmp/piship-local-1-x/ab12")     # what cannot be removed is left, quietly
    for directory, dirnames, filenames in walk("/srv/rootfs"):
        ...                                        # top-down, symlinks never followed

:func:`remove_tree` does not descend into another filesystem mounted in the tree (a
mount still there is left, never emptied through), and climbs back only to the very
directory it came from: a tree moved meanwhile stops the removal.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator

__all__ = ["mounts_below", "remove_tree", "walk"]

_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_ONLY = getattr(os, "O_PATH", 0) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class TreeMoved(OSError):
    """A directory being removed was moved meanwhile: the removal stopped there."""


def remove_tree(path: str) -> None:
    """Remove ``path`` and everything below it, read-only directories included; what is
    gone already, or cannot be removed, is left without an error."""
    try:
        top = _open_directory(path, None)
    except FileNotFoundError:
        return
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)  # a file or a symlink (never followed); a directory stays
        return
    try:
        os.close(_empty(top))
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.rmdir(path)


def mounts_below(path: str) -> list[str]:
    """The mount points at or below ``path`` in the calling thread's mount namespace (a root
    service's is its spawner thread's), deepest first (what a crashed service left
    mounted, to detach before its directory is removed)."""
    prefix = os.path.realpath(path).rstrip("/") + "/"
    found: list[str] = []
    mountinfo = "/proc/thread-self/mountinfo"
    with contextlib.suppress(OSError), open(mountinfo, encoding="utf-8") as table:
        for line in table:
            fields = line.split(" ")
            if len(fields) > 4:
                point = _unescape(fields[4])
                if (point + "/").startswith(prefix):
                    found.append(point)
    return sorted(found, key=lambda point: point.count("/"), reverse=True)


def _unescape(field: str) -> str:
    """A mountinfo path: space, tab, newline and backslash are written as octal escapes."""
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field


def walk(root: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``os.walk(root)`` top-down without recursion: each directory's path, its
    subdirectories and its other entries (symlinks to directories among these)."""
    pending = [root]
    while pending:
        directory = pending.pop()
        dirnames: list[str] = []
        filenames: list[str] = []
        with os.scandir(directory) as entries:
            for entry in entries:
                (dirnames if entry.is_dir(follow_symlinks=False) else filenames).append(entry.name)
        yield directory, dirnames, filenames
        pending.extend(os.path.join(directory, name) for name in reversed(dirnames))


def _empty(top: int) -> int:
    """Remove everything in the directory open as ``top`` (this takes the descriptor);
    the descriptor of that same directory to close (the walk moves through descriptors)."""
    climbs: list[tuple[str, int, int, set[str]]] = []  # name below, parent's dev and inode
    fd, skipped = top, set[str]()
    try:
        while True:
            below = _clear_entries(fd, skipped)
            if below is not None:
                child = _open_child(fd, below)
                if child is None:
                    skipped.add(below)
                    continue
                parent = os.fstat(fd)
                climbs.append((below, parent.st_dev, parent.st_ino, skipped))
                os.close(fd)
                fd, skipped = child, set()
                continue
            if not climbs:
                return fd
            below, device, inode, skipped = climbs.pop()
            parent_fd = os.open("..", _DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = parent_fd
            parent = os.fstat(fd)
            if (parent.st_dev, parent.st_ino) != (device, inode):
                raise TreeMoved("the tree was moved while it was being removed")
            try:
                os.rmdir(below, dir_fd=fd)
            except OSError:
                skipped.add(below)
    except BaseException:
        os.close(fd)
        raise


def _clear_entries(fd: int, skipped: set[str]) -> str | None:
    """Unlink what is not a directory in ``fd``; the first subdirectory to empty, if any."""
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.name in skipped:
                continue
            if entry.is_dir(follow_symlinks=False):
                return entry.name
            try:
                os.unlink(entry.name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError:
                skipped.add(entry.name)
    return None


def _open_child(fd: int, name: str) -> int | None:
    """The directory ``name`` in ``fd`` opened, writable by us; ``None`` when it cannot be,
    or is another filesystem mounted there."""
    try:
        child = _open_directory(name, fd)
    except OSError:
        return None
    if os.fstat(child).st_dev != os.fstat(fd).st_dev:
        os.close(child)
        return None
    return child


def _open_directory(name: str, dir_fd: int | None) -> int:
    """Open a directory (never through a symlink), granting its owner rwx where a sandbox
    took them away: a service that is not root needs them to empty it."""
    try:
        fd = os.open(name, _DIRECTORY, dir_fd=dir_fd)
    except PermissionError:
        _unlock(name, dir_fd)
        fd = os.open(name, _DIRECTORY, dir_fd=dir_fd)
    mode = os.fstat(fd).st_mode
    if mode & stat.S_IRWXU != stat.S_IRWXU:
        with contextlib.suppress(OSError):
            os.fchmod(fd, stat.S_IMODE(mode) | stat.S_IRWXU)
    return fd


def _unlock(name: str, dir_fd: int | None) -> None:
    """Give the directory ``name`` its owner's rwx, through a handle that cannot follow a
    symlink swapped in (``O_PATH``, changed through its ``/proc/self/fd`` entry)."""
    handle = os.open(name, _PATH_ONLY, dir_fd=dir_fd)
    try:
        mode = os.stat(handle).st_mode
        os.chmod(f"/proc/self/fd/{handle}", stat.S_IMODE(mode) | stat.S_IRWXU)
    finally:
        os.close(handle)
