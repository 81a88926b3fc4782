"""One sandbox's isolated environment, alive for the sandbox's whole life, like an E2B VM.

A :class:`SandboxVm` is one long-lived bubblewrap (its own user, pid, mount,
ipc, uts, cgroup and network namespaces) running the in-sandbox agent, placed in
the sandbox's cgroups, with a user-mode network stack when the network is
allowed. Every command is started by the agent inside it, so background
processes outlive their command and answer later ones on the sandbox's
loopback. Closing it ends every process of the sandbox at once (the pid
namespace's init dies)::

    spawner = Spawner()                            # the thread sandboxes are born on
    vm = SandboxVm.boot(jail, cgroups=group, network=False, spawner=spawner)
    process = vm.start({"cmd": "/bin/bash", "args": ["-c", "id"], "env": {}, "cwd": "/"})
    vm.close()
    spawner.close()

It works unprivileged too: nothing here needs root but the cgroups, the
size-capped home and the service's own uid map (a jail with ``own_map`` or
``root_home``: the sandbox's uids are nobody on the host, see
:mod:`piship_remote.local.isolation.user_map`), which the service only uses where it may.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import TypeVar

from piship_remote.local.isolation.agent_link import AgentLink, dial, send_files
from piship_remote.local.isolation.bubblewrap import (
    Jail,
    find_python,
    options_fd,
    uid_for,
)
from piship_remote.local.isolation.limits import CgroupSet
from piship_remote.local.isolation.mount_sources import OpenProgram, Sources
from piship_remote.local.isolation.mounts import enter_private_namespace
from piship_remote.local.isolation.network import UserModeNetwork
from piship_remote.local.isolation.process import LocalProcess, WindowSize
from piship_remote.local.isolation.user_map import bwrap_options, write_maps

__all__ = ["BOOT_TIMEOUT", "SandboxVm", "Spawner"]

BOOT_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0
# Joins the sandbox's cgroups, then becomes bubblewrap: only paths in its argv.
_JOIN_CGROUPS = (
    'for f; do [ "$f" = -- ] && break; echo $$ > "$f" || exit 125; shift; done; shift; exec "$@"'
)

T = TypeVar("T")
OOM_PROTECTED = "-1000"


class Spawner:
    """A ``piship-local-spawner`` thread that starts sandboxes.

    bubblewrap's ``--die-with-parent`` fires when the *thread* that forked it
    ends, so sandboxes are forked on this thread, which lives as long as the
    service. With ``private_mounts`` (a root service) the thread first enters a mount
    namespace of its own (see :mod:`piship_remote.local.isolation.mounts`), which what it
    runs and every thread it starts share; ``OSError`` if it cannot.
    """

    def __init__(self, *, private_mounts: bool = False) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], object], Future[object]] | None]
        self._jobs = queue.SimpleQueue()
        entered: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._run,
            args=(private_mounts, entered),
            name="piship-local-spawner",
            daemon=True,
        )
        self._thread.start()
        entered.result()
        self._private = private_mounts
        self._closed = False

    def call(self, function: Callable[[], T]) -> T:
        """Run ``function`` on the spawner thread and return what it returns (or raise);
        once the spawner is closed, on the caller's."""
        if self._closed or self._thread is threading.current_thread():
            return function()
        future: Future[object] = Future()
        self._jobs.put((function, future))
        return future.result()  # type: ignore[return-value]

    def view(self, path: str) -> str:
        """``path`` as any thread of this process sees it in the spawner's mount namespace."""
        if not self._private or self._thread.native_id is None:
            return path
        return f"/proc/{os.getpid()}/task/{self._thread.native_id}/root{path}"

    def close(self) -> None:
        """Stop the thread (after the jobs already queued)."""
        self._closed = True
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(STOP_TIMEOUT)

    def _run(self, private_mounts: bool, entered: Future[None]) -> None:
        try:
            if private_mounts:
                enter_private_namespace()
        except OSError as e:
            entered.set_exception(e)
            return
        entered.set_result(None)
        while (job := self._jobs.get()) is not None:
            function, future = job
            try:
                future.set_result(function())
            except BaseException as e:  # handed to the caller
                future.set_exception(e)


