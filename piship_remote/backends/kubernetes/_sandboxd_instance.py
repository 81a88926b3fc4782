"""A prepared Kubernetes sandbox whose claims run sandboxd: commands through its
``ProcessService`` (live output, stdin, a terminal, a kill that keeps the claim), files
through its REST surface; the claims are managed as for the router's runtime::

    instance = SandboxdInstance(router, manager, workdir, on_disposed, links, errors, claims)
    instance.exec(ExecRequest("make test", "/ws"), on_stdout=print_chunk, cancel=stop)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from piship_remote.backends._common import SandboxErrors, remote_directory
from piship_remote.backends.base import BackendResult, ExecRequest, OutputCallback, RemoteFiles
from piship_remote.backends.kubernetes._attach import KeptClaims
from piship_remote.backends.kubernetes._instance import KubernetesInstance
from piship_remote.backends.kubernetes._router import Router
from piship_remote.backends.kubernetes._sandboxd_files import SandboxdFiles, SandboxdUse
from piship_remote.backends.kubernetes._sandboxd_link import SandboxdLinks
from piship_remote.backends.kubernetes.claims import ClaimManager, disposed_error
from piship_remote.transport.deadline import Deadline

__all__ = ["SandboxdInstance"]


class SandboxdInstance(KubernetesInstance):
    """A Kubernetes sandbox on sandboxd: its commands can be fed, sized and killed."""

    cancels_promptly = True
    controls_commands = True

    def __init__(
        self,
        router: Router,
        manager: ClaimManager,
        workdir: str | None,
        on_disposed: Callable[[KubernetesInstance], None],
        links: SandboxdLinks,
        errors: SandboxErrors,
        claims: KeptClaims | None = None,
    ) -> None:
        super().__init__(router, manager, workdir, on_disposed, None, None, claims)
        self._links = links
        self._sandboxd_files = SandboxdFiles(errors, workdir=workdir, claimed=self.sandboxd_use)

    def exec(
        self,
        request: ExecRequest,
        *,
        on_stdout: OutputCallback | None = None,
        on_stderr: OutputCallback | None = None,
        cancel: threading.Event | None = None,
        deadline: Deadline | None = None,
    ) -> BackendResult:
        """Run one command through sandboxd, its output as it comes. A cancel (the
        caller's, the deadline's, Ctrl-C) kills its process group: ``CommandCancelled``,
        and the claim keeps serving."""
        cwd = remote_directory(self._workdir, request.workspace_path)

        with self.sandboxd_use(cancel, direct=True) as use:
            return use.link.processes.run(request, cwd, use.cancel, on_stdout, on_stderr)

    def files(self) -> RemoteFiles:
        """The sandbox's files, through sandboxd's REST surface and helper commands."""
        if self._manager.disposed:
            raise disposed_error()
        return self._sandboxd_files

    @contextmanager
    def sandboxd_use(
        self, cancel: threading.Event | None, *, direct: bool = False
    ) -> Iterator[SandboxdUse]:
        """The current claim's sandboxd for one call, the claim held (and renewed) meanwhile."""
        with self.claimed(cancel, direct=direct) as use:
            yield SandboxdUse(self._links.to(use.claim), use.cancel)

    def dispose(self) -> None:
        super().dispose()  # running commands are cancelled (and killed) first
        self._links.close()
