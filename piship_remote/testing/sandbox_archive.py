"""Tar archives in a double's in-memory tree: what ``tar -x`` and ``tar -c`` do in a sandbox.

Unpacking goes through the library's own safe unpacker (the one a pull uses), so an
archive lands in a double's tree by the same rules it would land anywhere: no
absolute names, no ``..``, no links, devices or FIFOs. The unpacker writes to a
scratch directory, whose files then move into the tree; nothing is run on the host.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import tempfile
from collections.abc import Iterable

from piship_remote.model.transfer import SkippedPath
from piship_remote.testing.sandbox_tree import ShellTree
from piship_remote.workspace._archive import unpack_tar

__all__ = ["pack", "unpack"]


def unpack(tree: ShellTree, data: bytes, target: str) -> tuple[SkippedPath, ...]:
    """Unpack the tar ``data`` below the directory ``target``; what it refused, and why."""
    times = _member_times(data)
    with tempfile.TemporaryDirectory(prefix="piship-double-") as scratch:
        summary = unpack_tar(io.BytesIO(data), scratch)
        for directory, subdirectories, files in os.walk(scratch):
            relative = os.path.relpath(directory, scratch)
            here = target if relative == "." else posixpath.join(target, *relative.split(os.sep))
            for name in sorted(subdirectories):
                _make_dirs(tree, posixpath.join(here, name))
            for name in sorted(files):
                path = posixpath.join(here, name)
                with open(os.path.join(directory, name), "rb") as handle:
                    member = posixpath.relpath(path, target)
                    tree.write_file(path, handle.read(), times.get(member))
    return summary.skipped


def pack(tree: ShellTree, root: str, names: Iterable[str], *, recursive: bool = True) -> bytes:
    """A tar of ``names`` (relative to ``root``, as given), directories walked when
    ``recursive``; files and directories only, as ``tar -c`` stores them."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for name in names:
            _add(tree, archive, root, name, recursive)
    return out.getvalue()


def _add(tree: ShellTree, archive: tarfile.TarFile, root: str, name: str, recursive: bool) -> None:
    path = posixpath.normpath(posixpath.join(root, name))
    kind = tree.kind(path)
    if kind is None:
        raise FileNotFoundError(2, "Cannot stat: No such file or directory", name)
    info = tarfile.TarInfo(name)
    info.mtime = int(tree.mtime(path))
    if kind == "dir":
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        archive.addfile(info)
        if recursive:
            for child in tree.names(path):
                _add(tree, archive, root, posixpath.join(name, child), recursive)
        return
    data = tree.read_file(path)
    info.size, info.mode = len(data), 0o644
    archive.addfile(info, io.BytesIO(data))


def _make_dirs(tree: ShellTree, path: str) -> None:
    if tree.kind(path) == "dir":
        return
    _make_dirs(tree, posixpath.dirname(path))
    tree.make_dir(path)


def _member_times(data: bytes) -> dict[str, float]:
    """Each regular member's modification time, by its normalised name."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r|*") as archive:
            return {posixpath.normpath(m.name): float(m.mtime) for m in archive if m.isfile()}
    except tarfile.TarError:
        return {}
