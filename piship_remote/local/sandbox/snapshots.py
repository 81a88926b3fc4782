"""Snapshots of local sandboxes: copies of their files that new sandboxes start from.

A snapshot holds a copy of a sandbox's writable places (its home, ``/tmp``,
``/dev/shm`` and root's home) taken while it runs, and the template it was made
from; a sandbox created with the snapshot's ID as its template boots that
template and gets those files. A fork is the same copy made straight into a new
sandbox (:func:`copy_places`). Memory is not kept: what ran in the source does
not run in the copy. Snapshots live under the service directory and go with it::

    store = SnapshotStore(os.path.join(root, "snapshots"))
    snapshot = store.take(sandbox.host_dirs, template="base", source=sandbox.id, name="app")
    copy_places(snapshot.places, new_sandbox.host_dirs)
    store.delete(snapshot.id)
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping

import attrs

from piship_remote.local.sandbox.env import remove_tree

__all__ = ["MAX_SNAPSHOTS", "Snapshot", "SnapshotStore", "TooManySnapshots", "copy_places"]

MAX_SNAPSHOTS = 100


class TooManySnapshots(Exception):
    """The service keeps at most :data:`MAX_SNAPSHOTS` snapshots; delete one first."""


@attrs.frozen
class Snapshot:
    """One snapshot: its ID, names, the sandbox and template it came from, and its files."""

    id: str
    names: tuple[str, ...]
    source: str
    template: str
    places: Mapping[str, str]
    """Each place's copy, by its path in the sandbox."""
    taken_at: float

    def known_as(self, name: str) -> bool:
        """Whether ``name`` (its ID, or a name, optionally ``team/`` or ``:tag`` qualified)."""
        bare = name.rpartition("/")[2].partition(":")[0]
        return name == self.id or name in self.names or bare in self.names


class SnapshotStore:
    """The snapshots of one service, each a directory under ``root``."""

    def __init__(self, root: str, limit: int = MAX_SNAPSHOTS) -> None:
        self._root = root
        self._limit = limit
        self._lock = threading.Lock()
        self._snapshots: dict[str, Snapshot] = {}

    def take(
        self, places: Mapping[str, str], *, template: str, source: str, name: str | None
    ) -> Snapshot:
        """Copy ``places`` (path in the sandbox → host directory) into a new snapshot.

        A ``name`` already given to a snapshot moves to this one (the old one keeps its ID).
        ``OSError`` when the files cannot be copied; :class:`TooManySnapshots` at the limit.
        """
        with self._lock:
            if len(self._snapshots) >= self._limit:
                raise TooManySnapshots(f"the local service keeps at most {self._limit} snapshots")
        snapshot_id = "snapshot-" + secrets.token_hex(8)
        directory = os.path.join(self._root, snapshot_id)
        os.makedirs(directory, 0o700)
        copies = {inside: os.path.join(directory, f"place{n}") for n, inside in enumerate(places)}
        try:
            for path in copies.values():
                os.mkdir(path, 0o700)
            copy_places(places, copies)
        except OSError:
            remove_tree(directory)
            raise
        names = (name,) if name else ()
        snapshot = Snapshot(snapshot_id, names, source, template, copies, time.time())
        with self._lock:
            for other in list(self._snapshots.values()):
                if name and name in other.names:
                    rest = tuple(n for n in other.names if n != name)
                    self._snapshots[other.id] = attrs.evolve(other, names=rest)
            self._snapshots[snapshot_id] = snapshot
        return snapshot

    def get(self, snapshot_id: str) -> Snapshot | None:
        """The snapshot with that ID, if any."""
        with self._lock:
            return self._snapshots.get(snapshot_id)

    def select(self, *, source: str | None = None, name: str | None = None) -> list[Snapshot]:
        """The snapshots of sandbox ``source`` and known as ``name`` (either ``None``: any),
        oldest first."""
        with self._lock:
            found = list(self._snapshots.values())
        found = [s for s in found if source is None or s.source == source]
        found = [s for s in found if name is None or s.known_as(name)]
        return sorted(found, key=lambda s: (s.taken_at, s.id))

    def delete(self, snapshot_id: str) -> bool:
        """Remove the snapshot and its files; ``False`` if there is none with that ID."""
        with self._lock:
            snapshot = self._snapshots.pop(snapshot_id, None)
        if snapshot is None:
            return False
        remove_tree(os.path.join(self._root, snapshot_id))
        return True


def copy_places(
    source: Mapping[str, str],
    target: Mapping[str, str],
    owner: Callable[[int], int] = lambda uid: uid,
) -> None:
    """Copy each place's files (by path in the sandbox) from ``source`` into ``target``.

    Modes, times, extended attributes and symlinks are kept, and owners where the
    service may set them (it runs as root), each host uid (and gid) turned into
    ``owner(uid)`` (the target sandbox's own); sockets, pipes and devices are left out.
    ``OSError`` when something cannot be read or written.
    """
    for inside, host in source.items():
        destination = target.get(inside)
        if destination is None or not os.path.isdir(host):
            continue
        try:
            shutil.copytree(host, destination, symlinks=True, dirs_exist_ok=True, ignore=_special)
        except shutil.Error as e:
            raise OSError(f"the sandbox's files could not be copied: {e.args[0][0][2]}") from None
        if os.geteuid() == 0:
            _copy_owners(host, destination, owner)


def _special(directory: str, names: Iterable[str]) -> list[str]:
    """The entries of ``directory`` that are neither files, directories nor symlinks."""
    left_out = []
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            left_out.append(name)
    return left_out


def _copy_owners(source: str, target: str, owner: Callable[[int], int]) -> None:
    """Give every copied entry under ``target`` the owner of its original under ``source``."""
    for directory, dirs, files in os.walk(source):
        for name in ["", *dirs, *files]:
            original = os.path.join(directory, name) if name else directory
            copy = os.path.join(target, os.path.relpath(original, source))
            if os.path.lexists(copy):
                info = os.lstat(original)
                os.lchown(copy, owner(info.st_uid), owner(info.st_gid))
