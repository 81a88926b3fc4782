"""The local service's sandboxes: their files, processes and lifetimes.

A :class:`Registry` creates sandboxes (a private home and ``/tmp`` each, under one
service directory), finds them, renews and deletes them. A ``piship-local-reaper``
thread deletes each sandbox when its lifetime ends. Deleting kills every process
of the sandbox and removes its files::

    registry = Registry(root, bwrap=find_bwrap(), workdir="/home/user", user="user")
    sandbox = registry.create(template="base", lifetime=300, network=False, env_vars={})
    process = sandbox.start(ProcessConfig(cmd="/bin/bash", args=["-c", "id"]), tag="t1")
    registry.delete(sandbox.id)
    registry.close()
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping

from piship_remote.local.isolation import DEFAULT_PATH, Jail, write_etc
from piship_remote.local.process import REAP_TIMEOUT, LocalProcess
from piship_remote.local.wire import ProcessConfig

__all__ = ["Registry", "Sandbox", "SandboxGone", "StartRefused", "TooManySandboxes"]


class SandboxGone(Exception):
    """The sandbox was deleted (or expired) meanwhile."""


class TooManySandboxes(Exception):
    """The service already runs its maximum number of sandboxes."""


class StartRefused(ValueError):
    """The command cannot be started as asked (bad cwd, environment, or program)."""


class Sandbox:
    """One sandbox: its jail, the variables every process gets, and its running processes."""

    def __init__(
        self,
        sandbox_id: str,
        *,
        jail: Jail,
        root: str,
        template: str,
        env_vars: Mapping[str, str],
        metadata: Mapping[str, str],
        expires_at: float,
    ) -> None:
        self.id = sandbox_id
        self.access_token = secrets.token_hex(16)
        self.template = template
        self.metadata = dict(metadata)
        self.started_at = time.time()
        self.expires_at = expires_at
        self._jail = jail
        self._root = root
        self._env_vars = dict(env_vars)
        self._lock = threading.Lock()
        self._processes: dict[int, LocalProcess] = {}
        self._configs: dict[int, ProcessConfig] = {}
        self._deleted: str | None = None

    @property
    def home(self) -> str:
        """The host directory mounted as the sandbox's home."""
        return self._jail.home

    @property
    def network(self) -> bool:
        """Whether this sandbox's commands share the host's network."""
        return self._jail.network

    def environment(self, envs: Mapping[str, str]) -> dict[str, str]:
        """A process's environment: PATH, HOME, USER, LOGNAME, then envVars, then ``envs``."""
        user = self._jail.user
        env = {"PATH": DEFAULT_PATH, "HOME": self._jail.workdir, "USER": user, "LOGNAME": user}
        env.update(self._env_vars)
        env.update(envs)
        for name, value in env.items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise StartRefused(f"invalid environment variable {name[:100]!r}")
        return env

    def start(self, config: ProcessConfig, *, tag: str, stdin: bool = False) -> LocalProcess:
        """Spawn ``config`` in this sandbox; :class:`StartRefused` or :class:`SandboxGone`."""
        try:
            cwd = self._jail.directory(config.cwd)
        except ValueError as e:
            raise StartRefused(str(e)) from None
        env = self.environment(config.envs)
        if not config.cmd or "\0" in config.cmd or any("\0" in arg for arg in config.args):
            raise StartRefused("the command must be a non-empty string without NUL bytes")
        if self._jail.missing_program(config.cmd):
            raise StartRefused(f"fork/exec {config.cmd}: no such file or directory")
        options = self._jail.options(cwd=cwd, env=env)
        with self._lock:
            if self._deleted is not None:
                raise SandboxGone(self._deleted)
            # Spawned under the lock so a concurrent delete cannot miss it.
            process = LocalProcess.spawn(
                self._jail.bwrap, options, [config.cmd, *config.args], tag=tag, stdin=stdin
            )
            self._processes[process.pid] = process
            self._configs[process.pid] = config
        return process

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
        """Kill every process (reporting ``reason``), wait for them, and remove the files."""
        with self._lock:
            if self._deleted is None:
                self._deleted = reason
            processes = list(self._processes.values())
        for process in processes:
            process.kill(reason)
        for process in processes:
            process.wait(REAP_TIMEOUT)
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
        max_lifetime: int = 24 * 3600,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.max_lifetime = max_lifetime
        self._bwrap = bwrap
        self._workdir = workdir
        self._user = user
        self._max = max_sandboxes
        self.clock = clock
        self._sandboxes: dict[str, Sandbox] = {}
        self._changed = threading.Condition()
        self._closed = False
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
    ) -> Sandbox:
        """A new sandbox living ``lifetime`` seconds; :class:`TooManySandboxes` at the limit."""
        sandbox_id = secrets.token_hex(10)
        directory = os.path.join(self.root, sandbox_id)
        with self._changed:
            if self._closed:
                raise SandboxGone("the local sandbox service stopped")
            if len(self._sandboxes) >= self._max:
                raise TooManySandboxes(f"the local service runs at most {self._max} sandboxes")
            jail = self._jail(directory, network)
            sandbox = Sandbox(
                sandbox_id,
                jail=jail,
                root=directory,
                template=template,
                env_vars=env_vars,
                metadata=metadata or {},
                expires_at=self._expiry(lifetime),
            )
            self._sandboxes[sandbox_id] = sandbox
            self._changed.notify_all()
        return sandbox

    def get(self, sandbox_id: str) -> Sandbox | None:
        """The live sandbox ``sandbox_id``, if any."""
        with self._changed:
            return self._sandboxes.get(sandbox_id)

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
        remove_tree(self.root)

    def _jail(self, directory: str, network: bool) -> Jail:
        paths = [os.path.join(directory, name) for name in ("home", "tmp", "etc")]
        os.mkdir(directory, 0o700)
        for path in paths:
            # Inside, the sandbox's user is mapped onto the service's own uid: 0700 suffices.
            os.mkdir(path, 0o700)
        write_etc(paths[2], user=self._user, workdir=self._workdir)
        return Jail(
            bwrap=self._bwrap,
            home=paths[0],
            tmp=paths[1],
            etc=paths[2],
            workdir=self._workdir,
            user=self._user,
            network=network,
        )

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
                self.delete(sandbox_id, "expired")

    def _expired(self) -> list[str]:
        now = self.clock()
        return [s.id for s in self._sandboxes.values() if s.expires_at <= now]

    def _next_wait(self) -> float | None:
        if not self._sandboxes:
            return None
        earliest = min(s.expires_at for s in self._sandboxes.values())
        return max(earliest - self.clock(), 0.0)


def remove_tree(path: str) -> None:
    """Remove ``path`` even where a sandbox left read-only directories; ignore what is gone."""

    def unlock(function: Callable[..., object], failed: str, _: object) -> None:
        parent = os.path.dirname(failed)
        try:
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, os.stat(failed).st_mode | stat.S_IRWXU)
            function(failed)
        except OSError:
            pass

    if not os.path.lexists(path):
        return
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=unlock)
    else:
        shutil.rmtree(path, onerror=unlock)
