"""The local service's sandboxes: their environments, files, processes and lifetimes.

A :class:`Registry` creates sandboxes (a :class:`SandboxVm` each, with a private
home, ``/tmp`` and ``/dev/shm`` on a size-capped tmpfs under one service
directory, and cgroups holding its limits), finds them, renews and deletes
them. A ``piship-local-reaper`` thread deletes each sandbox when its lifetime
ends (or pauses one created with ``auto_pause``). Deleting ends every process
of the sandbox and removes its files::

    registry = Registry(root, bwrap=find_bwrap(), workdir="/home/user", user="user",
                        limits=Limits(), enforcement=Enforcement.probe())
    sandbox = registry.create(template="base", lifetime=300, network=False, env_vars={})
    process = sandbox.start(ProcessConfig(cmd="/bin/bash", args=["-c", "id"]), tag="t1")
    registry.pause(sandbox.id); registry.resume(sandbox.id, 300)
    registry.delete(sandbox.id)
    registry.close()

A paused sandbox (its processes frozen, see :mod:`piship_remote.local.sandbox.pause`) is
found by :meth:`Registry.lookup` but not by :meth:`Registry.get`, so envd does not
serve it (unless it was created with ``auto_resume``: ``get`` then resumes it); its
lifetime stops until it is resumed with a new one. A command being started holds a
pause off until it has started, and one started on a paused sandbox is refused.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping

from piship_remote.local.isolation.bubblewrap import DEFAULT_PATH, Jail, find_python, uid_for
from piship_remote.local.isolation.limits import (
    CgroupSet,
    Enforcement,
    Limits,
    limit_check,
    unmount,
)
from piship_remote.local.isolation.network import egress_problem
from piship_remote.local.isolation.process import (
    REAP_TIMEOUT,
    LocalProcess,
    StartFailed,
    WindowSize,
)
from piship_remote.local.isolation.user_map import ROOT_HOME, Identity, SandboxUsers, root_mappable
from piship_remote.local.sandbox.env import BootFailed, SandboxLayout, boot, remove_tree
from piship_remote.local.sandbox.pause import PauseState
from piship_remote.local.sandbox.templates import DEFAULT_TEMPLATE
from piship_remote.local.sandbox.vm import SandboxVm, Spawner
from piship_remote.wire.envd import ProcessConfig
from piship_remote.wire.envd_paths import PathError, resolve

__all__ = [
    "Registry",
    "Sandbox",
    "SandboxGone",
    "SandboxUnavailable",
    "StartRefused",
    "TooManySandboxes",
    "UnknownTemplate",
    "remove_tree",
]


class SandboxGone(Exception):
    """The sandbox was deleted (or expired) meanwhile."""


class SandboxUnavailable(SandboxGone):
    """A sandbox cannot be created as asked here (the message says what to install or fix)."""


class TooManySandboxes(Exception):
    """The service already runs its maximum number of sandboxes."""


class UnknownTemplate(LookupError):
    """The service offers no template of that name."""


class StartRefused(ValueError):
    """The command cannot be started as asked (bad cwd, environment, or program)."""


class Sandbox:
    """One sandbox: its jail, the variables every process gets, and its running processes."""

    def __init__(
        self,
        sandbox_id: str,
        *,
        jail: Jail,
        vm: SandboxVm,
        limits: Limits,
        root: str,
        template: str,
        env_vars: Mapping[str, str],
        metadata: Mapping[str, str],
        expires_at: float,
        lifetime: int = 0,
        auto_pause: bool = False,
        auto_resume: bool = False,
        private_traffic: bool = False,
    ) -> None:
        self.id = sandbox_id
        self.access_token = secrets.token_hex(16)
        self.traffic_access_token = secrets.token_hex(16) if private_traffic else None
        """What a request to one of its ports must carry (``allowPublicTraffic: false``)."""
        self.template = template
        self.metadata = dict(metadata)
        self.started_at = time.time()
        self.expires_at = expires_at
        self.lifetime = lifetime
        """The seconds it was created to live (an auto-resume gives it as many again)."""
        self.auto_pause = auto_pause
        """Whether the end of its lifetime pauses it (``autoPause``) rather than killing it."""
        self.auto_resume = auto_resume
        """Whether envd traffic resumes it while it is paused (``autoResume``)."""
        self._jail = jail
        self._default = Identity(jail.user, uid_for(jail.user), jail.workdir)
        self._vm = vm
        self._limits = limits
        self._root = root
        self._env_vars = dict(env_vars)
        self._lock = threading.Lock()
        self._processes: dict[int, LocalProcess] = {}
        self._configs: dict[int, ProcessConfig] = {}
        self._deleted: str | None = None
        self._ended: list[Callable[[], None]] = []
        self.pause_state = PauseState(vm.cgroups, lambda: vm.init_pid)
        """Whether the sandbox is paused (its processes frozen), and pausing it."""

    def python_command(self, *args: str) -> list[str]:
        """The argv running the host's Python (standard library only) inside the sandbox."""
        return self._jail.python_command(find_python(), *args)

    @property
    def home(self) -> str:
        """The host directory mounted as the sandbox's home."""
        return self._jail.home

    @property
    def root_user(self) -> Identity | None:
        """The sandbox's root beside its user (uid 0, home ``/root``), where it has one."""
        return None if self._jail.root_home is None else Identity("root", 0, ROOT_HOME)

    @property
    def network(self) -> bool:
        """Whether this sandbox has network egress (through its user-mode stack)."""
        return self._jail.network

    @property
    def cgroups(self) -> CgroupSet:
        """The cgroups holding its processes (and its limits, where they are enforced)."""
        return self._vm.cgroups

    @property
    def limits(self) -> Limits:
        """The limits this sandbox was created with."""
        return self._limits

    @property
    def env_vars(self) -> dict[str, str]:
        """The variables the sandbox was created with (``envVars``)."""
        return dict(self._env_vars)

    @property
    def host_dirs(self) -> dict[str, str]:
        """The sandbox's writable places (home, ``/tmp``, ``/dev/shm``, root's) by host path."""
        jail = self._jail
        places = {jail.workdir: jail.home, "/tmp": jail.tmp, "/dev/shm": jail.shm}
        return {**places, **jail.root_place()}

    def on_end(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once when the sandbox ends (at once if it has ended)."""
        with self._lock:
            if self._deleted is None:
                self._ended.append(callback)
                return
        callback()

    def environment(self, envs: Mapping[str, str], user: Identity | None = None) -> dict[str, str]:
        """PATH, ``user``'s HOME, USER, LOGNAME (default: the sandbox's), envVars, ``envs``."""
        who = user or self._default
        env = {"PATH": DEFAULT_PATH, "HOME": who.home, "USER": who.name, "LOGNAME": who.name}
        env.update(self._env_vars)
        env.update(envs)
        for name, value in env.items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise StartRefused(f"invalid environment variable {name[:100]!r}")
        return env

    def start(
        self,
        config: ProcessConfig,
        *,
        tag: str,
        stdin: bool = False,
        size: WindowSize | None = None,
        user: Identity | None = None,
        limited: bool = True,
    ) -> LocalProcess:
        """Spawn ``config`` as ``user`` (default: the sandbox's), on a terminal of ``size``.

        A command not ``limited`` (the service's own file helpers) runs outside the
        sandbox's memory limit where the agent is (cgroup v1), so files that fill the
        memory can still be read and removed; the disk limit still bounds what it writes.

        ``cwd`` may be anywhere in the sandbox's filesystem (relative paths and
        ``~`` are taken from the user's home). :class:`StartRefused`, :class:`SandboxGone`,
        or :class:`~piship_remote.local.sandbox.pause.Paused` (a pause waits for a start under way).
        """
        who = user or self._default
        try:
            cwd = resolve(config.cwd, who.home)
        except PathError as e:
            raise StartRefused(str(e)) from None
        env = self.environment(config.envs, who)
        if not config.cmd or "\0" in config.cmd or any("\0" in arg for arg in config.args):
            raise StartRefused("the command must be a non-empty string without NUL bytes")
        if self._jail.missing_program(config.cmd):
            raise StartRefused(f"fork/exec {config.cmd}: no such file or directory")
        spec: dict[str, object] = {"cmd": config.cmd, "args": config.args, "env": env, "cwd": cwd}
        if self._jail.root_home is not None:
            spec["uid"] = who.uid
        if not limited:
            spec["limited"] = False
        with self._lock:
            if self._deleted is not None:
                raise SandboxGone(self._deleted)
            # Started under the lock so a concurrent delete cannot miss it.
            check = limit_check(self._vm.cgroups, self._limits, [self._jail.home, self._jail.tmp])
            # Not while the sandbox is being frozen: its agent would answer only once thawed.
            try:
                with self.pause_state.running():
                    process = self._vm.start(
                        spec, tag=tag, limit_check=check, stdin=stdin, size=size
                    )
            except StartFailed as e:
                raise StartRefused(str(e)) from None
            self._processes[process.pid] = process
            self._configs[process.pid] = config
        return process

    def dial(self, port: int) -> socket.socket:
        """A socket connected to ``port`` on the sandbox's own loopback.

        :class:`~piship_remote.local.isolation.agent_link.DialFailed` when nothing listens
        there, :class:`SandboxGone` once deleted, ``OSError`` when its agent is gone.
        """
        with self._lock:
            if self._deleted is not None:
                raise SandboxGone(self._deleted)
        with self.pause_state.running():
            return self._vm.dial(port)

    def forget(self, process: LocalProcess) -> None:
        """Drop a finished process from the sandbox's list."""
        with self._lock:
            self._processes.pop(process.pid, None)
            self._configs.pop(process.pid, None)

    def find(self, *, pid: int | None = None, tag: str | None = None) -> LocalProcess | None:
        """The running process with ``pid`` or ``tag``, if any."""
        with self._lock:
            for process in self._processes.values():
                if (pid is not None and process.pid == pid) or (tag and process.tag == tag):
                    return process
        return None

    def processes(self) -> list[LocalProcess]:
        """The processes still running."""
        with self._lock:
            return list(self._processes.values())

    def listing(self) -> list[tuple[LocalProcess, ProcessConfig]]:
        """The processes still running, each with what it was started as."""
        with self._lock:
            return [(p, self._configs[pid]) for pid, p in self._processes.items()]

    def destroy(self, reason: str) -> None:
        """End every process (reporting ``reason``) and the environment; remove the files."""
        with self._lock:
            if self._deleted is None:
                self._deleted = reason
            processes = list(self._processes.values())
            ended, self._ended = self._ended, []
        for callback in ended:
            callback()
        self.pause_state.release()  # a frozen process cannot take its SIGKILL
        for process in processes:
            process.kill(reason)
        self._vm.close()
        for process in processes:
            process.wait(REAP_TIMEOUT)
        unmount(self._root)
        remove_tree(self._root)


class Registry:
    """All sandboxes of one service, and the reaper thread that ends their lifetimes."""

    def __init__(
        self,
        root: str,
        *,
        bwrap: str,
        workdir: str,
        user: str,
        max_sandboxes: int = 20,
        limits: Limits | None = None,
        enforcement: Enforcement | None = None,
        clock: Callable[[], float] = time.monotonic,
        with_root: bool | None = None,
        templates: Mapping[str, str | None] | None = None,
    ) -> None:
        self.templates = dict(templates or {DEFAULT_TEMPLATE: None})
        """Each template's root filesystem (``None``: the host's ``/usr``)."""
        mapped = root_mappable() if with_root is None else with_root
        self.users = SandboxUsers.of(user=user, workdir=workdir, root=mapped)  # who may run
        self.root = root
        self.limits = limits or Limits()
        self.enforcement = enforcement or Enforcement.probe()
        self.max_lifetime = self.limits.lifetime
        self._layout = SandboxLayout(
            bwrap=bwrap,
            user=user,
            workdir=workdir,
            with_root=self.users.root is not None,
            limits=self.limits,
            enforcement=self.enforcement,
        )
        self._max = max_sandboxes
        self.clock = clock
        self._sandboxes: dict[str, Sandbox] = {}
        self._booting = 0
        self._changed = threading.Condition()
        self._closed = False
        self._spawner = Spawner()
        self._reaper = threading.Thread(target=self._reap, name="piship-local-reaper", daemon=True)
        self._reaper.start()

    def create(
        self,
        *,
        template: str,
        lifetime: int,
        network: bool,
        env_vars: Mapping[str, str],
        metadata: Mapping[str, str] | None = None,
        auto_pause: bool = False,
        auto_resume: bool = False,
        private_traffic: bool = False,
    ) -> Sandbox:
        """A new sandbox living ``lifetime`` seconds, then paused (``auto_pause``) or deleted.

        :class:`TooManySandboxes` at the limit; :class:`SandboxUnavailable` when
        its environment cannot be made here (network asked for and no user-mode
        stack installed, or the sandbox would not start).
        """
        if template not in self.templates:
            raise UnknownTemplate(template)
        problem = egress_problem() if network else None
        if problem is not None:
            raise SandboxUnavailable(problem)
        sandbox_id = secrets.token_hex(10)
        directory = os.path.join(self.root, sandbox_id)
        with self._changed:
            if self._closed:
                raise SandboxGone("the local sandbox service stopped")
            if len(self._sandboxes) + self._booting >= self._max:
                raise TooManySandboxes(f"the local service runs at most {self._max} sandboxes")
            self._booting += 1
        try:
            jail, vm = boot(
                sandbox_id,
                directory,
                self._layout,
                network=network,
                spawner=self._spawner,
                rootfs=self.templates[template],
            )
        except BootFailed as e:
            raise SandboxUnavailable(str(e)) from None
        finally:
            with self._changed:
                self._booting -= 1
        with self._changed:
            if self._closed:
                vm.close()
                unmount(directory)
                remove_tree(directory)
                raise SandboxGone("the local sandbox service stopped")
            sandbox = Sandbox(
                sandbox_id,
                jail=jail,
                vm=vm,
                limits=self.limits,
                root=directory,
                template=template,
                env_vars=env_vars,
                metadata=metadata or {},
                expires_at=self._expiry(lifetime),
                lifetime=lifetime,
                auto_pause=auto_pause,
                auto_resume=auto_resume,
                private_traffic=private_traffic,
            )
            self._sandboxes[sandbox_id] = sandbox
            self._changed.notify_all()
        return sandbox

    def get(self, sandbox_id: str) -> Sandbox | None:
        """The running sandbox ``sandbox_id``, if any (a paused one is not served).

        A paused sandbox created with ``auto_resume`` is resumed to live its create
        lifetime again, and served.
        """
        sandbox = self.lookup(sandbox_id)
        if sandbox is not None and sandbox.pause_state.paused and sandbox.auto_resume:
            with contextlib.suppress(OSError):
                self.resume(sandbox_id, sandbox.lifetime)
        return None if sandbox is None or sandbox.pause_state.paused else sandbox

    def lookup(self, sandbox_id: str) -> Sandbox | None:
        """The sandbox ``sandbox_id``, running or paused, if any."""
        with self._changed:
            return self._sandboxes.get(sandbox_id)

    def pause(self, sandbox_id: str) -> bool | None:
        """Freeze the sandbox; ``False`` if it is paused already, ``None`` if unknown.

        A paused sandbox's lifetime stops: it is kept (up to the service's maximum
        lifetime) until it is resumed with a new one, or deleted.
        """
        sandbox = self.lookup(sandbox_id)
        if sandbox is None:
            return None
        if not sandbox.pause_state.pause():
            return False if self.lookup(sandbox_id) is sandbox else None
        self.set_lifetime(sandbox_id, self.max_lifetime)
        return True

    def resume(self, sandbox_id: str, seconds: int) -> bool | None:
        """Thaw the sandbox to live ``seconds`` more.

        ``False`` if it was running, ``None`` if unknown.
        """
        sandbox = self.lookup(sandbox_id)
        if sandbox is None:
            return None
        if not sandbox.pause_state.resume():
            return False
        self.set_lifetime(sandbox_id, seconds)
        return True

    def ids(self) -> list[str]:
        """The live sandboxes' IDs."""
        with self._changed:
            return list(self._sandboxes)

    def set_lifetime(self, sandbox_id: str, seconds: int, *, extend_only: bool = False) -> bool:
        """Let the sandbox live ``seconds`` from now (never shorter with ``extend_only``)."""
        with self._changed:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is None:
                return False
            expiry = self._expiry(seconds)
            sandbox.expires_at = max(expiry, sandbox.expires_at) if extend_only else expiry
            self._changed.notify_all()
            return True

    def delete(self, sandbox_id: str, reason: str = "deleted") -> bool:
        """Kill the sandbox's processes and remove its files; ``False`` if it is unknown."""
        with self._changed:
            sandbox = self._sandboxes.pop(sandbox_id, None)
        if sandbox is None:
            return False
        sandbox.destroy(reason)
        return True

    def close(self) -> None:
        """Delete every sandbox, stop the reaper, and remove the service directory."""
        with self._changed:
            self._closed = True
            sandboxes = list(self._sandboxes.values())
            self._sandboxes.clear()
            self._changed.notify_all()
        for sandbox in sandboxes:
            sandbox.destroy("stopped")
        if self._reaper is not threading.current_thread():
            self._reaper.join(REAP_TIMEOUT)
        self._spawner.close()
        remove_tree(self.root)

    def _expiry(self, seconds: int) -> float:
        return self.clock() + min(max(seconds, 0), self.max_lifetime)

    def _reap(self) -> None:
        while True:
            with self._changed:
                if self._closed:
                    return
                expired = self._expired()
                if not expired:
                    self._changed.wait(self._next_wait())
                    continue
            for sandbox_id in expired:
                self._expire(sandbox_id)

    def _expire(self, sandbox_id: str) -> None:
        """End an expired sandbox's lifetime: pause it if it asked for that, else delete it."""
        with self._changed:
            sandbox = self._sandboxes.get(sandbox_id)
            if sandbox is None or sandbox.expires_at > self.clock():
                return  # deleted or renewed meanwhile
        if sandbox.auto_pause and not sandbox.pause_state.paused:
            with contextlib.suppress(OSError):
                if self.pause(sandbox_id):
                    return
        self.delete(sandbox_id, "expired")

    def _expired(self) -> list[str]:
        now = self.clock()
        return [s.id for s in self._sandboxes.values() if s.expires_at <= now]

    def _next_wait(self) -> float | None:
        if not self._sandboxes:
            return None
        earliest = min(s.expires_at for s in self._sandboxes.values())
        return max(earliest - self.clock(), 0.0)
