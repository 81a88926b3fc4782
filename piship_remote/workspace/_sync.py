"""Workspace sync: push the host workspace into the sandbox, pull back what changed there.

    sync = WorkspaceSync(archives, workspace="/src/project", read_deny=..., write_allow=...)
    pushed = sync.push()        # streamed archives; denied/ignored/escaping paths listed
    ...                          # commands change files in the sandbox
    pulled = sync.pull(timeout=60)  # only files changed since the push, where writes are allowed

A push streams the workspace walk into archives of bounded size, each unpacked
while the next is sent, and records a stamp file in the sandbox after the last
unpack, so a pull asks the sandbox for the regular files newer than it (``find
-newer``): files the push wrote keep their host modification times and are not
sent back unless a command changed them. Without a push, a pull brings
everything. Everything a pull receives goes through the archive unpacker, which
refuses anything that would land outside the workspace or where the policy does
not allow writes.

The two directions mirror each other: what the workspace's ``.gitignore`` files
ignore is neither pushed nor pulled (listed as ``"ignored"``). A push also leaves
well-known secret files at home (``.env``, private keys, cloud credential folders;
listed as ``"secret file"``/``"secret folder"``) unless ``send_secrets`` names them.
``pull(delete=True)`` deletes a host file only when the sandbox's listing names it
exactly; one whose name it cannot (not UTF-8) is kept and listed as ``"name not exact"``.

Both take ``timeout`` and ``cancel`` and are stopped by dispose, as every file operation
is (:class:`~piship_remote.workspace._file_calls.FileCalls`).
"""

from __future__ import annotations

import os
import posixpath
import secrets
import threading
from collections.abc import Iterable, Iterator, Sequence

import attrs

from piship_remote.backends._sandbox_commands import (
    LISTING_END,
    STAGING_PREFIX,
    list_files_command,
    pack_changed_command,
    stamp_command,
)
from piship_remote.model.errors import (
    ConfigInvalid,
    SandboxUnavailable,
)
from piship_remote.model.transfer import SkippedPath, TransferSummary
from piship_remote.workspace._file_calls import FileCall
from piship_remote.workspace._host_writes import host_write_error
from piship_remote.workspace._remote_archives import RemoteArchives
from piship_remote.workspace._tree import IgnoreRules, TreeEntry, TreeWalk, inside
from piship_remote.workspace._unpack import Exclude

__all__ = ["SYNC_MODES", "SyncRecord", "WorkspaceSync"]

SYNC_MODES = ("none", "push", "push-pull")
STAMP_DIRECTORY = "/tmp"


@attrs.frozen
class SyncRecord:
    """What sync did, for the workspace report: the last push and pull summaries."""

    mode: str
    pushed: TransferSummary | None = None
    pulled: TransferSummary | None = None


