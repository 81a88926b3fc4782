"""The file side of an active sandbox: ``Sandbox.files``, ``push``, ``pull`` and sync at activation.

    transfers = SandboxTransfers(instance, engine, profile, mode="push-pull", adapter="e2b")
    transfers.push()                     # at activation, after the readiness check
    transfers.files.read_text("out.txt", timeout=10)
    transfers.at_dispose()               # push-pull: pull back before the sandbox goes
    transfers.stop()                     # file operations still running end ("disposed")

Helper commands (tar, find, touch) run through the governed engine like any
command, with an empty environment and bounded output, but without the login shell
(``ExecRequest(login=False)``): a sandbox's startup files cannot replace their tools.
They carry the token and deadline of the file operation they are part of, as its
requests do (:class:`~piship_remote.workspace._file_calls.FileCalls`).
``mode="push-pull"`` pulls at dispose; a failure there is logged (the sandbox is
deleted anyway) and kept in :attr:`SandboxTransfers.dispose_error`, never raised from
``dispose()``.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Iterable

from piship_remote.backends._common import exit_status
from piship_remote.backends.base import ExecRequest, Instance, SupportsFiles
from piship_remote.model.errors import PiShipError, SandboxUnavailable
from piship_remote.model.policy import SandboxProfile
from piship_remote.model.report import (
    SyncedPath,
    WorkspaceReport,
    WorkspaceSyncReport,
    synced_workspace_report,
)
from piship_remote.model.transfer import TransferSummary
from piship_remote.sandbox._exec_engine import ExecEngine
from piship_remote.sandbox._exec_workers import Stream
from piship_remote.sandbox.files import SandboxFiles
from piship_remote.telemetry import Telemetry
from piship_remote.telemetry.names import PULL_SPAN, PUSH_SPAN
from piship_remote.workspace._file_calls import FileCall, FileCalls
from piship_remote.workspace._remote_archives import RemoteArchives
from piship_remote.workspace._sync import SYNC_MODES, WorkspaceSync

__all__ = ["HELPER_OUTPUT_LIMIT", "SYNC_MODES", "SandboxTransfers", "check_sync_mode"]

HELPER_OUTPUT_LIMIT = 16 * 1024 * 1024
_LOG = logging.getLogger("piship_remote")

PathList = Iterable["str | os.PathLike[str]"]


def check_sync_mode(mode: str) -> str:
    """``mode`` if it is a sync mode, else ``ValueError`` naming the choices."""
    if mode not in SYNC_MODES:
        raise ValueError(f"sync must be one of {', '.join(SYNC_MODES)}, not {mode!r}")
    return mode


class SandboxTransfers:
    """Files and workspace sync of one active sandbox."""

    def __init__(
        self,
        instance: Instance,
        engine: ExecEngine,
        profile: SandboxProfile,
        *,
        mode: str = "none",
        use_gitignore: bool = True,
        adapter: str = "remote",
        telemetry: Telemetry | None = None,
    ) -> None:
        self._engine = engine
        self._telemetry = telemetry or Telemetry(adapter)
        self._profile = profile
        self._root = os.path.realpath(profile.workspace)
        self.mode = check_sync_mode(mode)
        if not isinstance(instance, SupportsFiles):
            raise SandboxUnavailable(
                f"the {type(instance).__name__} sandbox cannot move files",
                component="files",
            )
        self._calls = FileCalls(adapter=adapter)
        archives = RemoteArchives(
            instance.files(), self._run_helper, self._calls, write_allow=profile.write_allow
        )
        self.files = SandboxFiles(
            archives,
            workspace=self._root,
            read_deny=profile.read_deny,
            telemetry=self._telemetry,
            sandbox_id=engine.epoch,
        )
        self._sync = WorkspaceSync(
            archives,
            workspace=self._root,
            read_deny=profile.read_deny,
            write_allow=profile.write_allow,
            use_gitignore=use_gitignore,
            send_secrets=profile.read_allow,
            mode="push" if mode == "none" else mode,
        )
        self._lock = threading.Lock()
        self._disposing = False
        self.dispose_error: BaseException | None = None

    def push(
        self,
        paths: PathList | None = None,
        *,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> TransferSummary:
        """Send the workspace (or ``paths`` inside it) into the sandbox, as one archive."""
        push = functools.partial(self._sync.push, paths, timeout=timeout, cancel=cancel)
        return self._telemetry.transfer(PUSH_SPAN, "upload", push, _bytes, self._engine.epoch)

    def pull(
        self,
        paths: PathList | None = None,
        *,
        delete: bool = False,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> TransferSummary:
        """Bring back what changed in the sandbox since the last push."""
        pull = functools.partial(
            self._sync.pull, paths, delete=delete, timeout=timeout, cancel=cancel
        )
        return self._telemetry.transfer(PULL_SPAN, "download", pull, _bytes, self._engine.epoch)

    def workspace_report(self) -> WorkspaceReport | None:
        """The synced workspace report, or ``None`` when sync is off (the snapshot stays)."""
        if self.mode == "none":
            return None
        record = self._sync.record
        pushed = record.pushed or TransferSummary()
        pulled = record.pulled
        return synced_workspace_report(
            WorkspaceSyncReport(
                pushed_files=pushed.files,
                pushed_bytes=pushed.bytes,
                skipped=_synced(pushed),
                results_return=self.mode == "push-pull",
                pulled_files=None if pulled is None else pulled.files,
                pulled_bytes=None if pulled is None else pulled.bytes,
                pull_skipped=None if pulled is None else _synced(pulled),
            )
        )

    def begin_dispose(self) -> bool:
        """``True`` for the first dispose call only."""
        with self._lock:
            first = not self._disposing
            self._disposing = True
        return first

    def at_dispose(self) -> None:
        """With ``push-pull``, pull before the sandbox is deleted; a failure is only logged."""
        if self.mode != "push-pull" or self._sync.record.pushed is None:
            return
        try:
            self._engine.ensure_usable()
        except PiShipError:
            return
        try:
            self._sync.pull()
        except Exception as error:
            self.dispose_error = error
            _LOG.warning("pulling the workspace back at dispose failed: %s", error)

    def stop(self) -> None:
        """End every file operation still running (each raises its "disposed" error) and
        refuse new ones: the sandbox is being disposed."""
        self._calls.dispose()

    def _run_helper(self, command: str, call: FileCall) -> tuple[int, str]:
        output = bytearray()

        def collect(_stream: Stream, chunk: bytes) -> None:
            room = HELPER_OUTPUT_LIMIT - len(output)
            if room > 0:
                output.extend(chunk[:room])

        request = ExecRequest(
            command=command, cwd=self._root, workspace_path=".", env={}, login=False
        )
        result = self._engine.run(request, collect, call.deadline, call.cancel, retire=True)
        return exit_status(result), output.decode("utf-8", "replace")


def _bytes(summary: TransferSummary) -> int:
    return summary.bytes


def _synced(summary: TransferSummary) -> tuple[SyncedPath, ...]:
    return tuple(SyncedPath(path=item.path, reason=item.reason) for item in summary.skipped)
