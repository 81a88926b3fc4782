"""The sandbox agent's work on the sandbox's content: file operations, metadata, and the copies
of a sandbox's files that snapshots and forks are made of (see ``agent_copies.py``).

Standard library only: it runs inside the sandbox, shipped beside ``agent.py``, in a helper
process the agent forks for one request, already switched to the requesting user (see
``agent.py``), so it needs nothing from the image (no shell, no coreutils) and sees exactly
the sandbox's own view. :func:`serve` answers one request: one JSON line on ``reply``,
``{"ok": value}`` or ``{"error": {"errno": "ENOENT", ...}}``; bytes flow through ``data`` (a
pipe), never held whole::

    serve("stat", {"path": "/home/user/a"}, reply, None)    # {"ok": {"fields": [...], ...}}
    serve("read", {"path": "/home/user/a"}, reply, out)      # {"ok": {"size": n}}, then bytes
    serve("write", {"path": p, "metadata": None}, reply, in_)
    serve("export", {"places": ["/", "/home/user"], "layer": None}, reply, out)  # a tar
    serve("import", {"places": ["/", "/home/user"]}, reply, in_)
    serve("watch", {"path": "/home/user", "recursive": True}, reply, out)  # events, until
                                                                           # out is closed

Entries are answered as a listing: for each, the fields ``find -printf`` would print
(type, target type, size, mode, owner, group, mtime, link target, path), each ended by a
NUL, then a JSON object of their metadata by path (the extended attributes
``user.e2b.<key>``), all in one string (bytes that are not UTF-8 kept as surrogates).

The copies (export, import) and the tree walks, iterative at any depth, are in
``agent_copies.py``, shipped beside this file.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import stat
from types import ModuleType
from typing import TYPE_CHECKING, Any


def _sibling(name: str) -> ModuleType:
    """The shipped module ``name``, beside this file (the sandbox has no package)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"piship_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {name}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from piship_remote.local.isolation import agent_copies as copies
else:
    copies = _sibling("agent_copies")
Refused = copies.Refused
PIECE = copies.PIECE
remove_tree = copies.remove_tree

METADATA_PREFIX = "user.e2b."
_KINDS = (
    (stat.S_ISREG, "f"),
    (stat.S_ISDIR, "d"),
    (stat.S_ISLNK, "l"),
    (stat.S_ISFIFO, "p"),
    (stat.S_ISSOCK, "s"),
    (stat.S_ISBLK, "b"),
    (stat.S_ISCHR, "c"),
)


def serve(call: str, args: dict[str, Any], reply: int, data: int | None) -> None:
    """Answer one request on ``reply`` (and ``data``); never raises."""
    try:
        value = _CALLS[call](args, reply, data)
    except Refused as e:
        _answer(reply, {"error": e.details})
    except OSError as e:
        code = errno.errorcode.get(e.errno or 0, "EIO")
        _answer(reply, {"error": {"errno": code, "path": e.filename}})
    except (KeyError, TypeError, ValueError) as e:
        _answer(reply, {"error": {"errno": "EINVAL", "message": str(e)[:200]}})
    else:
        if value is not _ANSWERED:
            _answer(reply, {"ok": value})


_ANSWERED = object()


def _answer(reply: int, message: dict[str, object]) -> None:
    line = json.dumps(message).encode() + b"\n"
    try:
        while line:
            line = line[os.write(reply, line) :]
    except OSError:
        pass


# ---- entries -------------------------------------------------------------------------


class _Names:
    """User and group names from the sandbox's own ``/etc/passwd`` and ``/etc/group``."""

    def __init__(self) -> None:
        self._users: dict[int, str] | None = None
        self._groups: dict[int, str] | None = None

    def user(self, uid: int) -> str:
        if self._users is None:
            self._users = _read_names("/etc/passwd")
        return self._users.get(uid, str(uid))

    def group(self, gid: int) -> str:
        if self._groups is None:
            self._groups = _read_names("/etc/group")
        return self._groups.get(gid, str(gid))


def _read_names(path: str) -> dict[int, str]:
    found: dict[int, str] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as listing:
            for line in listing:
                fields = line.split(":")
                if len(fields) > 2 and fields[2].isdigit():
                    found.setdefault(int(fields[2]), fields[0])
    except OSError:
        pass
    return found


_NAMES = _Names()


def _kind(mode: int) -> str:
    for test, letter in _KINDS:
        if test(mode):
            return letter
    return "U"


def listing(paths: list[str]) -> str:
    """The listing of ``paths`` (those still there): their fields, then their metadata."""
    fields, found = [], {}
    for path in paths:
        try:
            described = describe(path)
        except OSError:
            continue
        fields += described
        metadata = read_metadata(path)
        if metadata:
            found[path] = metadata
    return "".join(field + "\0" for field in fields) + json.dumps(found)


