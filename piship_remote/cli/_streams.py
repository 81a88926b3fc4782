"""The CLI's own standard streams: the input ``run`` passes on, and a reader gone away.

``run`` gives the remote command this process's standard input when it is not a
terminal (``echo hi | piship-remote run -- cat``), read as it comes and closed
at its end. A closed output pipe (``... | head -c 10``) ends the CLI quietly,
with the status a shell shows for ``cat`` there: 141 (128 + SIGPIPE).
"""

from __future__ import annotations

import argparse
import functools
import os
import select
import signal
import stat
import sys
from collections.abc import Iterable

from piship_remote.model.errors import ConfigInvalid

__all__ = ["EXIT_BROKEN_PIPE", "INPUT_CHUNK", "command_input", "silence_stdout"]

EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
INPUT_CHUNK = 64 * 1024


def command_input(args: argparse.Namespace) -> Iterable[bytes] | None:
    """The chunks of standard input for the remote command, or ``None`` to pass none.

    None for a terminal, ``/dev/null``, with ``--no-stdin``, and where nothing can be read. On
    Kubernetes (whose router cannot pass input) input that is already waiting is
    refused with ``CONFIG_INVALID``; an empty or silent one is left alone. With
    ``--runtime sandboxd`` it is passed, as on E2B.
    """
    fd = _stdin_fd()
    if fd is None or args.no_stdin or os.isatty(fd) or _is_devnull(fd):
        return None
    if args.backend == "kubernetes" and getattr(args, "runtime", "auto") != "sandboxd":
        _refuse_waiting_input(fd)
        return None
    return iter(functools.partial(os.read, fd, INPUT_CHUNK), b"")


def _stdin_fd() -> int | None:
    stream = sys.stdin
    if stream is None:
        return None
    try:
        return stream.fileno()
    except (OSError, ValueError):  # closed, or replaced by an object without a descriptor
        return None


def _is_devnull(fd: int) -> bool:
    """``< /dev/null``: nothing to pass, so the command starts without an input pipe."""
    try:
        given, devnull = os.fstat(fd), os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(given.st_mode) and given.st_rdev == devnull.st_rdev


def _refuse_waiting_input(fd: int) -> None:
    readable, _, _ = select.select([fd], [], [], 0)
    if readable and os.read(fd, 1):
        raise ConfigInvalid(
            "the kubernetes backend cannot pass standard input to the command",
            user_action="Copy the input into the sandbox and redirect it ('cmd < file'),"
            " or run with --no-stdin (or < /dev/null) to pass none",
        )


def silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush into a closed pipe
    raises nothing (what Python's documentation advises after ``BrokenPipeError``)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass  # no descriptor to replace: nothing is flushed into the pipe at exit
