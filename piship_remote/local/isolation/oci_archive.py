"""A container image archive unpacked into a root filesystem, layer by layer, nothing outside it.

Three archive forms are read: what ``docker save`` / ``podman save`` write (a
``manifest.json`` listing the layer tars), an OCI image layout in a tar
(``index.json`` -> a manifest blob -> layer blobs), and a flat root filesystem (what
``docker export`` writes: one tar of the files with ``usr/``, ``etc/`` or ``bin/`` at its
top, read as one layer). Layers are applied in order;
their whiteouts are honoured (``.wh.NAME`` removes ``NAME`` from the layers below,
``.wh..wh..opq`` empties its directory first). Layers may be plain or gzip tars::

    unpack_image("app.tar", "/var/cache/piship/templates/app")   # ImageRefused if hostile
    copy_root("./rootfs", "/var/cache/piship/templates/tools")     # a folder, links kept

Nothing is ever written outside ``target``: a member named with an absolute path or
``..``, one whose parent is a symlink (in the image so far), and a hard link to
outside the root refuse the whole archive (:class:`ImageRefused`). Device nodes are
skipped (they cannot be made unprivileged and a sandbox gets its own ``/dev``); owners
are not restored (the files belong to the service, the sandbox sees them read-only).
Every file, link and directory keeps its modification time, and every file its mode
(a directory stays open to the service), so the image's ``.pyc`` files stay valid: a
Python whose sources all carried the unpack time would recompile them at every start.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import stat
import tarfile
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["ImageRefused", "copy_root", "is_image_archive", "unpack_image"]

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
PIECE = 1024 * 1024
_ROOT_FOLDERS = frozenset({"usr", "etc", "bin"})  # one of them: a flat tar is a root filesystem


class ImageRefused(ValueError):
    """The archive is not an image this service reads, or would write outside its root."""


def is_image_archive(path: str) -> bool:
    """Whether ``path`` is a file holding a tar (the image forms are checked on unpacking)."""
    return os.path.isfile(path) and tarfile.is_tarfile(path)


def unpack_image(archive: str, target: str) -> None:
    """Unpack the image ``archive`` (or flat root filesystem tar) into the new directory
    ``target`` (its parent must exist)."""
    os.mkdir(target, 0o755)
    folder_times: dict[str, float] = {}
    with tarfile.open(archive, "r:*") as outer:
        if _is_flat(outer):
            _apply(outer, target, folder_times)
        else:
            for layer in _layers(outer):
                with tarfile.open(fileobj=layer, mode="r:*") as tar:
                    _apply(tar, target, folder_times)
    _set_folder_times(folder_times)


def copy_root(source: str, target: str) -> None:
    """Copy the root filesystem ``source`` into the new directory ``target``: directories,
    regular files and symlinks (as links, never followed), with their times; other kinds
    are skipped."""
    os.mkdir(target, 0o755)
    folder_times = {target: os.stat(source).st_mtime}
    for directory, dirnames, filenames in os.walk(source):
        inside = os.path.join(target, os.path.relpath(directory, source))
        for name in dirnames + filenames:
            copied = os.path.join(inside, name)
            mtime = _copy_entry(os.path.join(directory, name), copied)
            if name in dirnames and mtime is not None:
                folder_times[copied] = mtime
    _set_folder_times(folder_times)


def _copy_entry(path: str, copy: str) -> float | None:
    """Copy one entry (a directory empty: its files follow); its modification time."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(path), copy)
    elif stat.S_ISDIR(info.st_mode):
        os.mkdir(copy, stat.S_IMODE(info.st_mode) | 0o700)
        return info.st_mtime
    elif stat.S_ISREG(info.st_mode):
        shutil.copyfile(path, copy, follow_symlinks=False)
        os.chmod(copy, stat.S_IMODE(info.st_mode) & 0o1777)
    else:
        return None
    os.utime(copy, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)
    return info.st_mtime


def _set_folder_times(folder_times: dict[str, float]) -> None:
    """Give each folder its time, deepest first (filling a folder changes its time)."""
    for folder in sorted(folder_times, key=lambda path: path.count(os.sep), reverse=True):
        if os.path.isdir(folder) and not os.path.islink(folder):
            os.utime(folder, (folder_times[folder], folder_times[folder]))


def _is_flat(outer: tarfile.TarFile) -> bool:
    """Whether the tar is a root filesystem itself (``docker export``: no image manifest,
    and a root's ``usr``, ``etc`` or ``bin`` at its top), not an image."""
    names = set(outer.getnames())
    if "manifest.json" in names or "index.json" in names:
        return False
    tops = {name.removeprefix("./").split("/", 1)[0] for name in names}
    return bool(tops & _ROOT_FOLDERS)


