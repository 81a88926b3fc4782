"""A prepared Kubernetes sandbox: one claim manager, the router, its commands and files."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from piship_remote.backends._common import (
    SandboxErrors,
)
from piship_remote.backends.base import (
    BackendResult,
    ExecRequest,
    OutputCallback,
    RemoteFiles,
)
from piship_remote.backends.kubernetes._attach import KeptClaims
from piship_remote.backends.kubernetes._files import RuntimeFiles
from piship_remote.backends.kubernetes._jobs import DetachedJobs
from piship_remote.backends.kubernetes._router import Retire, Router, runtime_command
from piship_remote.backends.kubernetes.claims import (
    Claim,
    ClaimManager,
    ClaimUse,
    disposed_error,
)
from piship_remote.model.errors import (
    CommandCancelled,
    ConfigInvalid,
)
from piship_remote.transport._cancel import EventWatcher, bridge
from piship_remote.transport.deadline import Deadline

__all__ = ["KubernetesInstance"]

_T = TypeVar("_T")


class KubernetesInstance:
    """A prepared Kubernetes sandbox: commands share and renew one claim at a time."""

    cancels_promptly = True
    controls_commands = False

    def __init__(
        self,
        router: Router,
        manager: ClaimManager,
        workdir: str | None,
        on_disposed: Callable[[KubernetesInstance], None],
        files: Callable[[KubernetesInstance], RuntimeFiles] | None = None,
        jobs: DetachedJobs | None = None,
        claims: KeptClaims | None = None,
    ) -> None:
        self._router = router
        self._jobs = jobs
        self._manager = manager
        self._claims = claims
        self._workdir = workdir
        self._on_disposed = on_disposed
        self._watcher = EventWatcher()  # a plain Event's cancel, polled on first use
        self._files = files(self) if files is not None else None

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> BackendResult:
        """Run one command through the router (told what is left of ``deadline``).

        Direct: stdout then stderr arrive once, at the end; ``CommandCancelled`` when
        ``cancel`` is set retires the claim (the runtime cannot stop the command).
        Detached: output arrives as it grows; cancelling kills the command's process
        group and keeps the claim. ``PiShipError`` otherwise.
        """
        if request.takes_input:
            raise ConfigInvalid(
                "the agent-sandbox router cannot pass standard input to a command",
                user_action="Copy the input into the sandbox and redirect it"
                " ('cmd < file'), or use an E2B-compatible backend",
            )
        if request.pty is not None:
            raise ConfigInvalid(
                "the agent-sandbox router cannot give a command a terminal",
                user_action="Run it without a terminal, or use an E2B-compatible backend",
            )
        command = runtime_command(request, self._workdir)
        jobs = self._jobs
        if jobs is not None:
            code = self._in_claim(
                cancel,
                lambda use: jobs.run(use.claim, command, use.cancel, on_stdout, on_stderr),
                retire_on_cancel=False,
            )
            return BackendResult(exit_code=code)
        answer = self._in_claim(
            cancel,
            lambda use: self._router.execute(
                use.claim,
                command,
                use.cancel,
                deadline,
            ),
            retire_on_cancel=True,
            direct=True,
        )
        if answer.stdout and on_stdout is not None:
            on_stdout(answer.stdout.encode())
        if answer.stderr and on_stderr is not None:
            on_stderr(answer.stderr.encode())
        return BackendResult(exit_code=answer.exit_code)

    def _in_claim(
        self,
        cancel: threading.Event | None,
        run: Callable[[ClaimUse], _T],
        *,
        retire_on_cancel: bool,
        direct: bool = False,
    ) -> _T:
        """``run`` inside one use of the claim; a cancelled direct command retires the claim
        (the runtime cannot stop it), a detached one is killed and keeps it.

        ``direct``: the claim may go unchecked within the existence window, so a command
        the router could not deliver runs once more in a new claim when the API says the
        old one is gone.
        """
        with bridge(cancel, self._watcher) as user:
            if user.is_set():
                raise CommandCancelled()
            if self._manager.disposed:
                raise disposed_error()
            replay = direct
            while True:
                with self._manager.command(user, direct=direct) as use:
                    try:
                        return run(use)
                    except CommandCancelled:
                        if retire_on_cancel:
                            use.retire()
                        if not user.is_set() and self._manager.disposed:
                            raise disposed_error() from None
                        raise
                    except Retire as outcome:
                        if replay and outcome.unreached and use.exists() is False:
                            replay = False  # the claim is gone and retired: run it once more
                            continue
                        use.retire(gone=outcome.gone)
                        raise outcome.error from None

    def epoch(self) -> str | None:
        """The claim name the latest command ran in (``None`` before the first)."""
        return self._manager.epoch()

    def claim(self) -> Claim:
        """The claim the next command runs in (renewed or replaced first, as for a
        command), with what its Sandbox said when it became ready (``sandbox``,
        ``pod_ip``, ``uid``, ``service_fqdn``, ``node_name``)."""
        with self.claimed(None) as use:
            return use.claim

    def files(self) -> RemoteFiles:
        """The sandbox's files, through the runtime's file endpoints and helper commands."""
        if self._files is None:
            raise disposed_error()
        return self._files

    @contextmanager
    def claimed(
        self, cancel: threading.Event | None, *, direct: bool = False
    ) -> Iterator[ClaimUse]:
        """The current claim for one file call, held (and renewed) like a command's
        (``direct``: unchecked within the existence window, as a direct command's)."""
        with bridge(cancel, self._watcher) as user:
            if user.is_set():
                raise CommandCancelled()
            if self._manager.disposed:
                raise disposed_error()
            with self._manager.command(user, direct=direct) as use:
                try:
                    yield use
                except CommandCancelled:
                    if not user.is_set() and self._manager.disposed:
                        raise disposed_error() from None
                    raise

    def dispose(self) -> None:
        """Delete the claim and create none later; commands in flight end at once."""
        self._manager.dispose()
        self._watcher.close()
        self._on_disposed(self)

    def detach(self) -> str:
        """Stop renewing and let go of the current claim without deleting it; its name.

        Any earlier claim this sandbox replaced is still deleted.
        """
        name = self._manager.epoch()
        if name is None or self._claims is None:
            raise SandboxErrors()("the sandbox has no claim to detach from")
        self._claims.keep(name)
        self.dispose()
        return name