def describe(path: str) -> list[str]:
    """``path``'s fields, as ``find -printf`` prints them."""
    info = os.lstat(path)
    kind = _kind(info.st_mode)
    link, target = "", kind
    if kind == "l":
        link = os.readlink(path)
        try:
            target = _kind(os.stat(path).st_mode)
        except FileNotFoundError:
            target = "N"
        except OSError as e:
            target = "L" if e.errno == errno.ELOOP else "?"
    nanos = info.st_mtime_ns
    return [
        kind,
        target,
        str(info.st_size),
        format(info.st_mode & 0o7777, "o"),
        _NAMES.user(info.st_uid),
        _NAMES.group(info.st_gid),
        f"{nanos // 10**9}.{nanos % 10**9:09d}",
        link,
        path,
    ]


def read_metadata(path: str) -> dict[str, str]:
    """``path``'s metadata: its ``user.e2b.<key>`` attributes (none where unreadable)."""
    try:
        names = os.listxattr(path)
    except OSError:
        return {}
    found = {}
    for name in names:
        if name.startswith(METADATA_PREFIX):
            try:
                value = os.getxattr(path, name)
            except OSError:
                continue
            found[name[len(METADATA_PREFIX) :]] = value.decode("ascii", "replace")
    return found


def write_metadata(path: str, wanted: dict[str, str]) -> None:
    """Replace ``path``'s metadata with ``wanted``."""
    for name in os.listxattr(path):
        if name.startswith(METADATA_PREFIX):
            os.removexattr(path, name)
    for key, value in wanted.items():
        os.setxattr(path, METADATA_PREFIX + key, value.encode("ascii"))


# ---- the calls -----------------------------------------------------------------------


def _stat(args: dict[str, Any], _: int, __: int | None) -> object:
    path = str(args["path"])
    os.lstat(path)
    return listing([path])


def _describe(args: dict[str, Any], _: int, __: int | None) -> object:
    return listing([str(path) for path in args["paths"]])


def _list(args: dict[str, Any], _: int, __: int | None) -> object:
    top, depth = str(args["path"]), int(args["depth"])
    if not stat.S_ISDIR(os.stat(top).st_mode):  # the top is followed, as find -H does
        raise Refused("ENOTDIR", path=top)
    found = []
    pending = [(top, 1)]
    while pending:
        directory, level = pending.pop()
        try:
            with os.scandir(directory) as entries:
                children = list(entries)
        except OSError:
            continue
        for child in children:
            path = os.path.join(directory, child.name)
            found.append(path)
            try:
                if level < depth and child.is_dir(follow_symlinks=False):
                    pending.append((path, level + 1))
            except OSError:
                continue
    return listing(found)


def _make_dir(args: dict[str, Any], _: int, __: int | None) -> object:
    path = str(args["path"])
    if os.path.isdir(path):
        raise Refused("EEXIST", directory=True)
    if os.path.lexists(path):
        raise Refused("EEXIST", directory=False)
    os.makedirs(path)
    return listing([path])


def _move(args: dict[str, Any], _: int, __: int | None) -> object:
    source, destination = str(args["source"]), str(args["destination"])
    if not os.path.lexists(source):
        raise Refused("ENOENT", path=source, source=True)
    os.makedirs(os.path.dirname(destination) or "/", exist_ok=True)
    try:
        os.rename(source, destination)
    except OSError as e:
        if e.errno != errno.EXDEV or (os.path.isdir(source) and not os.path.islink(source)):
            raise
        _copy_entry(source, destination)
        os.unlink(source)
    return listing([destination])


def _copy_entry(source: str, destination: str) -> None:
    """A file or symlink copied to another filesystem of the sandbox (a move across mounts)."""
    info = os.lstat(source)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(source), destination)
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with open(source, "rb") as reader, open(os.open(destination, flags, 0o600), "wb") as writer:
        while piece := reader.read(PIECE):
            writer.write(piece)
        os.fchmod(writer.fileno(), stat.S_IMODE(info.st_mode))
    os.utime(destination, ns=(info.st_atime_ns, info.st_mtime_ns))


def _remove(args: dict[str, Any], _: int, __: int | None) -> object:
    remove_tree(str(args["path"]))
    return {}