class SandboxVm:
    """A running sandbox environment: its bubblewrap, agent link, network stack and cgroups."""

    def __init__(
        self,
        popen: subprocess.Popen[bytes],
        link: AgentLink,
        status: int,
        init_pid: int,
        cgroups: CgroupSet,
        mapping: tuple[int, int] | None = None,
        jail: Jail | None = None,
    ) -> None:
        self._popen = popen
        self._link = link
        self._status = status
        self._mapping = mapping  # bwrap's info fd (read) and userns block fd (write)
        self._jail = jail
        self._init_pid = init_pid
        self.cgroups = cgroups
        self.network: UserModeNetwork | None = None
        self._closed = False

    @classmethod
    def boot(cls, jail: Jail, *, cgroups: CgroupSet, network: bool, spawner: Spawner) -> SandboxVm:
        """Start the sandbox and wait until its agent (and its network) is ready.

        ``OSError`` when it cannot be started; nothing is left running then.
        """
        vm = spawner.call(lambda: cls._spawn(jail, cgroups))
        try:
            vm._await_agent()
            if network:
                vm.network = UserModeNetwork.attach(vm._init_pid)
        except BaseException:
            vm.close()
            raise
        return vm

    @classmethod
    def _spawn(cls, jail: Jail, cgroups: CgroupSet) -> SandboxVm:
        python = find_python()
        service_end, agent_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        status_read, status_write = os.pipe()
        child_ends = [status_write]  # closed here once bubblewrap has them
        mapping: tuple[int, int] | None = None
        sources: Sources | None = None
        programs: list[OpenProgram] = []
        try:
            sources = jail.sources(python)
            options = jail.options(cwd=jail.workdir, env={"PATH": "/usr/bin:/bin"}, sources=sources)
            options += ["--json-status-fd", str(status_write)]
            if jail.maps_users:
                info_read, info_write = os.pipe()
                block_read, block_write = os.pipe()
                mapping = (info_read, block_write)
                child_ends += [info_write, block_read]
                options += bwrap_options(block_read, info_write)
            args = options_fd(options)
            child_ends.append(args)
            program = OpenProgram.open(jail.bwrap)
            programs.append(program)
            agent = jail.agent_command(python, str(agent_end.fileno()))
            argv = ["bwrap", "--args", str(args), "--", *agent]
            run_as = None
            if jail.maps_users:
                assert jail.ids is not None
                run_as = jail.ids.host(uid_for(jail.user))
            executable: str | None = program.executable
            if jail.layer_space is not None:
                argv = jail.layer_space.command([program.executable, *argv[1:]])
                executable = None
            procs = cgroups.procs_files()
            if procs and run_as is None:
                joined = [program.executable, *argv[1:]] if executable is not None else argv
                argv = ["/bin/sh", "-c", _JOIN_CGROUPS, "sh", *procs, "--", *joined]
                executable = None
            popen = subprocess.Popen(
                argv,
                executable=executable,
                env=program.env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(agent_end.fileno(), *child_ends, *sources.fds(), *program.fds()),
                start_new_session=True,
                user=run_as,
                group=run_as,
                extra_groups=None if run_as is None else [],
            )
        except BaseException:
            service_end.close()
            for fd in (status_read, *(mapping or ())):
                os.close(fd)
            raise
        finally:
            agent_end.close()
            if sources is not None:
                sources.close()
            for opened in programs:
                opened.close()
            for fd in child_ends:
                os.close(fd)
        return cls(popen, AgentLink(service_end), status_read, 0, cgroups, mapping, jail)

    def _await_agent(self) -> None:
        """Map the users (with a root), read bubblewrap's child pid, then the agent's ready."""
        if self._mapping is not None:
            self._map_users()
        pid = self._status_pid()
        if pid is None:
            raise OSError(f"the sandbox did not start: {self._failure()}")
        self._init_pid = pid
        control = self._link.socket
        ready, _, _ = select.select([control], [], [], BOOT_TIMEOUT)
        data = control.recv(4096) if ready else b""
        if not data or not json.loads(data).get("ready"):
            raise OSError(f"the sandbox agent did not start: {self._failure()}")
        command_procs = self.cgroups.command_procs()
        if command_procs is not None:
            self._send_fd("cgroup", command_procs)
        if self._jail is not None and self._jail.maps_users:
            self._protect()

    def _send_fd(self, op: str, path: str) -> None:
        """Send the agent ``op`` with host file ``path`` open for writing."""
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            self._link.send({"op": op}, [fd])
        finally:
            os.close(fd)

    def _protect(self) -> None:
        """Make bubblewrap and the agent no OOM victim (a memory-limit kill then hits a
        command), and hand the agent its own ``oom_score_adj`` to start commands killable.

        tmpfs pages have no owning process, so a sandbox whose files fill its memory
        would otherwise lose its largest process: the agent, and with it the sandbox.
        """
        agent = _only_child(self._init_pid)
        try:
            for pid in (agent, self._init_pid, self._popen.pid):
                if pid is not None:
                    _write_oom_score(pid, OOM_PROTECTED)
        except OSError:
            return  # no CAP_SYS_RESOURCE (a container's root): the cgroup split must do
        if agent is not None:
            self._send_fd("protect", f"/proc/{agent}/oom_score_adj")

    def _map_users(self) -> None:
        """Write the two-uid map for bwrap's child (its pid from the info fd), then release it."""
        assert self._mapping is not None
        info, block = self._mapping
        buffer, info_pid = b"", None
        while info_pid is None:
            ready, _, _ = select.select([info], [], [], BOOT_TIMEOUT)
            chunk = os.read(info, 4096) if ready else b""
            if not chunk:
                raise OSError(f"the sandbox did not start: {self._failure()}")
            buffer += chunk
            with contextlib.suppress(ValueError):
                found = json.loads(buffer).get("child-pid")
                info_pid = found if isinstance(found, int) else -1
        if info_pid <= 0:
            raise OSError("the sandbox did not start: bubblewrap reported no child pid")
        jail = self._jail
        assert jail is not None
        assert jail.ids is not None
        with_root = jail.root_home is not None
        write_maps(info_pid, jail.ids, user_uid=uid_for(jail.user), with_root=with_root)
        # bubblewrap runs unprivileged here, so the service puts it in the sandbox's cgroups
        # (both its processes) before letting it go on; what it starts is born in them.
        for pid in (self._popen.pid, info_pid):
            self.cgroups.join(pid)
        os.write(block, b"m")
        self._close_mapping()

    def _close_mapping(self) -> None:
        for fd in self._mapping or ():
            os.close(fd)
        self._mapping = None

    def _status_pid(self) -> int | None:
        buffer = b""
        while b"\n" not in buffer:
            ready, _, _ = select.select([self._status], [], [], BOOT_TIMEOUT)
            chunk = os.read(self._status, 4096) if ready else b""
            if not chunk:
                return None
            buffer += chunk
        for line in buffer.splitlines():
            with contextlib.suppress(ValueError):
                pid = json.loads(line).get("child-pid")
                if isinstance(pid, int):
                    return pid
        return None

    @property
    def init_pid(self) -> int:
        """The host pid of the sandbox's first process (0 before it is known)."""
        return self._init_pid

    def start(
        self,
        spec: Mapping[str, object],
        *,
        tag: str,
        limit_check: Callable[[int], str | None],
        stdin: bool = False,
        size: WindowSize | None = None,
    ) -> LocalProcess:
        """Have the agent start ``spec``; see :meth:`LocalProcess.start`."""
        return LocalProcess.start(
            self._link, spec, tag=tag, limit_check=limit_check, stdin=stdin, size=size
        )

    def dial(self, port: int) -> socket.socket:
        """A socket connected to ``port`` on the sandbox's loopback (see :func:`dial`)."""
        return dial(self._link, port)

    def files(
        self, call: str, args: Mapping[str, object], *, uid: int | None, data: int | None
    ) -> int:
        """Have the agent answer a files request as ``uid``; see :func:`send_files`."""
        return send_files(self._link, call, args, uid=uid, data=data)

    def close(self) -> None:
        """End every process of the sandbox, its network stack and its cgroups; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._link.close()  # the agent exits, and with it the pid namespace
        if self._init_pid > 0:
            with contextlib.suppress(OSError):
                os.kill(self._init_pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            self._popen.kill()
        try:
            self._popen.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        if self._popen.stderr is not None:
            self._popen.stderr.close()
        os.close(self._status)
        self._close_mapping()
        if self.network is not None:
            self.network.close()
        self.cgroups.remove()

    def _failure(self) -> str:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._popen.wait(1.0)
        if self._popen.poll() is None or self._popen.stderr is None:
            return "no answer in time"
        lines = self._popen.stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1][:300] if lines else f"exit status {self._popen.returncode}"


def _only_child(pid: int) -> int | None:
    """The one child of process ``pid`` (bubblewrap's init has one: the agent), if found."""
    with contextlib.suppress(OSError, ValueError):
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as handle:
            children = [int(word) for word in handle.read().split()]
        return children[0] if len(children) == 1 else None
    return None


def _write_oom_score(pid: int, value: str) -> None:
    with open(f"/proc/{pid}/oom_score_adj", "w", encoding="ascii") as handle:
        handle.write(value)
