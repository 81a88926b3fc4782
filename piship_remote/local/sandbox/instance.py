"""One local sandbox: its jail, the variables every process gets, its running processes.

A :class:`Sandbox` is made by the :class:`~piship_remote.local.sandbox.registry.Registry`
(which boots its environment); it starts commands in it, dials its ports, keeps the
list of what runs, and ends it all when destroyed::

    process = sandbox.start(ProcessConfig(cmd="/bin/bash", args=["-c", "id"]), tag="t1")
    sock = sandbox.dial(8000)
    sandbox.destroy("deleted")

A command being started holds a pause off until it has started, and one started on
a paused sandbox is refused.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping

import attrs

from piship_remote.local.isolation.bubblewrap import DEFAULT_PATH, LAYER_PATH, Jail, uid_for
from piship_remote.local.isolation.egress import EgressRules, load_rules
from piship_remote.local.isolation.limits import CgroupSet, Limits, limit_check
from piship_remote.local.isolation.mounts import unmount_under
from piship_remote.local.isolation.process import (
    REAP_TIMEOUT,
    LocalProcess,
    StartFailed,
    WindowSize,
)
from piship_remote.local.isolation.uid_block import SandboxIds
from piship_remote.local.isolation.user_map import ROOT_HOME, Identity
from piship_remote.local.sandbox.env import BootFailed, remove_tree
from piship_remote.local.sandbox.network_options import NetworkOptions
from piship_remote.local.sandbox.pause import PauseState
from piship_remote.local.sandbox.vm import SandboxVm
from piship_remote.wire.envd import ProcessConfig
from piship_remote.wire.envd_paths import PathError, resolve

__all__ = ["Sandbox", "SandboxGone", "StartRefused", "Wanted"]


@attrs.frozen
class Wanted:
    """What a sandbox was asked to be: its template (as reported) and the image it runs
    (the same template, or the one a snapshot was taken from), its network, variables,
    metadata, what ends its lifetime, and whether its ports want a traffic token."""

    template: str
    image: str
    network: bool = False
    """Whether it has a network stack (some address outside it is allowed)."""
    env_vars: Mapping[str, str] = attrs.field(factory=dict)
    metadata: Mapping[str, str] = attrs.field(factory=dict)
    auto_pause: bool = False
    """Whether the end of its lifetime pauses it (``autoPause``) rather than killing it."""
    auto_resume: bool = False
    """Whether envd traffic resumes it while it is paused (``autoResume``)."""
    auto_pause_memory: bool = True
    """Whether that pause keeps what runs (``autoPauseMemory``); if not, resuming reboots it."""
    options: NetworkOptions = attrs.field(factory=NetworkOptions)
    """Its network as asked: egress rules, traffic token, the ``Host`` its ports see."""

    @property
    def private_traffic(self) -> bool:
        """Whether a request to one of its ports must carry its traffic token."""
        return self.options.private_traffic


class SandboxGone(Exception):
    """The sandbox was deleted (or expired) meanwhile."""


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
        wanted: Wanted,
        expires_at: float,
        ends_at: float | None = None,
        lifetime: int = 0,
    ) -> None:
        self.id = sandbox_id
        self.access_token = secrets.token_hex(16)
        self.traffic_access_token = secrets.token_hex(16) if wanted.private_traffic else None
        """What a request to one of its ports must carry (``allowPublicTraffic: false``)."""
        self.wanted = wanted
        self.started_at = time.time()
        self.expires_at = expires_at
        """When its lifetime ends, on the registry's clock."""
        self.ends_at = time.time() if ends_at is None else ends_at
        """The same moment as wall-clock time (what ``endAt`` reports), fixed when it is set."""
        self.lifetime = lifetime
        """The seconds it was created to live (an auto-resume gives it as many again)."""
        self._jail = jail
        self._default = Identity(jail.user, uid_for(jail.user), jail.workdir)
        self._vm = vm
        self._limits = limits
        self._root = root
        self._env_vars = dict(wanted.env_vars)
        self._lock = threading.Lock()
        self._processes: dict[int, LocalProcess] = {}
        self._configs: dict[int, ProcessConfig] = {}
        self._deleted: str | None = None
        self._ended: list[Callable[[], None]] = []
        self.pause_state = PauseState(vm.cgroups, lambda: vm.init_pid)
        """Whether the sandbox is paused (its processes frozen), and pausing it."""
        self.reboots_on_resume = False
        """Whether its pause kept only its files (``memory: false``): resuming reboots it."""
        self.options = wanted.options
        """Its network now: as created, then as the last ``update_network`` set it."""

    @property
    def template(self) -> str:
        """The template it was made from, as reported (a snapshot's ID for a copy of one)."""
        return self.wanted.template

    @property
    def metadata(self) -> dict[str, str]:
        """The metadata it was created with."""
        return dict(self.wanted.metadata)

    @property
    def auto_pause(self) -> bool:
        """Whether the end of its lifetime pauses it (``autoPause``) rather than killing it."""
        return self.wanted.auto_pause

    @property
    def auto_resume(self) -> bool:
        """Whether envd traffic resumes it while it is paused (``autoResume``)."""
        return self.wanted.auto_resume

    @property
    def home(self) -> str:
        """The host directory mounted as the sandbox's home."""
        return self._jail.home

    @property
    def root_user(self) -> Identity | None:
        """The sandbox's root beside its user (uid 0, home ``/root``), where it has one."""
        return None if self._jail.root_home is None else Identity("root", 0, ROOT_HOME)

    @property
    def layer(self) -> str | None:
        """Where its agent reads what it changed of its image's root filesystem (the overlay's
        upper layer, read-only), where it has one; else those changes are its ``/`` itself."""
        return None if self._jail.layer is None else LAYER_PATH

    @property
    def ids(self) -> SandboxIds | None:
        """Its own range of host uids, where the service maps them (a root service)."""
        return self._jail.ids

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

    def hold_egress(self, rules: EgressRules | None = None) -> None:
        """Load ``rules`` (default: its current ones) into its network namespace and make
        them its current ones. ``OSError`` when they cannot be held: the sandbox keeps
        its earlier rules (after a create or reboot the caller must end it)."""
        rules = self.options.egress if rules is None else rules
        if self.network:
            load_rules(self._vm.init_pid, rules)
        with self._lock:
            self.options = self.options.with_egress(rules)

    def held_egress(self) -> Callable[[SandboxVm], SandboxVm]:
        """What makes a fresh environment hold its current egress rules (for a reboot):
        :class:`BootFailed` (the environment closed) when they cannot be loaded."""
        rules, network = self.options.egress, self.network

        def holding(vm: SandboxVm) -> SandboxVm:
            if network and rules.filtered:
                try:
                    load_rules(vm.init_pid, rules)
                except OSError as e:
                    vm.close()
                    raise BootFailed(f"the sandbox's egress rules could not be held: {e}") from None
            return vm

        return holding

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
        if self._jail.python_env is not None:
            env.update(self._jail.python_env.variables(DEFAULT_PATH))
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
    ) -> LocalProcess:
        """Spawn ``config`` as ``user`` (default: the sandbox's), on a terminal of ``size``.

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

    def files(
        self,
        call: str,
        args: Mapping[str, object],
        *,
        user: Identity | None = None,
        data: int | None = None,
    ) -> int:
        """Ask the sandbox's agent for a files request as ``user`` (default: the sandbox's);
        ``data`` (a pipe end) is closed here. Returns the read end of the answer's pipe (see
        :mod:`piship_remote.local.sandbox.fs`); :class:`SandboxGone`, or ``Paused``."""
        who = user or self._default
        uid = who.uid if self._jail.root_home is not None else None
        handed = False
        try:
            with self._lock:
                if self._deleted is not None:
                    raise SandboxGone(self._deleted)
                vm = self._vm
            with self.pause_state.running():
                handed = True  # closed by the request from here on
                return vm.files(call, args, uid=uid, data=data)
        finally:
            if data is not None and not handed:
                os.close(data)

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

    def reboot(self, start: Callable[[Jail], SandboxVm]) -> None:
        """End every process and the environment, keeping the files, then run the new
        environment ``start`` makes in the same jail. What ``start`` raises is raised
        (the sandbox is then left without one: delete it); :class:`SandboxGone` once deleted.
        """
        with self._lock:
            if self._deleted is not None:
                raise SandboxGone(self._deleted)
            processes = list(self._processes.values())
            self._processes.clear()
            self._configs.clear()
        self.pause_state.release()  # a frozen process cannot take its SIGKILL
        for process in processes:
            process.kill("the sandbox was rebooted")
        self._vm.close()
        for process in processes:
            process.wait(REAP_TIMEOUT)
        vm = start(self._jail)
        with self._lock:
            self._vm = vm
            self.pause_state = PauseState(vm.cgroups, lambda: vm.init_pid)
            self.reboots_on_resume = False

    @property
    def jail(self) -> Jail:
        """The sandbox's confinement (its host directories and uids)."""
        return self._jail

    def destroy(self, reason: str) -> None:
        """End every process (reporting ``reason``) and the environment; remove the files."""
        with self._lock:
            if self._deleted is None:
                self._deleted = reason
            processes = list(self._processes.values())
            ended, self._ended = self._ended, []
        for callback in ended:
            callback()
        try:
            self.pause_state.release()  # a frozen process cannot take its SIGKILL
            for process in processes:
                process.kill(reason)
            self._vm.close()
            for process in processes:
                process.wait(REAP_TIMEOUT)
        finally:  # whatever failed above, nothing of it stays mounted or on disk
            if self._jail.layer_space is not None:
                self._jail.layer_space.close()
            unmount_under(self._root)  # its tmpfs, and its root layer's mounts on it
            remove_tree(self._root)