def _read(args: dict[str, Any], reply: int, data: int | None) -> object:
    path = str(args["path"])
    assert data is not None
    try:
        info = os.stat(path)
    except PermissionError:
        raise Refused("EACCES", path=path, stage="stat") from None
    except OSError:
        raise Refused("ENOENT", path=path) from None
    if stat.S_ISDIR(info.st_mode):
        raise Refused("EISDIR", path=path)
    try:
        source = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except PermissionError:
        raise Refused("EACCES", path=path, stage="open") from None
    try:
        size = os.fstat(source).st_size
        os.set_blocking(source, True)
        _answer(reply, {"ok": {"size": size}})
        _send(source, data, size)
    finally:
        os.close(source)
    return _ANSWERED


def _send(source: int, target: int, size: int) -> None:
    """Copy at most ``size`` bytes of ``source`` to ``target`` (a device never ends)."""
    left = size
    while left > 0:
        try:
            sent = os.sendfile(target, source, None, min(left, PIECE))
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOSYS):
                raise
            piece = os.read(source, min(left, PIECE))
            copies.write_all(target, piece)
            sent = len(piece)
        if sent == 0:
            return
        left -= sent


def _write(args: dict[str, Any], _: int, data: int | None) -> object:
    path, metadata = str(args["path"]), args.get("metadata")
    assert data is not None
    if os.path.isdir(path):
        raise Refused("EISDIR", path=path)
    parent = os.path.dirname(path) or "/"
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        blocked = _first_non_directory(parent)
        code = "ENOTDIR" if blocked is not None else errno.errorcode.get(e.errno or 0, "EIO")
        raise Refused(code, path=e.filename or parent, blocked=blocked, stage="parent") from None
    existed = os.path.isfile(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOCTTY | os.O_CLOEXEC
    try:
        target = os.open(path, flags, 0o666)
    except OSError as e:
        raise Refused(errno.errorcode.get(e.errno or 0, "EIO"), path=path, stage="open") from None
    try:
        os.utime(target)
        while piece := os.read(data, PIECE):
            copies.write_all(target, piece)
    finally:
        os.close(target)
    if existed or metadata:
        try:
            write_metadata(path, dict(metadata or {}))
        except OSError as e:
            raise Refused("EMETADATA", message=e.strerror or "failed") from None
    return {}


def hand_parents(path: str, uid: int) -> None:
    """As the sandbox's root, before a helper becomes ``uid``: make the missing parents of
    ``path`` and give them to ``uid``, as envd does, so the user's ``/app/x`` can be written.

    Whatever fails here is left to the user's own write, which reports it.
    """
    if not os.path.isabs(path):
        return
    missing: list[str] = []
    parent = os.path.dirname(os.path.normpath(path))
    while parent != "/" and not os.path.lexists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o755)
            os.chown(directory, uid, uid, follow_symlinks=False)
        except OSError:
            return


def _first_non_directory(path: str) -> str | None:
    """The first component of ``path`` that exists and is not a directory, if any."""
    walked = "/"
    for part in path.strip("/").split("/"):
        walked = os.path.join(walked, part)
        if not os.path.lexists(walked):
            return None
        if not os.path.isdir(walked):
            return walked
    return None


def _canonical(args: dict[str, Any], _: int, __: int | None) -> object:
    path = str(args["path"])
    try:
        info = os.stat(path)
    except PermissionError:
        raise Refused("EACCES", path=path, stage="stat") from None
    except OSError:
        raise Refused("ENOENT", path=path) from None
    if not stat.S_ISDIR(info.st_mode):
        raise Refused("ENOTDIR", path=path)
    real = os.path.realpath(path)
    if not os.access(real, os.R_OK | os.X_OK):
        raise Refused("EACCES", path=path, stage="read")
    return real


def _usage(args: dict[str, Any], _: int, __: int | None) -> object:
    total = 0
    for place in args["places"]:
        for _entry, info in copies.Tree(str(place)).walk():
            total += info.st_size
    return total


# ---- trees ---------------------------------------------------------------------------


def _export(args: dict[str, Any], _: int, data: int | None) -> object:
    assert data is not None
    copies.export(args, data)
    return {}


def _import(args: dict[str, Any], _: int, data: int | None) -> object:
    assert data is not None
    copies.import_copy(args, data)
    return {}


def _watch(args: dict[str, Any], reply: int, data: int | None) -> object:
    """Watch a directory until the host closes ``data`` (see ``agent_watch.py``)."""
    assert data is not None
    real = str(_canonical(args, reply, None))
    watching = _sibling("agent_watch")
    watching.watch(real, bool(args.get("recursive")), lambda: _answer(reply, {"ok": real}), data)
    return _ANSWERED


_CALLS = {
    "stat": _stat,
    "describe": _describe,
    "list": _list,
    "make_dir": _make_dir,
    "move": _move,
    "remove": _remove,
    "read": _read,
    "write": _write,
    "canonical": _canonical,
    "watch": _watch,
    "usage": _usage,
    "export": _export,
    "import": _import,
}
