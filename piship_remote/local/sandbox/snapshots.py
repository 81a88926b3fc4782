"""Snapshots and forks of local sandboxes: copies of their files, made by their agents.

A copy holds a sandbox's writable places (its home, ``/tmp``, ``/dev/shm`` and root's
home) and what it changed of its root filesystem (the upper layer of its image's overlay,
which its agent reads at :data:`~piship_remote.local.isolation.bubblewrap.LAYER_PATH`, or
its ``/`` itself; deletions kept), as its agent exports them while it runs: a tar stream
written inside the sandbox, as the sandbox's root where it has one (else its user), sparse
files kept sparse (see :mod:`piship_remote.local.isolation.agent_copies`). The host never
opens a path of a sandbox: it moves bytes. A snapshot's stream goes into one file of the
service's own (counted against the service-wide snapshot disk budget), with the template
it was made from; a sandbox created from it gets the stream unpacked by its own agent. A
fork pipes the source's export straight into the new sandbox's import; its disk cap bounds
it. Memory is not kept: what ran in the source does not run in the copy. Snapshots live
under the service directory and go with it::

    store = SnapshotStore(os.path.join(root, "snapshots"), budget=4 * 2**30)
    snapshot = store.take(exporter(sandbox), places=copied_places(sandbox), template="base",
                          source=sandbox.id, name="app")
    unpack(snapshot, new_sandbox)                 # the new sandbox's agent unpacks it
    fork_files(sandbox, new_sandbox)              # export piped into import
    store.delete(snapshot.id)
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import threading
import time
from collections.abc import Callable, Sequence

import attrs

from piship_remote.local.isolation.agent_link import FilesFailed, files_answer
from piship_remote.local.sandbox.env import remove_tree
from piship_remote.local.sandbox.instance import Sandbox
from piship_remote.local.sandbox.pause import Paused

__all__ = [
    "COPY_TIMEOUT",
    "DEFAULT_SNAPSHOT_BUDGET",
    "MAX_SNAPSHOTS",
    "CopyFailed",
    "Snapshot",
    "SnapshotBudgetExceeded",
    "SnapshotStore",
    "SnapshotWriter",
    "TooManySnapshots",
    "copied_places",
    "exporter",
    "fork_files",
    "unpack",
]

MAX_SNAPSHOTS = 100
DEFAULT_SNAPSHOT_BUDGET = 4 * 1024**3
COPY_TIMEOUT = 600.0
PIECE = 1024 * 1024
ARCHIVE = "files.tar"
ROOT = "/"


class TooManySnapshots(Exception):
    """The service keeps at most :data:`MAX_SNAPSHOTS` snapshots; delete one first."""


class SnapshotBudgetExceeded(Exception):
    """The snapshots together would take more host disk than the service's budget."""


class CopyFailed(Exception):
    """A sandbox's files could not be exported or imported (the message says why, in the
    sandbox's own paths)."""


@attrs.frozen
class Snapshot:
    """One snapshot: its ID, names, the sandbox and template it came from, and its files."""

    id: str
    names: tuple[str, ...]
    source: str
    template: str
    places: tuple[str, ...]
    """The places it holds, by their paths in the sandbox."""
    archive: str
    """The host file holding the export (the service's own)."""
    size: int
    taken_at: float

    def known_as(self, name: str) -> bool:
        """Whether ``name`` (its ID, or a name, optionally ``team/`` or ``:tag`` qualified)."""
        bare = name.rpartition("/")[2].partition(":")[0]
        return name == self.id or name in self.names or bare in self.names


class SnapshotWriter:
    """Where a snapshot's bytes go: its file, each piece counted against the budget first."""

    def __init__(self, fd: int, reserve: Callable[[int], None]) -> None:
        self._fd = fd
        self._reserve = reserve
        self.written = 0

    def write(self, data: bytes) -> None:
        """Append ``data``; :class:`SnapshotBudgetExceeded` (nothing written) past the budget."""
        self._reserve(len(data))
        self.written += len(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]


Export = Callable[[SnapshotWriter], None]


