"""The host's Python, run inside a sandbox made from an image that may have none.

The sandbox agent is a Python script run by the host's ``/usr/bin/python3``. In a
sandbox of an image template the host's ``/usr`` (and ``/lib*``) is bound read-only
at the private path :data:`HOST_ROOT`, and the agent runs through the host's
dynamic loader from there, with the host's library directories, so neither the
image's loader nor its libraries (nor its Python, if any) are used; what the agent
starts is the image's::

    argv = agent_argv("/usr/bin/python3", AGENT_PATH, "5")
    # ['/run/piship/host/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2', '--library-path',
    #  '…', '/run/piship/host/usr/bin/python3', '-I', '-S', '/run/piship/agent.py', '5']
"""

from __future__ import annotations

import os
import struct
import sys

__all__ = [
    "HOST_ROOT",
    "SYSTEM_DIRS",
    "agent_argv",
    "find_python",
    "host_view_options",
    "python_prefix",
]

HOST_ROOT = "/run/piship/host"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_PT_INTERP = 3
_ELF_HEADER = 64


def host_view_options() -> list[str]:
    """bwrap options binding the host's ``/usr`` and ``/lib*`` read-only under :data:`HOST_ROOT`."""
    options: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            options += ["--symlink", os.readlink(path), HOST_ROOT + path]
        elif os.path.isdir(path):
            options += ["--ro-bind", path, HOST_ROOT + path]
    return options


def agent_argv(python: str, agent: str, *args: str) -> list[str]:
    """How to run ``python agent args`` from the host view; ``OSError`` when it cannot be."""
    real = os.path.realpath(python)
    if not _on_system_dirs(real):
        raise OSError(
            f"an image template's sandbox runs the agent with the host's Python from /usr;"
            f" {python} is elsewhere (install python3 in /usr)"
        )
    loader = os.path.realpath(_interpreter(real))
    if not _on_system_dirs(loader):
        raise OSError(f"the host Python's dynamic loader {loader} is not under /usr or /lib")
    libraries = [os.path.dirname(loader), "/usr/lib", "/lib"]
    library_path = ":".join(HOST_ROOT + path for path in libraries)
    python_argv = [HOST_ROOT + real, "-I", "-S", agent, *args]
    return [HOST_ROOT + loader, "--library-path", library_path, *python_argv]


def _on_system_dirs(path: str) -> bool:
    return any(path.startswith(d + "/") for d in SYSTEM_DIRS)


def _interpreter(binary: str) -> str:
    """The ELF program interpreter (dynamic loader) ``binary`` names (64-bit little-endian)."""
    with open(binary, "rb") as elf:
        header = elf.read(_ELF_HEADER)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            raise OSError(f"{binary} is not a 64-bit little-endian ELF program")
        (phoff,) = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        for index in range(phnum):
            elf.seek(phoff + index * phentsize)
            kind, _, offset, _, _, size = struct.unpack("<IIQQQQ", elf.read(40))
            if kind == _PT_INTERP:
                elf.seek(offset)
                return elf.read(size).rstrip(b"\0").decode()
    raise OSError(f"{binary} names no dynamic loader")


def find_python() -> str:
    """The Python that runs the agent: the system's ``/usr/bin/python3``, else this one."""
    for candidate in ("/usr/bin/python3", "/bin/python3"):
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return sys.executable


def python_prefix(python: str) -> str | None:
    """The installation directory to make visible for ``python``; ``None`` if under ``/usr``."""
    if any(python.startswith(d + "/") for d in SYSTEM_DIRS):
        return None
    return os.path.realpath(sys.base_prefix)