def _layers(outer: tarfile.TarFile) -> Iterator[IO[bytes]]:
    """The layer tars of a docker-save archive or an OCI layout, lowest first."""
    names = set(outer.getnames())
    if "manifest.json" in names:
        manifest = _json(outer, "manifest.json")
        if not isinstance(manifest, list) or not manifest or not isinstance(manifest[0], dict):
            raise ImageRefused("manifest.json names no image")
        paths = manifest[0].get("Layers")
    elif "index.json" in names:
        paths = _oci_layers(outer)
    else:
        raise ImageRefused(
            "not an image archive: no manifest.json (docker save) or index.json (OCI), nor a"
            " root filesystem (docker export: usr/, etc/ or bin/ at its top)"
        )
    if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
        raise ImageRefused("the image's manifest lists no layers")
    for path in paths:
        yield _member(outer, path)


def _oci_layers(outer: tarfile.TarFile) -> list[str]:
    index = _json(outer, "index.json")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or not manifests or not isinstance(manifests[0], dict):
        raise ImageRefused("index.json names no manifest")
    manifest = _json(outer, _blob(manifests[0].get("digest")))
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list):
        raise ImageRefused("the OCI manifest lists no layers")
    return [_blob(layer.get("digest") if isinstance(layer, dict) else None) for layer in layers]


def _blob(digest: object) -> str:
    if not isinstance(digest, str) or ":" not in digest:
        raise ImageRefused(f"not a content digest: {digest!r}"[:200])
    algorithm, _, value = digest.partition(":")
    if not (algorithm.isalnum() and value.isalnum()):
        raise ImageRefused(f"not a content digest: {digest!r}"[:200])
    return f"blobs/{algorithm}/{value}"


def _member(outer: tarfile.TarFile, name: str) -> IO[bytes]:
    try:
        extracted = outer.extractfile(name)
    except KeyError:
        extracted = None
    if extracted is None:
        raise ImageRefused(f"the archive has no file {name!r}"[:200])
    return extracted


def _json(outer: tarfile.TarFile, name: str) -> Any:
    data = _member(outer, name).read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise ImageRefused(f"{name} is too large")
    try:
        return json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ImageRefused(f"{name} is not JSON") from None


# -- one layer -----------------------------------------------------------------------------


def _apply(tar: tarfile.TarFile, root: str, folder_times: dict[str, float]) -> None:
    for member in tar:
        relative = _safe_name(member.name)
        if relative is None:
            continue  # the root itself
        parent, base = posixpath.split(relative)
        parent_path = _inside(root, parent)
        if base == OPAQUE:
            _empty(parent_path)
        elif base.startswith(WHITEOUT):
            _remove(os.path.join(parent_path, base[len(WHITEOUT) :]))
        else:
            _write(tar, member, root, parent_path, base)
            if member.isdir():
                folder_times[os.path.join(parent_path, base)] = member.mtime


def _safe_name(name: str) -> str | None:
    """The member's path relative to the root; :class:`ImageRefused` if it leaves it."""
    if name.startswith("/"):
        raise ImageRefused(f"the image holds an absolute path: {name!r}"[:200])
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ImageRefused(f"the image holds a path out of its root: {name!r}"[:200])
    return "/".join(parts) or None


def _inside(root: str, relative: str) -> str:
    """The host path of directory ``relative``, made if missing, refusing symlinks on the way."""
    path = root
    for part in relative.split("/") if relative else ():
        path = os.path.join(path, part)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            os.mkdir(path, 0o755)
            continue
        if stat.S_ISLNK(mode):
            raise ImageRefused(f"the image writes through a symlink: {relative!r}"[:200])
        if not stat.S_ISDIR(mode):
            raise ImageRefused(f"the image writes below a file: {relative!r}"[:200])
    return path


def _remove(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _empty(directory: str) -> None:
    for name in os.listdir(directory):
        _remove(os.path.join(directory, name))


def _write(
    tar: tarfile.TarFile, member: tarfile.TarInfo, root: str, parent: str, base: str
) -> None:
    path = os.path.join(parent, base)
    if member.isdir():
        # Kept writable by the service while later members and layers fill it.
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, _mode(member) | 0o700)
            return
        _remove(path)
        os.mkdir(path, _mode(member) | 0o700)
        return
    _remove(path)
    if member.issym():
        os.symlink(member.linkname, path)
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
    elif member.islnk():
        source = _safe_name(member.linkname)
        if source is None:
            raise ImageRefused(f"the image links to its root: {member.name!r}"[:200])
        head, tail = posixpath.split(source)
        os.link(os.path.join(_inside(root, head), tail), path, follow_symlinks=False)
    elif member.isfile():
        extracted = tar.extractfile(member)
        assert extracted is not None  # a regular file always has content
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, _mode(member))
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(extracted, out, PIECE)
        os.chmod(path, _mode(member))
        os.utime(path, (member.mtime, member.mtime))
    elif member.isfifo():
        os.mkfifo(path, _mode(member))
        os.utime(path, (member.mtime, member.mtime))
    # Character and block devices are skipped: the sandbox gets its own /dev.


def _mode(member: tarfile.TarInfo) -> int:
    """The member's permission bits without set-id bits (the sandbox's mounts are nosuid)."""
    return member.mode & 0o1777
