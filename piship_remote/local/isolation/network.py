"""Egress for a local sandbox: slirp4netns, a user-mode network stack in its own namespace.

A sandbox always has a network namespace of its own. With network allowed,
slirp4netns attaches a ``tap0`` to it (10.0.2.100/24, default route via
10.0.2.2, DNS at 10.0.2.3) and forwards its connections from user space, with
connections to the host's loopback refused (``--disable-host-loopback``). The
host's abstract Unix sockets and other sandboxes live in other namespaces, so
they are out of reach too::

    problem = egress_problem()               # None when slirp4netns is installed
    stack = UserModeNetwork.attach(pid)      # pid: a process inside the namespace
    stack.close()
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess

__all__ = ["DNS_SERVER", "SLIRP_HINT", "UserModeNetwork", "egress_problem"]

DNS_SERVER = "10.0.2.3"
SLIRP_HINT = "install slirp4netns (Debian/Ubuntu: apt-get install slirp4netns)"
READY_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0


def find_slirp4netns() -> str | None:
    """The slirp4netns binary on PATH (or in /usr/bin), if any."""
    return shutil.which("slirp4netns") or shutil.which("slirp4netns", path="/usr/bin:/bin")


def egress_problem() -> str | None:
    """Why a sandbox cannot be given network egress here, or ``None`` when it can."""
    if find_slirp4netns() is None:
        return f"network access needs a user-mode network stack (slirp4netns); {SLIRP_HINT}"
    return None


def _target(pid: int) -> list[str]:
    """How slirp4netns finds the namespace of ``pid``.

    bubblewrap run by root makes the network namespace as root, outside the
    sandbox's user namespace, so slirp4netns joins only that (by path). Run
    unprivileged, the namespace belongs to the sandbox's user namespace, which
    slirp4netns joins first when given the pid.
    """
    if os.geteuid() == 0:
        return ["--netns-type=path", f"/proc/{pid}/ns/net"]
    return [str(pid)]


class UserModeNetwork:
    """A running slirp4netns serving one sandbox's network namespace."""

    def __init__(self, popen: subprocess.Popen[bytes], exit_write: int) -> None:
        self._popen = popen
        self._exit_write = exit_write

    @classmethod
    def attach(cls, pid: int) -> UserModeNetwork:
        """Start slirp4netns for the namespaces of ``pid`` and wait until ``tap0`` is up.

        It exits when the service closes its exit pipe, or dies with the service.
        ``OSError`` when it cannot be started or does not come up.
        """
        binary = find_slirp4netns()
        if binary is None:
            raise OSError(f"slirp4netns is missing; {SLIRP_HINT}")
        ready_read, ready_write = os.pipe()
        exit_read, exit_write = os.pipe()
        argv = [binary, "--configure", "--mtu=65520", "--disable-host-loopback"]
        argv += ["--enable-sandbox", "--enable-seccomp"]
        argv += [f"--ready-fd={ready_write}", f"--exit-fd={exit_read}", *_target(pid), "tap0"]
        try:
            popen = subprocess.Popen(
                argv,
                env={},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(ready_write, exit_read),
                start_new_session=True,
            )
        except OSError:
            for fd in (ready_read, ready_write, exit_read, exit_write):
                os.close(fd)
            raise
        os.close(ready_write)
        os.close(exit_read)
        stack = cls(popen, exit_write)
        try:
            ready, _, _ = select.select([ready_read], [], [], READY_TIMEOUT)
            if not ready or not os.read(ready_read, 1):
                raise OSError(f"slirp4netns did not bring the network up: {stack._failure()}")
        except BaseException:
            stack.close()
            raise
        finally:
            os.close(ready_read)
        return stack

    def close(self) -> None:
        """Stop the stack and reap it; idempotent."""
        if self._exit_write >= 0:
            os.close(self._exit_write)
            self._exit_write = -1
        try:
            self._popen.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait(STOP_TIMEOUT)
        if self._popen.stderr is not None:
            self._popen.stderr.close()

    def _failure(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(0.5)
        if self._popen.poll() is None:
            return "no answer in time"
        assert self._popen.stderr is not None
        lines = self._popen.stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else f"exit status {self._popen.returncode}"