class SnapshotStore:
    """The snapshots of one service, each a directory under ``root``, together at most
    ``budget`` bytes of host disk."""

    def __init__(
        self, root: str, limit: int = MAX_SNAPSHOTS, budget: int = DEFAULT_SNAPSHOT_BUDGET
    ) -> None:
        self._root = root
        self._limit = limit
        self.budget = budget
        self._lock = threading.Lock()
        self._snapshots: dict[str, Snapshot] = {}
        self._used = 0  # bytes of the snapshots kept and of those being taken

    def take(
        self,
        export: Export,
        *,
        places: Sequence[str],
        template: str,
        source: str,
        name: str | None,
    ) -> Snapshot:
        """A new snapshot of what ``export`` writes (the ``places`` of sandbox ``source``).

        A ``name`` already given to a snapshot moves to this one (the old one keeps its ID).
        :class:`TooManySnapshots` at the limit, :class:`SnapshotBudgetExceeded` past the
        budget, what ``export`` raises when the copy fails; nothing is left behind then.
        """
        with self._lock:
            if len(self._snapshots) >= self._limit:
                raise TooManySnapshots(f"the local service keeps at most {self._limit} snapshots")
        snapshot_id = "snapshot-" + secrets.token_hex(8)
        directory = os.path.join(self._root, snapshot_id)
        archive = os.path.join(directory, ARCHIVE)
        os.makedirs(directory, 0o700)
        writer: SnapshotWriter | None = None
        try:
            fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                writer = SnapshotWriter(fd, self._reserve)
                export(writer)
            finally:
                os.close(fd)
        except BaseException:
            self._release(writer.written if writer is not None else 0)
            remove_tree(directory)
            raise
        names = (name,) if name else ()
        size, now = writer.written, time.time()
        snapshot = Snapshot(snapshot_id, names, source, template, tuple(places), archive, size, now)
        with self._lock:
            for other in list(self._snapshots.values()):
                if name and name in other.names:
                    rest = tuple(n for n in other.names if n != name)
                    self._snapshots[other.id] = attrs.evolve(other, names=rest)
            self._snapshots[snapshot_id] = snapshot
        return snapshot

    def _reserve(self, size: int) -> None:
        with self._lock:
            if self._used + size > self.budget:
                raise SnapshotBudgetExceeded(
                    f"the snapshot does not fit the local service's snapshot disk budget of "
                    f"{self.budget // 2**20} MiB (max_snapshot_disk_mib); delete snapshots or "
                    "raise it"
                )
            self._used += size

    def _release(self, size: int) -> None:
        with self._lock:
            self._used -= size

    @property
    def used(self) -> int:
        """The bytes the snapshots take on the host (those being taken included)."""
        with self._lock:
            return self._used

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
        self._release(snapshot.size)
        return True


def exporter(sandbox: Sandbox) -> Export:
    """What writes ``sandbox``'s export into a snapshot: bytes its agent streams out."""

    def export(writer: SnapshotWriter) -> None:
        data_read, data_write = os.pipe()
        reply = _request(sandbox, "export", data_write)
        try:
            with contextlib.closing(_Pipe(data_read)) as pipe:
                while piece := pipe.read():
                    writer.write(piece)
        except BaseException:
            os.close(reply)  # the helper meets a closed pipe and ends
            raise
        _answered(reply)

    return export


def unpack(snapshot: Snapshot, sandbox: Sandbox) -> None:
    """Have ``sandbox``'s agent unpack ``snapshot`` into its places; :class:`CopyFailed`."""
    data_read, data_write = os.pipe()
    reply = _request(sandbox, "import", data_read)
    os.set_blocking(data_write, False)
    try:
        with open(snapshot.archive, "rb") as archive, contextlib.suppress(BrokenPipeError):
            while piece := archive.read(PIECE):
                _write_within(data_write, piece)
    except BaseException:
        os.close(reply)
        raise
    finally:
        os.close(data_write)
    _answered(reply)


def fork_files(source: Sandbox, target: Sandbox) -> None:
    """Pipe ``source``'s export straight into ``target``'s import; :class:`CopyFailed`."""
    data_read, data_write = os.pipe()
    exported = _request(source, "export", data_write)
    try:
        imported = _request(target, "import", data_read)
    except BaseException:
        os.close(exported)
        raise
    failures = []
    for reply in (exported, imported):
        try:
            _answered(reply)
        except CopyFailed as e:
            failures.append(e)
    if failures:
        raise failures[-1]  # the import's reason, where both failed (the export's is a pipe)


def copied_places(sandbox: Sandbox) -> list[str]:
    """What a copy of ``sandbox`` holds, by sandbox path: its root filesystem (what it
    changed of its template) and its places."""
    return [ROOT, *sorted(sandbox.host_dirs)]


def _request(sandbox: Sandbox, call: str, data: int) -> int:
    """Ask ``sandbox``'s agent (as its root, where it has one) for ``call`` on its places."""
    args = {"places": copied_places(sandbox), "layer": sandbox.layer}
    try:
        return sandbox.files(call, args, user=sandbox.root_user, data=data)
    except Paused:
        raise CopyFailed("the sandbox is paused: resume it to copy its files") from None


def _answered(reply: int) -> None:
    """Wait for the helper's answer; :class:`CopyFailed` with its reason."""
    try:
        ready, _, _ = select.select([reply], [], [], COPY_TIMEOUT)
        if not ready:
            raise CopyFailed("the sandbox's files could not be copied: it took too long")
        files_answer(reply, close=False)
    except FilesFailed as e:
        raise CopyFailed(f"the sandbox's files could not be copied: {e.reason}") from None
    except OSError:
        raise CopyFailed("the sandbox's files could not be copied: its agent ended") from None
    finally:
        os.close(reply)


class _Pipe:
    """The read end of a copy's pipe, each read bounded by :data:`COPY_TIMEOUT`."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def read(self) -> bytes:
        ready, _, _ = select.select([self._fd], [], [], COPY_TIMEOUT)
        if not ready:
            raise CopyFailed("the sandbox's files could not be copied: it took too long")
        return os.read(self._fd, PIECE)

    def close(self) -> None:
        os.close(self._fd)


def _write_within(fd: int, data: bytes) -> None:
    """Write ``data`` to the non-blocking ``fd``, each wait bounded by :data:`COPY_TIMEOUT`."""
    view = memoryview(data)
    while view:
        _, writable, _ = select.select([], [fd], [], COPY_TIMEOUT)
        if not writable:
            raise CopyFailed("the sandbox's files could not be copied: it took too long")
        with contextlib.suppress(BlockingIOError):
            view = view[os.write(fd, view) :]