class WorkspaceSync:
    """Push and pull between one host workspace and one sandbox's working directory."""

    def __init__(
        self,
        archives: RemoteArchives,
        *,
        workspace: str | os.PathLike[str],
        read_deny: Sequence[str] = (),
        write_allow: Sequence[str] = (),
        use_gitignore: bool = True,
        send_secrets: Sequence[str] = (),
        mode: str = "push",
    ) -> None:
        if mode not in SYNC_MODES:
            raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, not {mode!r}")
        self._files = archives
        self._root = os.path.realpath(workspace)
        self._read_deny = tuple(read_deny)
        self._write_allow = tuple(write_allow)
        self._use_gitignore = use_gitignore
        self._send_secrets = tuple(send_secrets)
        self._stamp = posixpath.join(
            STAMP_DIRECTORY, f"{STAGING_PREFIX}sync-{secrets.token_hex(8)}"
        )
        self._pushed_files: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._record = SyncRecord(mode)

    @property
    def record(self) -> SyncRecord:
        with self._lock:
            return self._record

    @property
    def mode(self) -> str:
        return self._record.mode

    def push(
        self,
        paths: Iterable[str | os.PathLike[str]] | None = None,
        *,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> TransferSummary:
        """Send the workspace (or ``paths`` inside it) as streamed archives, the first going
        out while the walk goes on."""
        with self._files.calls.begin(timeout, cancel) as call:
            return self._push(paths, call)

    def _push(
        self, paths: Iterable[str | os.PathLike[str]] | None, call: FileCall
    ) -> TransferSummary:
        starts = None if paths is None else [self._host_path(path) for path in paths]
        walk = TreeWalk(
            self._root,
            read_deny=self._read_deny,
            paths=starts,
            use_gitignore=self._use_gitignore,
            skip_secrets=True,
            send_secrets=self._send_secrets,
        )
        pushed: set[str] = set()
        self._files.upload_walk(
            _noting_files(walk, pushed),
            self._files.working_directory(call),
            call,
            then=stamp_command(self._stamp),
        )
        summary = walk.summary()
        with self._lock:
            self._pushed_files = self._pushed_files | pushed
            self._record = attrs.evolve(self._record, pushed=summary)
        return summary

    def pull(
        self,
        paths: Iterable[str | os.PathLike[str]] | None = None,
        *,
        delete: bool = False,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> TransferSummary:
        """Bring back the files changed in the sandbox since the last push, less what the
        workspace's ``.gitignore`` files ignore."""
        with self._files.calls.begin(timeout, cancel) as call:
            return self._pull(paths, delete, call)

    def _pull(
        self, paths: Iterable[str | os.PathLike[str]] | None, delete: bool, call: FileCall
    ) -> TransferSummary:
        relative = ["."] if paths is None else [self._relative(path) for path in paths]
        root = self._files.working_directory(call)
        archive = posixpath.join(
            STAMP_DIRECTORY, f"{STAGING_PREFIX}pull-{secrets.token_hex(8)}.tar"
        )
        newer = self._stamp if self._stamp_exists() else None
        summary = self._files.download_archive(
            pack_changed_command(root, relative, archive, newer_than=newer),
            archive,
            self._root,
            call,
            exclude=self._ignored() if self._use_gitignore else None,
        )
        if delete:
            summary = summary + self._delete_vanished(root, call)
        with self._lock:
            self._record = attrs.evolve(self._record, pulled=summary)
        return summary

    def _ignored(self) -> Exclude:
        """What a push would leave out as ignored, as the pull's exclusion (the host's
        ``.gitignore`` files as they are now)."""
        rules = IgnoreRules(self._root)

        def exclude(relative: str, is_dir: bool) -> str | None:
            return "ignored" if rules.excludes(relative, is_dir=is_dir) else None

        return exclude

    def _stamp_exists(self) -> bool:
        return self._record.pushed is not None

    def _delete_vanished(self, root: str, call: FileCall) -> TransferSummary:
        present = self._present(root, call)
        deleted: list[SkippedPath] = []
        with self._lock:
            vanished = sorted(self._pushed_files - present)
        for relative in vanished:
            host = os.path.join(self._root, *relative.split("/"))
            if not _exact(relative):
                deleted.append(SkippedPath(relative, "name not exact"))
                continue
            if not self._may_delete(host):
                deleted.append(SkippedPath(relative, "write not allowed"))
                continue
            try:
                os.unlink(host)
            except FileNotFoundError:
                pass
            except OSError as e:
                raise host_write_error(
                    host,
                    e,
                    "; the pulled files are in place, nothing more was deleted",
                    verb="deleting",
                ) from None
        with self._lock:
            self._pushed_files = self._pushed_files - set(vanished)
        return TransferSummary(skipped=tuple(deleted))

    def _present(self, root: str, call: FileCall) -> set[str]:
        """The regular files in the sandbox's ``root``, relative; a cut listing is refused
        (a file missing from it would be deleted on the host)."""
        listing = self._files.run_checked(
            list_files_command(root), "listing the working directory", call
        )
        names, _, end = listing.rpartition("\0")
        if end != LISTING_END:
            raise SandboxUnavailable(
                "listing the working directory in the sandbox gave a cut answer; nothing was"
                " deleted on this host",
                user_action="pull without delete=True",
                component="files",
            )
        return {name[2:] for name in names.split("\0") if name.startswith("./")}

    def _may_delete(self, host: str) -> bool:
        parent = os.path.realpath(os.path.dirname(host))
        allowed = not self._write_allow or any(inside(parent, place) for place in self._write_allow)
        return allowed and inside(parent, self._root) and not os.path.islink(host)

    def _host_path(self, path: str | os.PathLike[str]) -> str:
        absolute = os.path.realpath(os.path.join(self._root, path))
        if not inside(absolute, self._root):
            raise ConfigInvalid(
                f"{os.fspath(path)} is outside the workspace {self._root}",
                user_action="push paths inside the workspace only",
                component="files",
            )
        return absolute

    def _relative(self, path: str | os.PathLike[str]) -> str:
        absolute = self._host_path(path)
        relative = os.path.relpath(absolute, self._root).replace(os.sep, "/")
        return relative


def _exact(relative: str) -> bool:
    """Whether the sandbox's listing (UTF-8, undecodable bytes replaced) shows this name
    exactly: a name that is not UTF-8 (surrogates here) or holds U+FFFD may be there under
    a different spelling."""
    return "\ufffd" not in relative and not any("\udc80" <= c <= "\udcff" for c in relative)


def _noting_files(entries: Iterable[TreeEntry], files: set[str]) -> Iterator[TreeEntry]:
    """``entries``, with the relative path of each file added to ``files`` on the way."""
    for entry in entries:
        if entry.kind == "file":
            files.add(entry.relative)
        yield entry
